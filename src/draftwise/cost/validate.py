"""``draftwise plan --validate``: run the plan's recommendations for real and score the model.

Plain decoding and every recommended setting run on the plan's prompts, interleaved prompt by
prompt (the order rotates), in one process; with ``repeats`` > 1 each generation keeps the best
of its back-to-back runs, which filters the pauses a shared machine adds. For each category the measured speedup (mean
tokens/s ratio, as predicted) is set against the plan's prediction; the relative error is
|predicted - measured| / measured, and each check says whether the measured speedup fell inside
the plan's 95% prediction interval (``inside_share``: the share of categories that did).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ..decode import generate
from ..drafters import make_drafter
from ..drafters.spec import DraftSpec
from ..errors import ConfigError
from ..questions import Question
from ..sampling import SamplingConfig
from .formulas import mean_rate_speedup
from .plan import NONE, Plan, as_questions, warm_up


def validate_plan(
    model: Any,
    plan: Plan,
    questions: Sequence[Question | dict[str, Any]],
    *,
    extra: Sequence[tuple[DraftSpec | str, int]] = (),
    repeats: int = 1,
    seed: int = 0,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, Any]:
    """Measure each category's recommendation (and ``extra`` (draft, k) settings on every
    prompt) against plain decoding; return per-setting predicted vs measured speedups.
    Each generation runs ``repeats`` times, the settings interleaved repeat by repeat, and keeps
    its best time; with sampling its repeats share one seed (``seed`` + the prompt's index), so
    they decode the same text."""
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    rows = as_questions(questions)
    extra = [(str(DraftSpec.parse(d)), k) for d, k in extra]
    temperature = float(plan.config.get("temperature", 0.0))
    max_new = int(plan.config.get("max_new_tokens", 128))
    settings = {plan.choose(r.category) for r in rows} | set(extra)
    settings.discard((NONE, 0))
    # drafters of their own: a suffix draft's cache of earlier outputs grows over these prompts as it
    # would in real use, and learns nothing from the planner's own runs
    drafters = {s: make_drafter(s[0], model) for s in settings}
    warm_up(model)
    # per (label, category): list of (plain tok/s, method tok/s)
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    plain_tps: list[dict[str, Any]] = []
    for qi, row in enumerate(rows):
        prompt_ids = model.encode_prompt(row.prompt)
        rec = plan.choose(row.category)
        mine = [s for s in settings if s == rec or s in extra]
        order: list[tuple[str, int]] = [(NONE, 0), *sorted(mine)]
        shift = qi % len(order)
        order = order[shift:] + order[:shift]
        # with sampling, one seed per prompt: the repeats of a setting decode the same
        # continuation, so keeping the best run filters timing noise, not luckier text
        cfg = SamplingConfig(temperature=temperature, seed=None if temperature == 0 else seed + qi)
        # best of `repeats` (a shared machine only ever adds time), the settings interleaved
        # repeat by repeat: a slow spell of several seconds then costs each setting at most one
        # run, where back-to-back repeats let it take every run of one setting
        results = dict.fromkeys(order, 0.0)
        for r in range(repeats):
            for j, s in enumerate(order):
                if progress:
                    done = (r * len(order) + j) / (repeats * len(order))
                    progress(f"{s[0]}@k={s[1]} on q{row.question_id}", (qi + done) / len(rows))
                tps = _timed(model, prompt_ids, max_new, cfg, drafters.get(s), max(s[1], 1), last=r == repeats - 1)
                results[s] = max(results[s], tps)
        plain_tps.append({"category": row.category, "tps": results[(NONE, 0)]})
        for s in mine:
            measured.setdefault(s, []).append(
                {"category": row.category, "plain": results[(NONE, 0)], "method": results[s],
                 "recommended": s == rec}
            )
    if progress:
        progress("done", 1.0)

    checks = []
    cats = list(dict.fromkeys(r.category for r in rows))
    for c in cats:
        d, k = plan.choose(c)
        if d == NONE:
            continue
        items = [x for x in measured[(d, k)] if x["category"] == c]
        checks.append(_check(c, d, k, plan.predicted[c], items, plan.intervals.get(c)))
    per_category = [x for x in checks if x["inside"] is not None]  # before the overall checks
    routed = [x for v in measured.values() for x in v if x["recommended"]]
    by_prompt_plain = [x["plain"] for x in routed] + [
        p["tps"] for p in plain_tps if plan.choose(p["category"])[0] == NONE
    ]
    by_prompt_method = [x["method"] for x in routed] + [
        p["tps"] for p in plain_tps if plan.choose(p["category"])[0] == NONE
    ]
    routed_measured = mean_rate_speedup(by_prompt_method, by_prompt_plain)
    checks.append({"category": "overall (routed)", "draft": "per category", "k": None,
                   "predicted": plan.routed_overall, "measured": routed_measured,
                   "error": abs(plan.routed_overall - routed_measured) / routed_measured, "prompts": len(rows),
                   **_inside(routed_measured, plan.routed_interval)})
    for d, k in extra:
        cand = plan.candidate("overall", d, k)
        if cand is not None and (d, k) in measured:
            checks.append(_check("overall", d, k, cand.speedup, measured[(d, k)], cand.interval))
    errors = [x["error"] for x in checks]
    return {
        "checks": checks,
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        # the share of categories whose measured speedup fell inside its 95% prediction interval
        "inside_share": (sum(x["inside"] for x in per_category) / len(per_category)) if per_category else None,
        "goals": {"median": 0.10, "max": 0.20, "inside": 0.80},
        "repeats": repeats,
    }


def _inside(measured: float, interval: Sequence[float] | None) -> dict[str, Any]:
    if interval is None:  # a plan made before intervals
        return {"interval": None, "inside": None}
    return {"interval": list(interval), "inside": bool(interval[0] <= measured <= interval[1])}


def _check(category: str, draft: str, k: int, predicted: float, items: Sequence[dict[str, Any]],
           interval: Sequence[float] | None = None) -> dict[str, Any]:
    measured = mean_rate_speedup([x["method"] for x in items], [x["plain"] for x in items])
    return {"category": category, "draft": draft, "k": k, "predicted": predicted, "measured": measured,
            "error": abs(predicted - measured) / measured, "prompts": len(items), **_inside(measured, interval)}


def _timed(model: Any, prompt_ids: list[int], max_new: int, cfg: SamplingConfig, drafter: Any, k: int,
           *, last: bool) -> float:
    """Tokens/s of one generation; a repeat before the last is not remembered by a draft that
    learns across generations (it would otherwise see its own answer again)."""
    return generate(model, prompt_ids, max_new_tokens=max_new, sampling=cfg, draft=drafter, k=k,
                    learn=last).tokens_per_second

