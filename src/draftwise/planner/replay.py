"""Replaying decoding offline: a traced generation, its steps at any other k, and their cost.

The planner (:mod:`draftwise.planner.plan`) decodes each prompt once per draft, speculatively at
``k_max``, and then asks what every other k would have done:

- prompt lookup is a pure function of the context, so its steps at any k are replayed exactly
  on the committed tokens (:func:`replay_lookup`, no model pass at all);
- a model or self draft proposes its own greedy chain, so the per-position record of the
  ``k_max`` run ("did the draft, given the true prefix, predict this token?") gives its steps
  at any k <= k_max (:func:`replay_hits`, bonus positions counting as hits);
- with sampling the output is random, so :func:`expected_steps` uses the measured conditional
  acceptance per position instead.

:func:`predict_seconds` prices a list of steps with a machine profile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftwise.core.decode import decode_steps, propose_step
from draftwise.core.generation import Generation
from draftwise.core.kpolicy import FixedK, KPolicy
from draftwise.core.sampling import SamplingConfig
from draftwise.core.text import TextAssembler
from draftwise.core.tree import TokenTree
from draftwise.core.verify import follow
from draftwise.cost.formulas import expected_committed_by_position
from draftwise.cost.profile import Profile
from draftwise.drafters.factory import capabilities_of
from draftwise.drafters.spec import DraftSpec, KValue
from draftwise.planner.plan_file import AUTO


# -- one traced generation -----------------------------------------------------------------
@dataclass
class Trace:
    """One prompt decoded with one draft at k: the committed tokens and every step."""

    question_id: Any
    category: str
    prompt_len: int
    tokens: list[int]  # committed tokens, an ending EOS included
    new_tokens: int  # tokens a user sees (the ending EOS excluded)
    steps: list[tuple[int, int]]  # (proposed, accepted) per step after the prefill
    prefill_seconds: float
    seconds: float
    k: int

    def hits(self) -> list[int | None]:
        """Per output position: 1 the draft predicted it, 0 it did not, None untested."""
        out: list[int | None] = [None] * len(self.tokens)
        pos = 1  # position 0 came from the prefill
        for m, acc in self.steps:
            for i in range(min(acc, len(out) - pos)):  # an EOS may end the output mid-step
                out[pos + i] = 1
            if acc < m and pos + acc < len(out):
                out[pos + acc] = 0
            pos += acc + 1
        return out


def trace_generation(
    model: Any,
    prompt_ids: Sequence[int],
    drafter: Any,
    k: int | KPolicy,
    max_new_tokens: int,
    *,
    sampling: SamplingConfig | None = None,
    question_id: Any = None,
    category: str = "",
) -> Trace:
    """Decode like :func:`draftwise.core.decode.generate` and record each step's (proposed, accepted);
    ``k``: a number, or a policy (``--k auto``'s, fresh for this generation)."""
    cfg = sampling or SamplingConfig()
    steps: list[tuple[int, int]] = []
    start = time.perf_counter()
    prefill = 0.0
    generation = Generation(eos_token_ids=model.eos_token_ids, max_new_tokens=max_new_tokens, drafter=drafter)
    gen = decode_steps(model.runtime, prompt_ids, cfg, cfg.generator(), k=k, max_new_tokens=max_new_tokens,
                       generation=generation)
    try:
        for step in gen:
            if not prefill:
                prefill = time.perf_counter() - start
            else:
                steps.append((step.num_proposed, step.verdict.accepted))
            generation.take(step.verdict.tokens)
            if generation.finish is not None:
                break
    finally:
        gen.close()
        generation.end()  # a finished generation: a learning draft keeps it (as the replay does)
    ended = [generation.eos_token] if generation.eos_token is not None else []
    return Trace(
        question_id=question_id,
        category=category,
        prompt_len=len(prompt_ids),
        tokens=generation.tokens + ended,
        new_tokens=len(generation.tokens),
        steps=steps,
        prefill_seconds=prefill,
        seconds=time.perf_counter() - start,
        k=k if isinstance(k, int) else k.k_max,
    )


# -- replaying a trace at another k --------------------------------------------------------
def replayable(spec: DraftSpec | str) -> bool:
    """Drafts whose proposals are a pure function of what they have seen (they declare
    ``replay="exact"``: prompt lookup, its trees, suffix decoding): their greedy steps at any k
    replay exactly from the committed tokens. A hybrid (``suffix+eagle:...``) is not: its head
    needs the target's features."""
    return capabilities_of(spec).replay == "exact"


def rates_only(spec: DraftSpec | str) -> bool:
    """Drafts whose steps at another k come from a traced run's acceptance rates, not from its
    per-position hits (they declare ``replay="rates"``: an EAGLE head, whose chain at k depends
    on its own earlier guesses, and a hybrid, a tree each step)."""
    return capabilities_of(spec).replay == "rates"


def accepted_along(draft: Any, truth: Sequence[int]) -> int:
    """How many proposed tokens greedy verification keeps when the target's tokens are ``truth``:
    a chain's matching prefix, or a tree's longest root path that follows ``truth`` (the
    verifier's own walk, :func:`draftwise.core.verify.follow`, with the target's argmax at depth d
    being ``truth[d - 1]``)."""
    tree = draft.tree if draft.tree is not None else TokenTree.chain(draft.tokens)
    accept = [d <= len(truth) and tree.token(j) == truth[d - 1] for j, d in enumerate(tree.depths, 1)]
    return follow(tree, accept, [0] * (len(tree) + 1)).accepted


def answer(tokens: Sequence[int], eos_token_ids: Collection[int]) -> list[int]:
    """What a finished generation hands a learning draft: its tokens without the EOS that
    ended it (as :class:`draftwise.core.decode.Stream` does).

    >>> answer([5, 6, 2], {2}), answer([5, 6], {2})
    ([5, 6], [5, 6])
    """
    return list(tokens[:-1]) if tokens and tokens[-1] in eos_token_ids else list(tokens)


def answer_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text :func:`draftwise.core.decode.generate` gives for ``ids`` (what bench puts in the
    next turn's history)."""
    text = TextAssembler(tokenizer)
    text.push(list(ids))
    text.finish()
    return text.text


def replay_lookup(
    make: Callable[[], Any] | Any, prompt_ids: Sequence[int], tokens: Sequence[int], k: int | KPolicy,
    max_new_tokens: int, *, eos_token_ids: Collection[int] = (),
) -> list[tuple[int, int]]:
    """The (proposed, accepted) steps a replayable draft (:func:`replayable`) takes on the
    committed ``tokens``, at a fixed ``k`` or under a policy (``--k auto``'s
    :class:`~draftwise.policy.adaptive.AdaptiveK`, fresh for this generation); a tree step's
    ``proposed`` is its node count. Each step is proposed by the decode loop's own
    :func:`~draftwise.core.decode.propose_step` (the policy's k, its trim, its shadow proposals).
    ``make`` builds the drafter, or is a drafter object kept across prompts (suffix decoding's
    cache of earlier outputs then grows as it would in a real run over the same prompts in the
    same order).

    Exact for greedy decoding, and *exact in distribution* with sampling: these drafts propose
    point masses, whose verification accepts a candidate exactly when the token the target
    samples is that candidate (:mod:`draftwise.core.verify`), so on a sampled continuation the
    steps are what any draft, k or policy would have taken on it."""
    drafter = make() if callable(make) and not hasattr(make, "propose") else make
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    generation = Generation(eos_token_ids=eos_token_ids, max_new_tokens=max_new_tokens, drafter=drafter)
    generation.start(prompt_ids, SamplingConfig(), torch.Generator())
    context = list(prompt_ids) + list(tokens[:1])
    pos, steps = 1, []
    while pos < len(tokens):
        left = max_new_tokens - pos - 1
        budget = min(policy.choose(len(context)), left)
        draft, shadow = propose_step(drafter, policy, context, budget, left)
        acc = accepted_along(draft, tokens[pos:]) if draft.tokens else 0
        committed = list(tokens[pos : pos + acc + 1])
        steps.append((len(draft.tokens), acc))
        if draft.tokens:
            drafter.observe(acc)
            policy.observe(draft.tree.depth if draft.tree is not None else len(draft.tokens), acc)
        elif shadow is not None:
            policy.observe_shadow(shadow, committed)
        context.extend(committed)
        pos += acc + 1
    generation.play(tokens)  # the generation the replay plays back, finished as it was
    generation.end()  # as a finished generation would: a learning draft keeps it
    return steps


def replay_hits(hits: Sequence[int | None], k: int, max_new_tokens: int) -> list[tuple[int, int]]:
    """The steps a fixed-length draft takes at this k, from its per-position hit record."""
    pos, steps = 1, []
    n = len(hits)
    while pos < n:
        m = max(min(k, max_new_tokens - pos - 1), 0)
        acc = 0
        while acc < m and pos + acc < n and hits[pos + acc] != 0:
            acc += 1
        steps.append((m, acc))
        pos += acc + 1
    return steps


def predict_seconds(
    profile: Profile,
    draft: DraftSpec | str,
    steps: Sequence[tuple[int, int]],
    prompt_len: int,
    prefill_seconds: float,
    committed: int,
    *,
    sampled: bool = False,
) -> float:
    """Wall time of a generation taking ``steps``, from the profile's costs (``sampled``: each
    step with sampled verification, where the profile measured it): the sum of its
    :func:`price_parts`."""
    return sum(price_parts(profile, draft, steps, prompt_len, prefill_seconds, committed, sampled=sampled))


def price_parts(
    profile: Profile, draft: DraftSpec | str, steps: Sequence[tuple[int, int]], prompt_len: int,
    prefill_seconds: float, committed: int, *, sampled: bool = False,
) -> tuple[float, float, float, float]:
    """:func:`predict_seconds` in four parts, which :mod:`draftwise.cost.loop_fit` weighs apart:
    what no step scales (the measured prefill, the per-token overhead, a draft's catch-up on
    the prompt), every step priced as a one-row step, what its extra rows add beyond that,
    and the draft's own proposals."""
    spec = DraftSpec.parse(draft)
    key = str(spec)
    fixed = prefill_seconds + committed * profile.token_overhead
    if not spec.is_none and any(m for m, _ in steps):  # a draft's own catch-up on the prompt
        fixed += profile.draft_prefill_time(key, prompt_len)
    one = rows = drafting = 0.0
    pos = prompt_len + 1
    host_search = not spec.is_none and capabilities_of(spec).cost == "host"
    for m, acc in steps:
        d = profile.draft_time(key, m) if not spec.is_none else 0.0
        if host_search and m == 0:
            d = profile.draft_time(key, 1)  # the look-up ran and found nothing
        base = profile.step_time(1, pos, sampled=sampled)
        one += base
        rows += profile.step_time(m + 1, pos, sampled=sampled) - base
        drafting += d
        pos += acc + 1
    return fixed, one, rows, drafting


def plain_seconds(profile: Profile, tr: Trace, sampled: bool) -> float:
    """Plain decoding of as many tokens as ``tr`` committed (sampled traces differ in length)."""
    steps = [(0, 0)] * (len(tr.tokens) - 1)
    return predict_seconds(profile, "none", steps, tr.prompt_len, tr.prefill_seconds, len(tr.tokens), sampled=sampled)


def expected_steps(trace: Trace, k: int) -> list[tuple[int, int]]:
    """Sampling: steps at k as the measured conditional rates predict them (fractional)."""
    tested = [0] * trace.k
    accepted = [0] * trace.k
    proposing = [m for m, _ in trace.steps if m]
    for m, acc in trace.steps:
        for i in range(min(acc + 1, m)):
            tested[i] += 1
        for i in range(acc):
            accepted[i] += 1
    rates = [a / t if t else 0.0 for a, t in zip(accepted, tested)] or [0.0]
    share = len(proposing) / max(len(trace.steps), 1)  # steps where the draft proposed at all
    e = expected_committed_by_position(rates, k)
    per_step = share * e + (1 - share)
    n_steps = max(round((len(trace.tokens) - 1) / per_step), 1)
    n_prop = round(n_steps * share)
    # e - 1 accepted per proposing step on average, spread as whole tokens (rounding each step
    # alone would report 0 accepted whenever e < 1.5)
    total = round(n_prop * (e - 1))
    accepted = [(i + 1) * total // max(n_prop, 1) - i * total // max(n_prop, 1) for i in range(n_prop)]
    return [(k, a) for a in accepted] + [(0, 0)] * (n_steps - n_prop)


def turn_prices(profile: Profile, traces: dict[Any, Trace], ref: Trace, sampled: bool) -> dict[str, Any]:
    """One turn's check of the profile: each traced run's real seconds beside the profile's
    price of its own steps and that price's :func:`price_parts` (``runs``, by ``"DRAFT k=K"``,
    plain decoding's as ``"plain"``), and the price of plain decoding of the reference trace's
    tokens (``plain_s``)."""
    runs = {}
    for (d, k), tr in traces.items():
        parts = price_parts(profile, d, tr.steps, tr.prompt_len, tr.prefill_seconds, len(tr.tokens), sampled=sampled)
        runs["plain" if DraftSpec.parse(d).is_none else f"{d} k={k}"] = {
            "measured_s": tr.seconds, "predicted_s": sum(parts), "parts": list(parts)}
    return {"runs": runs, "plain_s": plain_seconds(profile, ref, sampled)}


def unit_prices(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One unit's prices (:func:`turn_prices` of each turn), added up over its turns, as a
    question's turns add up in bench."""
    runs = {}
    for run, first in turns[0]["runs"].items():
        runs[run] = {what: round(sum(t["runs"][run][what] for t in turns), 4) for what in ("measured_s", "predicted_s")}
        if "parts" in first:
            runs[run]["parts"] = [round(sum(t["runs"][run]["parts"][i] for t in turns), 5) for i in range(4)]
    return {"plain_s": round(sum(t["plain_s"] for t in turns), 4), "runs": runs}


def pricing(prompts: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per traced run (a draft at k), the median over prompts of its measured seconds over the
    seconds the profile prices its own steps at: 1.0 when the profile prices the decode loop
    as it ran; above 1.0 when the loop ran slower than the profile says (a machine slower now
    than when it was profiled, or costs the profile does not hold). A plan's speedups are
    ratios of such prices, so a ratio alike for every run cancels; see docs/planner.md.

    >>> pricing([{"runs": {"lookup k=8": {"measured_s": 3.0, "predicted_s": 2.0}}},
    ...          {"runs": {"lookup k=8": {"measured_s": 2.0, "predicted_s": 2.0}}},
    ...          {"runs": {"lookup k=8": {"measured_s": 2.4, "predicted_s": 2.0}}}])
    {'lookup k=8': 1.2}
    """
    ratios: dict[str, list[float]] = {}
    for p in prompts:
        for run, t in (p.get("runs") or {}).items():
            if t["predicted_s"] > 0:
                ratios.setdefault(run, []).append(t["measured_s"] / t["predicted_s"])
    return {run: round(statistics.median(r), 4) for run, r in ratios.items()}


# -- one unit's prediction, as the planner keeps it ------------------------------------------
def price_item(
    profile: Profile, spec: DraftSpec, k: KValue, steps: list[tuple[int, int]], tr: Trace, prompt_len: int,
    cfg: SamplingConfig, category: str,
) -> dict[str, Any]:
    """One unit's prediction for (``spec``, ``k``): predicted seconds, plain's, and the counts."""
    d, sampled, committed = str(spec), not cfg.greedy, len(tr.tokens)
    # the steps are real (replayed, or the auto run's own) unless expected from a trace's rates
    exact = replayable(spec) or k == AUTO or (cfg.greedy and not rates_only(spec))
    cut = k if isinstance(k, int) else max((m for m, _ in steps), default=1)
    return {
        "category": category, "new_tokens": max(tr.new_tokens, 1),
        "plain_s": plain_seconds(profile, tr, sampled),
        "method_s": predict_seconds(profile, d, steps, prompt_len, tr.prefill_seconds, committed, sampled=sampled),
        "fixed_s": predict_seconds(profile, d, [], prompt_len, tr.prefill_seconds, committed),
        # the steps behind the binomial interval: the replay's, or the sampled trace's cut to k
        "trace": [(min(m, cut), min(a, cut)) for m, a in (steps if exact else tr.steps)],
        "steps": len(steps) + 1, "committed": committed,
        "proposed": sum(m for m, _ in steps), "accepted": sum(a for _, a in steps),
        "proposing": sum(1 for m, _ in steps if m), "context": prompt_len + len(tr.tokens) / 2,
    }


def merge_turns(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One question's prediction from its turns' (:func:`price_item`): tokens, seconds and counts
    add up, as bench counts a question's turns (its tokens/s is all its tokens over all its
    time); the context is the turns' mean."""
    out = dict(turns[0])
    for t in turns[1:]:
        for key in ("new_tokens", "plain_s", "method_s", "fixed_s", "steps", "committed", "proposed", "accepted",
                    "proposing"):
            out[key] += t[key]
        out["trace"] = out["trace"] + t["trace"]
    out["context"] = statistics.mean(t["context"] for t in turns)
    return out
