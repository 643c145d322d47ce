"""The planner: run each draft on a sample of the workload, predict every (draft, k), recommend.

The workload is a list of :class:`~draftwise.questions.Question` (``read_questions`` +
``select_questions``); any category is planned for. Drafts are keyed by their canonical spec.
A *unit* is one question (all its turns, each answer in the next turn's history, as bench runs
it) decoded once; with sampling each question gives ``samples`` units, one per seed.

1. The target decodes each unit speculatively, once per draft that cannot be replayed (or once
   in all), at ``k_max``. With greedy decoding the committed tokens are the plain output
   whatever the draft; with sampling they are one draw of the target's output whatever the
   draft (the verification is lossless).
2. *Which* tokens a draft gets right does not depend on k:

   - prompt lookup and suffix decoding are pure functions of what they have seen, so their
     steps at any k, and under the adaptive policy (``k="auto"``), are replayed on the
     committed tokens (no model pass). This is exact when greedy, and exact in distribution
     with sampling: they propose point masses, which verification accepts exactly when the
     sampled token is the candidate (:func:`~draftwise.planner.replay.replay_lookup`);
   - a model or self draft proposes its own greedy chain; in the ``k_max`` run every output
     position was either accepted, rejected, or a bonus token. That per-position record
     ("did the draft, given the true prefix, predict this token?") is replayed for any
     k <= k_max, bonus positions counting as hits (:mod:`draftwise.planner.replay`);
   - a draft that proposes distributions (an EAGLE head, a hybrid), and any draft other than
     lookup and suffix with sampling, uses its measured conditional acceptance per draft
     position instead: E = 1 + sum_i prod_{j<=i} a_j; under ``k="auto"`` it gets a run of its
     own under the policy.

3. Each step costs ``D(m) + step(m + 1, context)`` from the machine profile (m tokens
   proposed), each committed token ``token_overhead``, and the prefill what it took. Plain
   decoding is the same sum with m = 0. Predicted speedup = mean tokens/s of the method /
   mean tokens/s of plain decoding over the units (Spec-Bench's convention,
   :func:`~draftwise.cost.formulas.mean_rate_speedup`, bench's first speedup column).

A draft with its own cache (a model draft, a head) also pays, once per generation, for catching
up on the prompt at its first proposal: the profile's ``draft_prefill`` (seconds per prompt
token) times the prompt's length.

"No speculation" is always a candidate: a category whose best draft does not beat plain
decoding is told to decode plainly. Intervals: :class:`Spread`; docs/planner.md.
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from draftwise.core.decode import generate
from draftwise.core.sampling import SamplingConfig
from draftwise.cost.formulas import breakeven_acceptance, effective_acceptance
from draftwise.cost.intervals import percentile_interval, timing_spread
from draftwise.cost.loop_fit import fit_loop, fitted_profile
from draftwise.cost.profile import Profile
from draftwise.drafters import capabilities_of, make_drafter
from draftwise.drafters.spec import DraftSpec, KValue
from draftwise.errors import ConfigError
from draftwise.planner.pick import (
    Per,
    Spread,
    aggregate,
    choose,
    route_units,
    routed_items,
    score_by,
    spread_note,
)
from draftwise.planner.plan_file import (
    AUTO,
    NONE,
    PLAN_SCHEMA,
    Candidate,
    Plan,
    load_plan,
)
from draftwise.planner.replay import (
    Trace,
    answer,
    answer_text,
    expected_steps,
    merge_turns,
    price_item,
    pricing,
    rates_only,
    replay_hits,
    replay_lookup,
    replayable,
    trace_generation,
    turn_prices,
    unit_prices,
)
from draftwise.planner.route import policy_for
from draftwise.questions import Question, parse_question
from draftwise.runtime.chat import encode_conversation

# the plan's data and file live in .plan_file; they are imported from here too
__all__ = ["DEFAULT_SAMPLES", "NONE", "PLAN_SCHEMA", "Candidate", "Plan", "as_questions", "check_samples", "load_plan",
           "make_plan", "spread_note", "warm_up"]

#: continuations per prompt with sampling (greedy decoding has one); see docs/planner.md. At 4
#: the 95% intervals measured a median width of 0.50 on unseen questions, at 8 0.35 (and every
#: category inside): a useful interval needs 8, for twice the sampled traces.
DEFAULT_SAMPLES = 8


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
    samples: int = DEFAULT_SAMPLES,
    auto: bool = True,
    sure: bool = False,
    pick: str | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Plan:
    """Trace ``questions`` (already sampled: :func:`~draftwise.questions.select_questions`) with
    each draft, predict every (draft, k), recommend. Spec-Bench rows (dicts) are accepted too.

    ``samples``: with sampling, continuations decoded per prompt, each from its own seed (the
    sampling config's seed, or 0, plus 0..samples-1); each (prompt, continuation) is one unit of
    the predicted mean-rate speedup, and the spread between continuations gives the intervals
    (:func:`~draftwise.cost.intervals.rerun_draws`). Greedy decoding has one continuation.
    ``auto``: the adaptive policy (``--k auto``) is a candidate of every draft, as k ``"auto"``.

    Each prediction carries a 95% prediction interval. ``pick`` ranks the candidates of a
    category: ``"low"`` by the low end of the interval (the default with sampling, where which
    continuation comes decides much), ``"point"`` by the prediction (the default in greedy mode,
    where the replay is exact on the traced prompts). The pick is used when its prediction beats
    plain decoding (``sure``: when even its interval's low end does)."""
    profile.check_model(model)
    cfg = sampling or SamplingConfig()
    pick = pick or ("point" if cfg.greedy else "low")
    if pick not in ("low", "point"):
        raise ConfigError(f"pick={pick!r} must be 'low' (the interval's low end) or 'point'")
    samples = check_samples(samples, cfg)
    rows, specs, ks = _check_inputs(profile, questions, drafts, ks, k_run)
    # each drafter is private: a suffix draft's cache learns only from this plan's own prompts,
    # and one run's from that run alone (see _drafter)
    drafters: dict[tuple[str, KValue, int], Any] = {}
    for d in specs:
        profile.draft_time(d, 1)  # raises if the profile lacks this draft
    # replayable drafts replay on any trace's tokens (exactly; with sampling, exactly in
    # distribution), so one trace serves them all; a draft that cannot be replayed runs itself
    traced = [d for d in specs if not replayable(specs[d])] or list(specs)[:1]
    k_run = max(k_run, ks[-1]) if cfg.greedy else k_run
    runs: list[tuple[str, KValue]] = [(d, k_run) for d in traced]
    if auto:
        runs += [(d, AUTO) for d in traced if not replayable(specs[d])]
    # timed only, for the profile's fit to the loop (cost/loop_fit.py): plain decoding, and a
    # draft whose only cost is a host search unless one is traced already
    host = [d for d in specs if capabilities_of(specs[d]).cost == "host"]
    timed: list[tuple[str, KValue]] = [(NONE, 0)] + ([(host[0], k_run)] if host and host[0] not in traced else [])
    candidates: list[KValue] = [*ks, AUTO] if auto else list(ks)
    seeds = [(cfg.seed or 0) + s for s in range(samples)]
    warm_up(model)
    pending: list[tuple[Question, int, list[list[tuple[Any, ...]]]]] = []  # (row, sample, turns' unpriced items)
    replays: dict[tuple[str, KValue, int], Any] = {}
    prompt_info = []
    total = sum(len(r.turns) for r in rows) * samples * (len(runs) + len(timed))
    count = itertools.count()
    for row in rows:
        for sample, seed in enumerate(seeds):
            unit_cfg = cfg if cfg.greedy else replace(cfg, seed=seed)
            answers: list[str] = []
            turn_items: list[list[tuple[Any, ...]]] = []
            equal, turn_prompts, turn_news, turn_prices = True, [], [], []
            for turn in range(len(row.turns)):  # each answer goes into the next turn's history, as in bench
                prompt_ids = encode_conversation(model.tokenizer, row.turns[: turn + 1], answers)
                ref, same, items, prices = _trace_turn(
                    model, profile, prompt_ids, row, sample, unit_cfg, specs, runs, timed, candidates, k_run,
                    drafters, replays, max_new_tokens, tick=lambda what: progress(f"{what} on q{row.question_id} "
                                                                        f"({row.category}) turn {turn + 1} "
                                                                        f"#{sample + 1}", next(count) / total)
                    if progress else None,
                )
                equal = equal and same
                turn_prompts.append(len(prompt_ids))
                turn_news.append(ref.new_tokens)
                turn_items.append(items)
                turn_prices.append(prices)
                answers.append(answer_text(model.tokenizer, answer(ref.tokens, model.eos_token_ids)))
            prompt_info.append({"question_id": row.question_id, "category": row.category, "sample": sample,
                                "seed": None if cfg.greedy else seed, "turns": len(row.turns),
                                "prompt_tokens": turn_prompts[0], "new_tokens": sum(turn_news), "equal": equal,
                                "turn_prompt_tokens": turn_prompts, "turn_new_tokens": turn_news})
            prompt_info[-1].update(unit_prices(turn_prices))
            pending.append((row, sample, turn_items))
    if progress:
        progress("predicting", 1.0)
    loop_fit = fit_loop(prompt_info)
    fitted = fitted_profile(profile, loop_fit)  # every candidate is priced as the loop ran
    config = {"max_new_tokens": max_new_tokens, "k_run": k_run, "temperature": cfg.temperature, "pick": pick,
              "samples": samples, "seeds": None if cfg.greedy else seeds, "auto": auto,
              "profile_created": profile.created, "date": time.strftime("%Y-%m-%d %H:%M"),
              "pricing": pricing(prompt_info), "loop_fit": loop_fit}
    plan = _recommend(model, fitted, rows, list(specs), candidates, _price_units(fitted, pending, cfg), cfg,
                      pick=pick, sure=sure, prompts=prompt_info, config=config)
    plan.config["unfitted"] = _unfitted(plan, _price_units(profile, pending, cfg))
    return plan


def _unfitted(plan: Plan, per: Per) -> dict[str, float]:
    """Each category's pick (and the routed workload's) priced with the profile as measured, the
    fit left out (``per``): kept beside the fitted prediction, so that a validation scores both
    on the same measurements (docs/planner.md, "The profile fitted to the loop")."""
    out = {}
    for cat, (d, k) in plan.recommended.items():
        items = [x for x in per.get((d, k), []) if cat == "overall" or x["category"] == cat]
        if items:
            out[cat] = round(aggregate(items), 4)
    out["overall (routed)"] = round(aggregate(routed_items(plan.recommended, per, next(iter(per)))[0]), 4)
    return out


def _trace_turn(
    model: Any, profile: Profile, prompt_ids: list[int], row: Question, sample: int, cfg: SamplingConfig,
    specs: dict[str, DraftSpec], runs: list[tuple[str, KValue]], timed: list[tuple[str, KValue]],
    candidates: list[KValue], k_run: int, drafters: dict[tuple[str, KValue, int], Any],
    replays: dict[tuple[str, KValue, int], Any], max_new_tokens: int, *, tick: Callable[[str], Any],
) -> tuple[Trace, bool, list[tuple[Any, ...]], dict[str, Any]]:
    """One turn of one unit: each traced run (``runs``) and each run only timed (``timed``),
    then every candidate's steps from the traced ones. Returns the reference trace (its tokens
    are the turn's answer), whether every greedy run committed the same tokens, each (draft, k)'s
    arguments to :func:`~draftwise.planner.replay.price_item` (priced once the profile is fitted to the loop), and the
    profile's prices (:func:`~draftwise.planner.replay.turn_prices`: each run's, and plain's)."""
    traces: dict[tuple[str, KValue], Trace] = {}
    timings: dict[tuple[str, KValue], Trace] = {}
    for d, k in [*runs, *timed]:
        tick(f"{d} k={k}")
        drafter = None if d == NONE else _drafter(drafters, model, specs[d], k, sample)
        policy = 1 if drafter is None else k if k != AUTO else policy_for(
            model, specs[d], AUTO, capabilities=drafter.capabilities)
        (traces if (d, k) in runs else timings)[(d, k)] = trace_generation(
            model, prompt_ids, drafter, policy, max_new_tokens, sampling=cfg, question_id=row.question_id,
            category=row.category)
    ref = traces[runs[0]]
    same = not cfg.greedy or all(t.tokens == ref.tokens for t in [*traces.values(), *timings.values()])
    items = []
    for d in specs:
        for k in candidates:
            steps = _replay(model, specs[d], k, prompt_ids, traces, ref, replays, max_new_tokens, cfg, sample)
            own = traces.get((d, AUTO if k == AUTO else k_run), ref)
            items.append(((d, k), specs[d], k, steps, own, len(prompt_ids)))
    return ref, same, items, turn_prices(profile, {**traces, **timings}, ref, not cfg.greedy)


def _price_units(profile: Profile, pending: Sequence[tuple[Question, int, list[list[tuple[Any, ...]]]]],
                 cfg: SamplingConfig) -> Per:
    """Each (draft, k)'s items, one per unit (a question's turns added up), priced by ``profile``."""
    per: Per = {}
    for row, sample, turns in pending:
        for i, (key, *_) in enumerate(turns[0]):
            item = merge_turns([price_item(profile, *t[i][1:], cfg, row.category) for t in turns])
            item.update(question_id=row.question_id, sample=sample)
            per.setdefault(key, []).append(item)
    return per


def _drafter(cache: dict[tuple[str, KValue, int], Any], model: Any, spec: DraftSpec, k: KValue, sample: int) -> Any:
    """The drafter of one run: a (draft, k) on the ``sample``-th continuation of every prompt.
    Runs never share one: a suffix draft's cache must not hold the answer another run just gave
    to the same prompt (a second run would copy it whole). Each sample index is one pass over
    the workload, as ``--validate`` and a real workload, whose prompts do not repeat, see it."""
    key = (str(spec), k, sample)
    if key not in cache:
        cache[key] = make_drafter(spec, model)
    return cache[key]


def check_samples(samples: int, cfg: SamplingConfig) -> int:
    """``samples`` checked: >= 1; greedy decoding has one continuation, so more is one."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ConfigError(f"--samples {samples} must be an integer >= 1 (continuations per prompt)")
    return 1 if cfg.greedy else samples


def _replay(
    model: Any, spec: DraftSpec, k: KValue, prompt_ids: Sequence[int], traces: dict[tuple[str, KValue], Trace],
    ref: Trace, replays: dict[tuple[str, KValue, int], Any], max_new_tokens: int, cfg: SamplingConfig,
    sample: int,
) -> list[tuple[int, int]]:
    """The (proposed, accepted) steps of ``spec`` at ``k`` (``"auto"``: the adaptive policy) on
    one unit: replayed on ``ref``'s tokens (a replayable draft: exact when greedy, exact in
    distribution with sampling), its own traced run (``"auto"`` of another draft), or expected
    from a traced run's rates (sampling, or a draft whose hits depend on its depth in the
    step). ``replays`` keeps one drafter per (draft, k, sample index) across prompts, so a
    suffix draft's cache of earlier outputs grows as it would in a real run."""
    d = str(spec)
    if replayable(spec):
        drafter = _drafter(replays, model, spec, k, sample)
        policy = k if k != AUTO else policy_for(model, spec, AUTO, capabilities=drafter.capabilities)
        return replay_lookup(drafter, prompt_ids, ref.tokens, policy, max_new_tokens,
                             eos_token_ids=model.eos_token_ids)
    if k == AUTO:
        return list(traces[(d, AUTO)].steps)
    trace = next(t for (name, kk), t in traces.items() if name == d and kk != AUTO)
    assert isinstance(k, int)
    if cfg.greedy and not rates_only(spec):
        return replay_hits(trace.hits(), k, max_new_tokens)
    return expected_steps(trace, k)


