"""How the planner picks and how sure it is: the draws behind every interval (:class:`Spread`),
the rule that moves a choice away from the simple choice only beyond the plan's own error
(:func:`choose`, :func:`prefer`, :data:`MARGIN`), the note on a wide spread, and the routed workload's
prediction (:func:`route_units`). :mod:`draftwise.planner.plan` uses them; docs/planner.md says why.
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from draftwise.cost.formulas import mean_rate_speedup
from draftwise.cost.intervals import (
    Counts,
    cost_ratio_draws,
    counts_from_steps,
    dispersion,
    percentile_interval,
    rerun_draws,
    rerun_t_draws,
    speedup_draws,
    timing_draws,
    uniforms,
)
from draftwise.cost.profile import Profile
from draftwise.drafters import capabilities_of
from draftwise.drafters.spec import KValue
from draftwise.planner.moderation import log_spreads
from draftwise.planner.plan_file import AUTO, NONE, Candidate
from draftwise.questions import Question

#: a (draft, k) -> its items, one per unit (a question and one continuation of it)
Per = dict[tuple[str, KValue], list[dict[str, Any]]]


def aggregate(per_prompt: Sequence[dict[str, Any]]) -> float:
    """Spec-Bench speedup of predicted times: mean tokens/s of the method over plain's."""
    return mean_rate_speedup(
        [p["new_tokens"] / p["method_s"] for p in per_prompt],
        [p["new_tokens"] / p["plain_s"] for p in per_prompt],
    )


#: how much better (relatively, in the pick's own terms) a candidate must predict than the
#: default it would replace. Held-out greedy predictions miss by about this much (the median of
#: issue 28's check): two settings predicted closer than that cannot be told apart,
#: and the best of many close ones is the luckiest. See docs/planner.md, step 5.
MARGIN = 0.05


def score_by(pick: str) -> Callable[[Candidate], float]:
    """What ``pick`` ranks by: the interval's low end, or the prediction."""
    if pick == "low":
        return lambda c: (c.interval or [c.speedup])[0]
    return lambda c: c.speedup


def same_as(cands: Sequence[Candidate], like: Candidate) -> Candidate | None:
    return next((c for c in cands if (c.draft, c.k) == (like.draft, like.k)), None)


def prefer(cands: Sequence[Candidate], default: Candidate | None, score: Callable[[Candidate], float]) -> Candidate:
    """The top-ranked of ``cands``, unless it beats ``default`` by :data:`MARGIN` or less: then
    ``default`` (no default: the top). A plan chooses among many candidates on a few prompts,
    so the one that predicts best is partly the luckiest; only an advantage beyond the plan's
    own error moves a choice away from its default (:func:`choose`)."""
    top = cands[0]
    if default is None or score(top) > (1 + MARGIN) * score(default):
        return top
    return default


def simple_choice(cands: Sequence[Candidate], score: Callable[[Candidate], float]) -> Candidate | None:
    """What a user gets without a plan: the best adaptive-k candidate (``k=auto``) of a draft
    whose only cost is a search on the host (lookup, suffix: ``cost="host"``); without one, the
    best adaptive-k candidate; None where the plan weighed no adaptive k."""
    autos = [c for c in cands if c.k == AUTO]
    host = [c for c in autos if c.draft != NONE and capabilities_of(c.draft).cost == "host"]
    pool = host or autos
    return max(pool, key=score) if pool else None


def choose(ranked: dict[str, list[Candidate]], score: Callable[[Candidate], float]) -> dict[str, Candidate]:
    """Each category's pick (and ``"overall"``'s) from its candidates ranked best first. The
    default everywhere is the workload's simple choice (:func:`simple_choice` over all prompts),
    and another candidate (a fixed k, a draft that runs a head or a model each step) replaces
    it only where it ranks more than :data:`MARGIN` higher. Without an adaptive k, a category's
    default is the overall pick. A costlier draft predicted a few percent ahead is within the
    plan's error and its price (a head's pass, timed apart from the loop) is the least sure
    part of it: on unseen questions the hybrid, picked everywhere by a default that followed the
    overall pick, lost 5-7% to suffix where answers copy the prompt (docs/planner.md, step 5).

    >>> c = lambda d, k, s: Candidate(d, k, s, 2.0, None, None, None)
    >>> picks = choose({"overall": [c("suffix+eagle:default", "auto", 1.70), c("suffix", "auto", 1.68)],
    ...                 "writing": [c("suffix+eagle:default", "auto", 1.49), c("suffix", "auto", 1.37)],
    ...                 "rag": [c("suffix", "auto", 1.94), c("suffix+eagle:default", "auto", 1.88)]},
    ...                lambda x: x.speedup)
    >>> {cat: (p.draft, p.k) for cat, p in picks.items()}
    {'overall': ('suffix', 'auto'), 'writing': ('suffix+eagle:default', 'auto'), 'rag': ('suffix', 'auto')}
    """
    simple = simple_choice(ranked["overall"], score)
    overall = prefer(ranked["overall"], simple, score)
    anchor = simple or overall
    return {cat: overall if cat == "overall" else prefer(cands, same_as(cands, anchor), score)
            for cat, cands in ranked.items()}


def spread_note(c: Candidate, *, sampled: bool, wide: float = 1.5) -> str | None:
    """A sentence when ``c``'s units (prompts, and with sampling their continuations) differ
    widely: the slowest and the fastest unit's predicted speedup, when the fastest is ``wide``
    times the slowest or more.

    >>> spread_note(Candidate("lookup", 5, 1.6, 2.0, None, None, None, samples=[1.1, 1.3, 4.7]), sampled=True)
    'lookup k=5 pays 1.1-4.7x here, depending on the prompt and on how the sampled answer goes'
    """
    if not c.samples or min(c.samples) <= 0 or max(c.samples) < wide * min(c.samples):
        return None
    why = "the prompt and on how the sampled answer goes" if sampled else "the prompt"
    return f"{c.draft} k={c.k} pays {min(c.samples):.1f}-{max(c.samples):.1f}x here, depending on {why}"


