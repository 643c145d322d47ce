"""The planner: run each draft on a sample of the workload, predict every (draft, k), recommend.

How a prediction is made (greedy decoding, which is deterministic):

The workload is a list of :class:`~draftwise.questions.Question` (``read_questions`` +
``select_questions``); any category is planned for. Drafts are keyed by their canonical spec.

1. The target decodes each sampled prompt once per draft, speculatively at ``k_max``. The
   committed tokens are the plain greedy output whatever the draft, so one run gives the
   exact token sequence plain decoding would produce.
2. *Which* tokens a draft gets right does not depend on k:

   - prompt lookup is a pure function of the context, so its steps at any k are replayed
     exactly, offline, on the committed tokens (no model pass at all);
   - a model or self draft proposes its own greedy chain; in the ``k_max`` run every output
     position was either accepted, rejected, or a bonus token. That per-position record
     ("did the draft, given the true prefix, predict this token?") is replayed for any
     k <= k_max, bonus positions counting as hits (:mod:`draftwise.cost.replay`).

3. Each replayed step costs ``D(m) + step(m + 1, context)`` from the machine profile (m tokens
   proposed), each committed token ``token_overhead``, and the prefill what it took. Plain
   decoding is the same sum with m = 0. Predicted speedup = mean tokens/s of the method /
   mean tokens/s of plain decoding over the prompts (Spec-Bench's convention,
   :func:`~draftwise.cost.formulas.mean_rate_speedup`).

With sampling (temperature > 0) the output is random, so step 2 uses the measured
conditional acceptance per draft position instead: E = 1 + sum_i prod_{j<=i} a_j. So does an
EAGLE head in greedy mode: its i-th token in a step is drafted from its own guessed features,
not from the true prefix, so whether it hits depends on its depth in the step, not only on the
position in the output.

A draft with its own cache (a model draft, a head) also pays, once per generation, for catching
up on the prompt at its first proposal: the profile's ``draft_prefill`` (seconds per prompt
token) times the prompt's length.

"No speculation" is always a candidate: a category whose best draft does not beat plain
decoding is told to decode plainly.
"""

from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..decode import generate
from ..drafters import make_drafter
from ..drafters.spec import DraftSpec
from ..errors import ConfigError
from ..questions import Question, parse_question
from ..sampling import SamplingConfig
from .intervals import (
    Counts, cost_ratio_draws, counts_from_steps, dispersion, percentile_interval, speedup_draws, uniforms,
)
from .formulas import breakeven_acceptance, effective_acceptance, mean_rate_speedup
from .plan_file import NONE, PLAN_SCHEMA, Candidate, Plan, load_plan
from .profile import Profile
from .replay import Trace, expected_steps, predict_seconds, replay_hits, rates_only, replay_lookup, replayable, trace_generation

# the plan's data and file live in .plan_file; they are imported from here too
__all__ = ["NONE", "PLAN_SCHEMA", "Candidate", "Plan", "as_questions", "load_plan", "make_plan", "warm_up"]


def _aggregate(per_prompt: Sequence[dict[str, Any]]) -> float:
    """Spec-Bench speedup of predicted times: mean tokens/s of the method over plain's."""
    return mean_rate_speedup(
        [p["new_tokens"] / p["method_s"] for p in per_prompt],
        [p["new_tokens"] / p["plain_s"] for p in per_prompt],
    )


def as_questions(rows: Sequence[Question | dict[str, Any]]) -> list[Question]:
    """Questions as given, or Spec-Bench rows (``{"question_id", "category", "turns"}``) validated."""
    return [q if isinstance(q, Question) else parse_question(q, f"prompt {i}") for i, q in enumerate(rows, 1)]


def warm_up(model: Any) -> None:
    """Decode two tokens and throw them away, so that the traces time a warm model.

    The first pass of a process pays once for what later passes reuse: the allocator growing
    its pools, oneDNN/MKL building their kernels for each shape, lazy imports and, under
    ``torch.compile``, the graph. The plan prices each prompt's prefill by its measured time
    (``Trace.prefill_seconds``), so without this the first traced prompt would carry those
    one-off costs into its prediction, which a long-running server or bench never pays."""
    generate(model, [1, 2, 3], max_new_tokens=2)