def _recommend(
    model: Any, profile: Profile, rows: list[Question], drafts: list[str], ks: list[KValue],
    per: Per, cfg: SamplingConfig, *, pick: str, sure: bool,
    prompts: list[dict[str, Any]], config: dict[str, Any],
) -> Plan:
    """Rank every (draft, k) in each category, recommend per category, and predict the routed
    workload (each prompt decoded with its category's recommendation)."""
    sampled = not cfg.greedy
    cats = list(dict.fromkeys(r.category for r in rows)) + ["overall"]
    timing, config["timing_df"] = timing_spread(prompts)
    config["timing_sd"] = round(math.sqrt(timing), 4)
    spread = Spread(profile, per, cats[:-1], [k for k in ks if isinstance(k, int)], sampled,
                     bootstrap=int(config.get("samples", 1)) > 1, timing=timing)
    categories = {c: _ranked(profile, per, spread, c, pick, sampled) for c in cats}
    recommended: dict[str, tuple[str, KValue]] = {}
    predicted: dict[str, float] = {}
    intervals: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    picks = choose(categories, score_by(pick))
    for c in cats:
        best = picks[c]
        lo = (best.interval or [best.speedup])[0]
        if best.speedup > 1.0 and (lo > 1.0 or not sure):
            recommended[c], predicted[c] = (best.draft, best.k), best.speedup
            intervals[c] = list(best.interval or [best.speedup, best.speedup])
            note = spread_note(best, sampled=sampled)
            if note:
                notes[c] = note
        else:
            recommended[c], predicted[c], intervals[c] = (NONE, 0), 1.0, [1.0, 1.0]
    routed_overall, routed_interval = route_units(rows, recommended, per, spread, next(iter(per)))
    return Plan(
        model=model.name, fingerprint=profile.fingerprint, dtype=profile.dtype, greedy=cfg.greedy,
        drafts=drafts, ks=list(ks), categories=categories, recommended=recommended, predicted=predicted,
        routed_overall=routed_overall, intervals=intervals, routed_interval=routed_interval,
        prompts=prompts, config=config, notes=notes,
    )