def routed_items(
    recommended: dict[str, tuple[str, KValue]], per: Per, any_setting: tuple[str, KValue],
) -> tuple[list[dict[str, Any]], list[tuple[str, KValue] | None]]:
    """Each unit's item under its category's recommendation, and the setting it ran (None: plain
    decoding, whose item is ``any_setting``'s with the method's time set to plain's: every item
    holds plain's time)."""
    routed: list[dict[str, Any]] = []
    settings: list[tuple[str, KValue] | None] = []
    for item in per[any_setting]:
        d, k = recommended[item["category"]]
        if d == NONE:
            plain = dict(item)
            plain["method_s"] = plain["fixed_s"] = plain["plain_s"]
            routed.append(plain)
            settings.append(None)
        else:
            routed.append(next(x for x in per[(d, k)] if (x["question_id"], x["sample"]) == (item["question_id"], item["sample"])))
            settings.append((d, k))
    return routed, settings


def route_units(
    rows: list[Question], recommended: dict[str, tuple[str, KValue]], per: Per, spread: Spread,
    any_setting: tuple[str, KValue],
) -> tuple[float, list[float]]:
    """The predicted speedup, and its interval, of decoding each prompt with its category's
    recommendation (:func:`routed_items`); a prompt routed to plain decoding has no uncertainty
    of its own."""
    routed, settings = routed_items(recommended, per, any_setting)
    routed_overall = aggregate(routed)
    return routed_overall, list(percentile_interval(spread.draws(routed, settings, "routed"), routed_overall))


class Spread:
    """The draws behind every interval. With several continuations per prompt, one category's
    from Student's t on the spread between continuations, the category's own moderated towards
    the other categories' for each (draft, k) (:func:`~draftwise.planner.moderation.log_spreads`,
    :func:`~draftwise.cost.intervals.rerun_t_draws`), and several categories' from a
    bootstrap over prompts and continuations (:func:`~draftwise.cost.intervals.rerun_draws`,
    enough units there for one); otherwise the
    binomial draws of each (category, draft, k)'s counts
    (:func:`~draftwise.cost.intervals.cost_ratio_draws`): every k of a draft uses the same
    uniform numbers (one seed per category and draft), so its draws at different k move
    together; ``auto`` takes the draws of the fixed k nearest its mean proposal. Every draw is
    then multiplied by the timing noise of a measurement over as many units (``timing``: the
    variance of :func:`~draftwise.cost.intervals.timing_spread`, 0 for none)."""

    def __init__(self, profile: Profile, per: Per, cats: list[str], ks: list[int], sampled: bool, *,
                 bootstrap: bool, timing: float = 0.0) -> None:
        self.bootstrap = bootstrap
        self.timing = timing
        self.ratio: dict[tuple[str, str, KValue], Any] = {}
        self.log_spread = {key: log_spreads(items) for key, items in per.items()} if bootstrap else {}
        if bootstrap:
            return
        for (d, k), items in per.items():
            if k == AUTO:
                continue
            phi = dispersion([x["trace"] for x in items])  # steps come in runs: fewer effective trials
            for c in cats:
                mine = [x for x in items if x["category"] == c]
                pooled = sum((counts_from_steps(x["trace"], k) for x in mine), Counts())
                context = statistics.mean(x["context"] for x in mine)
                u = uniforms(zlib.crc32(f"{c}\0{d}".encode()), ks[-1])
                self.ratio[(c, d, k)] = cost_ratio_draws(profile, d, k, pooled, context, u, phi=phi, sampled=sampled)
        for (d, k), items in per.items():
            if k != AUTO:
                continue
            for c in cats:
                mine = [x for x in items if x["category"] == c]
                proposing = sum(x["proposing"] for x in mine)
                mean_m = sum(x["proposed"] for x in mine) / proposing if proposing else 1.0
                near = min(ks, key=lambda kk: abs(kk - mean_m))
                self.ratio[(c, d, AUTO)] = self.ratio[(c, d, near)]

    def draws(self, items: Sequence[dict[str, Any]], settings: Sequence[tuple[str, KValue] | None], key: str) -> Any:
        """Speedup draws of ``items`` (one per unit), each run with its ``settings`` entry (None:
        plain decoding, no uncertainty in the binomial draws); ``key`` seeds the bootstrap and the
        timing noise, so every candidate of one category resamples the same units and draws the
        same noise (paired comparisons)."""
        draws = self._acceptance_draws(items, settings, key)
        timing = timing_draws(self.timing, len(items), seed=zlib.crc32(f"{key}\0timing".encode()), draws=len(draws))
        return draws * timing

    def _acceptance_draws(self, items: Sequence[dict[str, Any]], settings: Sequence[tuple[str, KValue] | None],
                          key: str) -> Any:
        if self.bootstrap:
            seed = zlib.crc32(key.encode())
            if len({x["category"] for x in items}) == 1 and len(set(settings)) == 1 and settings[0] is not None:
                return rerun_t_draws(items, self.log_spread[settings[0]][items[0]["category"]], seed=seed)
            return rerun_draws(items, seed=seed)
        n = len(next(iter(self.ratio.values()))) if self.ratio else 400
        ratios = [np.ones(n) if s is None else self.ratio[(x["category"], *s)] for x, s in zip(items, settings)]
        return speedup_draws(items, ratios)