def _check_inputs(
    profile: Profile, questions: Sequence[Question | dict[str, Any]], drafts: Sequence[DraftSpec | str],
    ks: Sequence[int] | None, k_run: int,
) -> tuple[list[Question], dict[str, DraftSpec], list[int]]:
    """The prompts, the drafts by canonical key (no "none") and the sorted ks, each checked."""
    rows = as_questions(questions)
    if not rows:
        raise ConfigError("no prompts to plan on")
    if any(q.category == "overall" for q in rows):
        raise ConfigError("category 'overall' is reserved for the plan's whole-workload pick; rename it")
    specs = {str(s): s for s in map(DraftSpec.parse, drafts) if not s.is_none}
    if not specs:
        raise ConfigError("give at least one draft to plan for (e.g. --drafts lookup,self)")
    k_top = profile.max_n - 1
    ks = sorted(set(ks or range(1, min(k_run, k_top) + 1)))
    if ks[0] < 1:
        raise ConfigError(f"k must be >= 1, got {ks[0]}")
    if ks[-1] > k_top:
        raise ConfigError(f"the profile covers k <= {k_top}; k={ks[-1]} needs `draftwise profile --max-n {ks[-1] + 1}`")
    return rows, specs, ks


def make_plan(
    model: Any,
    questions: Sequence[Question | dict[str, Any]],
    profile: Profile,
    *,
    drafts: Sequence[DraftSpec | str] = ("lookup", "self"),
    ks: Sequence[int] | None = None,
    k_run: int = 8,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    sure: bool = False,
    pick: str | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Plan:
    """Trace ``questions`` (already sampled: :func:`~draftwise.questions.select_questions`) with
    each draft, predict every (draft, k), recommend. Spec-Bench rows (dicts) are accepted too.

    Each prediction carries a 95% prediction interval from its binomial counts
    (:mod:`~draftwise.cost.intervals`). ``pick`` ranks the candidates of a category: ``"low"``
    by the low end of the interval (the default with sampling, where a prediction averages one
    random continuation), ``"point"`` by the prediction (the default in greedy mode, where the
    replay is exact on the traced prompts). The pick is used when its prediction beats plain
    decoding (``sure``: when even its interval's low end does)."""
    profile.check_model(model)
    cfg = sampling or SamplingConfig()
    pick = pick or ("point" if cfg.greedy else "low")
    if pick not in ("low", "point"):
        raise ConfigError(f"pick={pick!r} must be 'low' (the interval's low end) or 'point'")
    rows, specs, ks = _check_inputs(profile, questions, drafts, ks, k_run)
    # each drafter is private: a suffix draft's cache learns only from this plan's own prompts
    drafters = {d: make_drafter(spec, model) for d, spec in specs.items()}
    for d in specs:
        profile.draft_time(d, 1)  # raises if the profile lacks this draft
    traced = [d for d in specs if not replayable(specs[d])] or list(specs)[:1]
    if not cfg.greedy:
        traced = list(specs)  # sampled output is random: every draft needs its own run
    k_run = max(k_run, ks[-1]) if cfg.greedy else k_run

    warm_up(model)
    per: dict[tuple[str, int], list[dict[str, Any]]] = {}  # (draft, k) -> one item per prompt
    replays: dict[tuple[str, int], Any] = {}
    prompt_info = []
    total = len(rows) * len(traced)
    for qi, row in enumerate(rows):
        prompt_ids = model.encode_prompt(row.prompt)
        traces: dict[str, Trace] = {}
        for j, d in enumerate(traced):
            if progress:
                progress(f"{d} on q{row.question_id} ({row.category})", (qi * len(traced) + j) / total)
            traces[d] = trace_generation(
                model, prompt_ids, drafters[d], k_run, max_new_tokens, sampling=cfg,
                question_id=row.question_id, category=row.category,
            )
        ref = traces[traced[0]]
        prompt_info.append({"question_id": row.question_id, "category": row.category,
                            "prompt_tokens": len(prompt_ids), "new_tokens": ref.new_tokens,
                            "equal": not cfg.greedy or all(t.tokens == ref.tokens for t in traces.values())})
        for d in specs:
            for k in ks:
                steps = _replay(model, specs[d], k, prompt_ids, traces.get(d), ref, replays, max_new_tokens, cfg)
                item = _prompt_item(profile, specs[d], k, steps, traces.get(d, ref), len(prompt_ids), cfg, row.category)
                per.setdefault((d, k), []).append(item)
    if progress:
        progress("predicting", 1.0)
    config = {"max_new_tokens": max_new_tokens, "k_run": k_run, "temperature": cfg.temperature, "pick": pick,
              "profile_created": profile.created, "date": time.strftime("%Y-%m-%d %H:%M")}
    return _recommend(model, profile, rows, list(specs), ks, per, cfg, pick=pick, sure=sure, prompts=prompt_info,
                      config=config)


def _replay(
    model: Any, spec: DraftSpec, k: int, prompt_ids: Sequence[int], trace: Trace | None, ref: Trace,
    replays: dict[tuple[str, int], Any], max_new_tokens: int, cfg: SamplingConfig,
) -> list[tuple[int, int]]:
    """The (proposed, accepted) steps of ``spec`` at ``k`` on one prompt: replayed exactly
    (greedy), or expected from the trace's rates (sampling, or a draft whose hits depend on its
    depth in the step). ``replays`` keeps one drafter per (draft, k) across prompts, so a suffix
    draft's cache of earlier outputs grows as it would in a real run."""
    if cfg.greedy and replayable(spec):
        if (str(spec), k) not in replays:
            replays[(str(spec), k)] = make_drafter(spec, model)
        return replay_lookup(replays[(str(spec), k)], prompt_ids, ref.tokens, k, max_new_tokens,
                             eos_token_ids=model.eos_token_ids)
    assert trace is not None  # every draft that cannot be replayed was traced
    if cfg.greedy and not rates_only(spec):
        return replay_hits(trace.hits(), k, max_new_tokens)
    return expected_steps(trace, k)


def _prompt_item(
    profile: Profile, spec: DraftSpec, k: int, steps: list[tuple[int, int]], tr: Trace, prompt_len: int,
    cfg: SamplingConfig, category: str,
) -> dict[str, Any]:
    """One prompt's prediction for (``spec``, ``k``): predicted seconds, plain's, and the counts."""
    d, sampled, committed = str(spec), not cfg.greedy, len(tr.tokens)
    exact = cfg.greedy and not rates_only(spec)  # else: steps from the trace's rates
    return {
        "category": category, "new_tokens": max(tr.new_tokens, 1),
        "plain_s": _plain_seconds(profile, tr, sampled),
        "method_s": predict_seconds(profile, d, steps, prompt_len, tr.prefill_seconds, committed, sampled=sampled),
        "fixed_s": predict_seconds(profile, d, [], prompt_len, tr.prefill_seconds, committed),
        # the steps behind the interval: the replay's, or the sampled trace's cut to k
        "trace": [(min(m, k), min(a, k)) for m, a in (steps if exact else tr.steps)],
        "steps": len(steps) + 1, "committed": committed,
        "proposed": sum(m for m, _ in steps), "accepted": sum(a for _, a in steps),
        "proposing": sum(1 for m, _ in steps if m), "context": prompt_len + len(tr.tokens) / 2,
    }


def _recommend(
    model: Any, profile: Profile, rows: list[Question], drafts: list[str], ks: list[int],
    per: dict[tuple[str, int], list[dict[str, Any]]], cfg: SamplingConfig, *, pick: str, sure: bool,
    prompts: list[dict[str, Any]], config: dict[str, Any],
) -> Plan:
    """Rank every (draft, k) in each category, recommend per category, and predict the routed
    workload (each prompt decoded with its category's recommendation)."""
    sampled = not cfg.greedy
    cats = list(dict.fromkeys(r.category for r in rows)) + ["overall"]
    draws = _interval_draws(profile, per, cats[:-1], ks, sampled)
    categories = {c: _ranked(profile, per, draws, c, pick, sampled) for c in cats}
    recommended: dict[str, tuple[str, int]] = {}
    predicted: dict[str, float] = {}
    intervals: dict[str, list[float]] = {}
    for c in cats:
        best = categories[c][0]
        lo = (best.interval or [best.speedup])[0]
        if best.speedup > 1.0 and (lo > 1.0 or not sure):
            recommended[c], predicted[c] = (best.draft, best.k), best.speedup
            intervals[c] = list(best.interval or [best.speedup, best.speedup])
        else:
            recommended[c], predicted[c], intervals[c] = (NONE, 0), 1.0, [1.0, 1.0]
    routed_overall, routed_interval = _route(rows, recommended, per, draws, (drafts[0], ks[0]))
    return Plan(
        model=model.name, fingerprint=profile.fingerprint, dtype=profile.dtype, greedy=cfg.greedy,
        drafts=drafts, ks=list(ks), categories=categories, recommended=recommended, predicted=predicted,
        routed_overall=routed_overall, intervals=intervals, routed_interval=routed_interval,
        prompts=prompts, config=config,
    )


def _route(
    rows: list[Question], recommended: dict[str, tuple[str, int]], per: dict[tuple[str, int], list[dict[str, Any]]],
    draws: dict[tuple[str, str, int], Any], any_setting: tuple[str, int],
) -> tuple[float, list[float]]:
    """The predicted speedup, and its interval, of decoding each prompt with its category's
    recommendation; a prompt routed to plain decoding takes its plain time from ``any_setting``'s
    item (every item holds it) and has no uncertainty."""
    routed, routed_draws = [], []
    for qi, row in enumerate(rows):
        d, k = recommended[row.category]
        if d == NONE:
            item = dict(per[any_setting][qi])
            item["method_s"] = item["plain_s"]
            routed_draws.append(np.ones(len(next(iter(draws.values())))))  # plain: no uncertainty
        else:
            item = per[(d, k)][qi]
            routed_draws.append(draws[(row.category, d, k)])
        routed.append(item)
    routed_overall = _aggregate(routed)
    return routed_overall, list(percentile_interval(speedup_draws(routed, routed_draws), routed_overall))


def _interval_draws(
    profile: Profile, per: dict[tuple[str, int], list[dict[str, Any]]], cats: list[str], ks: list[int], sampled: bool,
) -> dict[tuple[str, str, int], Any]:
    """(category, draft, k) -> cost-ratio draws; every k of a draft uses the same uniform numbers
    (one seed per category and draft), so its draws at different k move together."""
    draws: dict[tuple[str, str, int], Any] = {}
    for (d, k), items in per.items():
        phi = dispersion([x["trace"] for x in items])  # steps come in runs: fewer effective trials
        for c in cats:
            mine = [x for x in items if x["category"] == c]
            pooled = sum((counts_from_steps(x["trace"], k) for x in mine), Counts())
            context = statistics.mean(x["context"] for x in mine)
            u = uniforms(zlib.crc32(f"{c}\0{d}".encode()), ks[-1])
            draws[(c, d, k)] = cost_ratio_draws(profile, d, k, pooled, context, u, phi=phi, sampled=sampled)
    return draws


def _ranked(
    profile: Profile, per: dict[tuple[str, int], list[dict[str, Any]]], draws: dict[tuple[str, str, int], Any],
    category: str, pick: str, sampled: bool,
) -> list[Candidate]:
    """Every (draft, k) of ``category`` ("overall": all prompts), best first by ``pick``."""
    cands = []
    for (d, k), items in per.items():
        mine = [x for x in items if category == "overall" or x["category"] == category]
        cand = _candidate(profile, d, k, mine, sampled)
        values = speedup_draws(mine, [draws[(x["category"], d, k)] for x in mine])
        cand.interval = list(percentile_interval(values, cand.speedup))
        cands.append(cand)
    if pick == "low":
        return sorted(cands, key=lambda x: (-(x.interval or [x.speedup])[0], -x.speedup))
    return sorted(cands, key=lambda x: -x.speedup)


def _plain_seconds(profile: Profile, tr: Trace, sampled: bool) -> float:
    """Plain decoding of as many tokens as ``tr`` committed (sampled traces differ in length)."""
    steps = [(0, 0)] * (len(tr.tokens) - 1)
    return predict_seconds(profile, NONE, steps, tr.prompt_len, tr.prefill_seconds, len(tr.tokens), sampled=sampled)


def _candidate(profile: Profile, draft: str, k: int, items: Sequence[dict[str, Any]], sampled: bool) -> Candidate:
    proposed = sum(x["proposed"] for x in items)
    accepted = sum(x["accepted"] for x in items)
    proposing = sum(x["proposing"] for x in items)
    context = statistics.mean(x["context"] for x in items)
    per_step = 1 + accepted / proposing if proposing else 1.0
    ratio = profile.step_cost_ratio(draft, k, context, sampled=sampled)
    return Candidate(
        draft=draft,
        k=k,
        speedup=_aggregate(items),
        mat=sum(x["committed"] for x in items) / sum(x["steps"] for x in items),
        acceptance=accepted / proposed if proposed else None,
        effective_acceptance=effective_acceptance(min(per_step, k + 1), k) if proposing else None,
        breakeven=breakeven_acceptance(k, ratio),
    )