def _ranked(profile: Profile, per: Per, spread: Spread, category: str, pick: str, sampled: bool) -> list[Candidate]:
    """Every (draft, k) of ``category`` ("overall": all prompts), best first by ``pick``."""
    cands = []
    for (d, k), items in per.items():
        mine = [x for x in items if category == "overall" or x["category"] == category]
        cand = _candidate(profile, d, k, mine, sampled)
        cand.interval = list(percentile_interval(spread.draws(mine, [(d, k)] * len(mine), category), cand.speedup))
        cands.append(cand)
    if pick == "low":
        return sorted(cands, key=lambda x: (-(x.interval or [x.speedup])[0], -x.speedup))
    return sorted(cands, key=lambda x: -x.speedup)


def _candidate(profile: Profile, draft: str, k: KValue, items: Sequence[dict[str, Any]], sampled: bool) -> Candidate:
    proposed = sum(x["proposed"] for x in items)
    accepted = sum(x["accepted"] for x in items)
    proposing = sum(x["proposing"] for x in items)
    context = statistics.mean(x["context"] for x in items)
    per_step = 1 + accepted / proposing if proposing else 1.0
    # auto: its break-even and a_eff at the k it proposed on average
    k_eff = k if isinstance(k, int) else max(1, min(round(proposed / proposing) if proposing else 1, profile.max_n - 1))
    ratio = profile.step_cost_ratio(draft, k_eff, context, sampled=sampled)
    return Candidate(
        draft=draft,
        k=k,
        speedup=aggregate(items),
        mat=sum(x["committed"] for x in items) / sum(x["steps"] for x in items),
        acceptance=accepted / proposed if proposed else None,
        effective_acceptance=effective_acceptance(min(per_step, k_eff + 1), k_eff) if proposing else None,
        breakeven=breakeven_acceptance(k_eff, ratio),
        samples=[round(x["plain_s"] / x["method_s"], 4) for x in items],
    )
