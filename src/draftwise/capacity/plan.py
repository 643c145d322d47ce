"""``draftwise plan --concurrency 1,2,4,8,16``: does speculation still pay at N concurrent requests?

For each N in the grid, from a plan (per-category acceptance), the machine's batch profile
(:mod:`.batch_profile`) and its ordinary profile (draft costs, overheads), the goodput model
(:mod:`.goodput`) predicts aggregate and per-request tokens/s of plain batching, of every
fixed (draft, k), of the plan's per-category picks and of the goodput policy, with intervals;
the crossover N above which speculation stops paying; a plot of throughput against N; and the
per-batch-size k tables serving engines take (:func:`export_batch_schedule`).

The workload is the plan's: units of one question with all its turns, one request a turn, up to
the plan's ``max_new_tokens`` each (:mod:`.goodput`). ``--validate`` measures each N for real
(one server at a time, greedy, the same kind of units from questions the plan did not see): the
load test is handed in (``run_concurrency(measure=...)``; the server's package provides it,
:func:`draftwise.server.validate.measure_concurrency`, since it drives the server's worker and
sits above this layer). Then this module predicts the very requests it sent (their categories
and lengths, the plan's acceptance) and :func:`compare_measured` scores each prediction.

Example::

    from draftwise import load_model
    from draftwise.capacity.plan import concurrency_plan, render_concurrency_markdown
    result = concurrency_plan(model, plan, batch_profile, profile, concurrency=[1, 2, 4, 8, 16])
    print(render_concurrency_markdown(result))
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from draftwise.capacity.export import SCHEDULE_ENGINES, export_batch_schedule
from draftwise.capacity.report import plot_concurrency, render_concurrency_markdown
from draftwise.capacity.simulate import predict, workload_from_plan
from draftwise.capacity.workload import Request
from draftwise.core.engine import DEFAULT_SERVE_CONTEXT, check_batch
from draftwise.cost.batch_measure import resolve_batch_profile
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.goodput import StepCost
from draftwise.cost.profile import Profile
from draftwise.cost.served import ServedProfile
from draftwise.errors import ConfigError
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.planner.export import ENGINES
from draftwise.policy.batch_limit import limit_of

SCHEMA = "draftwise.concurrency/1"
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
#: units (questions, every turn of each) a client sends at the largest N: the prediction's and the load test's
REQUESTS_PER_CLIENT = 4


def parse_concurrency(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4,8,16"`` -> ``[1, 2, 4, 8, 16]`` (sorted); one clear line for 0, a negative, a
    duplicate or something that is not a whole number.

    >>> parse_concurrency("4, 1,16")
    [1, 4, 16]
    """
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    if not parts or parts == [""]:
        raise ConfigError("--concurrency needs at least one number of concurrent requests, e.g. 1,2,4,8,16")
    values = []
    for p in parts:
        try:
            if isinstance(p, bool) or (isinstance(p, float) and p != int(p)):
                raise TypeError
            n = int(p)
        except (TypeError, ValueError):
            raise ConfigError(f"--concurrency {p!r} is not a whole number; give e.g. 1,2,4,8,16") from None
        if n < 1:
            raise ConfigError(f"--concurrency {n}: the number of concurrent requests must be >= 1")
        values.append(n)
    dupes = sorted({n for n in values if values.count(n) > 1})
    if dupes:
        raise ConfigError(f"--concurrency lists {', '.join(map(str, dupes))} more than once; give each N once")
    return sorted(values)


def check_fits(model: Any, concurrency: Sequence[int], context: int | None = None) -> None:
    """One line for the first N whose batch's KV cache will not fit in memory (at ``context``
    positions a sequence, the server's default when None)."""
    ctx = min(context or DEFAULT_SERVE_CONTEXT, model.runtime.max_context)
    for n in concurrency:
        try:
            check_batch(model, n, ctx)
        except ConfigError as exc:
            raise ConfigError(f"--concurrency {n}: {exc}") from None


def concurrency_plan(
    model: Any, plan: Any, batch_profile: BatchProfile, profile: Profile,
    concurrency: str | Sequence[int] = DEFAULT_CONCURRENCY, *, requests_per_client: int = REQUESTS_PER_CLIENT,
    max_new_tokens: int | None = None, context: int | None = None,
    progress: Callable[[str, float], None] | None = None, units: Sequence[Sequence[Request]] | None = None,
    per_phase: int | None = None, served: ServedProfile | None = None,
) -> dict[str, Any]:
    """Predictions at each N (JSON-able; :func:`draftwise.capacity.simulate.predict`), after checking
    that the plan, both profiles and ``model`` belong together and that each N fits in memory.
    ``units``: the requests to predict (default: the plan's own prompts); ``requests_per_client``
    counts units (questions, every turn of each) and ``per_phase``, where given, the units every N
    sends (:func:`draftwise.capacity.simulate.client_units`). ``served``: the served step as measured
    (:mod:`draftwise.cost.served`), so every step is priced as the server runs it; None: passes alone."""
    concurrency = parse_concurrency(concurrency)
    batch_profile.check_model(model)
    profile.check_model(model)
    if plan.fingerprint != batch_profile.fingerprint:
        raise ConfigError(f"the plan was made for model {plan.model!r} (fingerprint {plan.fingerprint}), the batch "
                          f"profile on {batch_profile.model!r} ({batch_profile.fingerprint}); use one model for both")
    check_fits(model, concurrency, context)
    workload = workload_from_plan(plan, units)
    result = predict(workload, StepCost.served_from(batch_profile, profile, served), concurrency,
                     requests_per_client=requests_per_client, max_new_tokens=max_new_tokens, progress=progress,
                     per_phase=per_phase)
    result.update(
        schema=SCHEMA, model=plan.model, dtype=batch_profile.dtype, date=time.strftime("%Y-%m-%d %H:%M"),
        plan_date=plan.config.get("date", ""), batch_profile_created=batch_profile.created,
        profile_created=profile.created,
        linear_fit={str(c): v for c, v in batch_profile.linear_fit().items()},
        prompt_share=batch_profile.prompt_share, validation=None,
        served=None if served is None else {
            "created": served.created, "step_ms": served.step_seconds * 1e3, "per_plain_ms": served.per_plain * 1e3,
            "per_speculating_ms": served.per_speculating * 1e3,
            "pass_scale": {str(b): v for b, v in sorted(served.pass_scale.items())}},
    )
    return result


# -- validation -----------------------------------------------------------------------------------
def served_policy(n: int, policies: Mapping[str, Any], limit: int | None = None) -> str:
    """What ``serve --k auto --max-batch N`` runs, as a predicted policy: the plan's picks with each
    request's own adaptive k alone (N = 1), the goodput policy on a batch (N > 1, where the server
    reads the batch profile), and plain batching past the speculating ``limit``
    (:mod:`draftwise.policy.batch_limit`; an approximation: the server still speculates in the
    passes of up to ``limit`` sequences as the load starts and drains). The validation compares
    the server with this policy, never with one it does not run."""
    if n > 1 and limit is not None and n > limit and "plain" in policies:
        return "plain"
    return "goodput" if n > 1 and "goodput" in policies else "plan"


def compare_measured(result: Mapping[str, Any], measured: Mapping[int, Mapping[str, float]],
                     policy: str = "served", per_request: Mapping[int, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """Score predictions against a load test: ``measured[N]`` holds ``plain`` and ``auto``
    aggregate tokens/s (``auto``: the server's speculation, predicted by ``policy``; ``served``:
    :func:`served_policy`), and ``per_request[N]`` the same phases' mean per-request tokens/s where
    measured. Per N and phase the relative error; the aggregate errors' median and max; the
    measured crossover (the smallest N where ``auto`` measures below plain) against the predicted
    one. Past the speculating limit the ``served`` server steps plain, so those N are scored as
    plain batching and left out of the measured crossover (``plain_past_limit``): there the two
    phases are plain against plain. ``result`` must predict the requests the load test sent
    (its measurements' ``workload``)."""
    by_n = {row["n"]: row for row in result["rows"]}
    if policy != "served" and policy not in result["policies"]:
        raise ConfigError(f"unknown policy {policy!r}; the prediction has {', '.join(result['policies'])}")
    rows, errors, past_limit = [], [], []
    for n in sorted(measured):
        if n not in by_n:
            raise ConfigError(f"N={n} was measured but not predicted (predicted: {sorted(by_n)})")
        name_auto = served_policy(n, result["policies"], result.get("speculating_limit")) if policy == "served" else policy
        if policy == "served" and name_auto == "plain":
            past_limit.append(n)
        for phase, name in (("plain", "plain"), ("auto", name_auto)):
            if phase not in measured[n]:
                continue
            pred = by_n[n]["policies"][name]
            got = float(measured[n][phase])
            err = pred["aggregate_tps"] / got - 1 if got > 0 else float("inf")
            lo, hi = pred["aggregate_interval"]
            row = {"n": n, "phase": phase, "policy": name, "predicted_tps": pred["aggregate_tps"],
                   "interval": [lo, hi], "measured_tps": got, "error": err, "inside": lo <= got <= hi}
            one = (per_request or {}).get(n, {}).get(phase)
            if one:
                row.update(predicted_per_request=pred["per_request_tps"], measured_per_request=float(one),
                           per_request_error=pred["per_request_tps"] / float(one) - 1)
            rows.append(row)
            errors.append(abs(err))
    speculative = [n for n in sorted(measured) if "auto" in measured[n] and "plain" in measured[n] and n not in past_limit]
    measured_cross = next((n for n in speculative if measured[n]["auto"] < measured[n]["plain"]), None)
    grid = list(result["concurrency"])
    pred_cross = result.get("crossover")

    def step(n: int | None) -> int:
        return len(grid) if n is None else grid.index(n)

    return {
        "policy": policy, "rows": rows, "plain_past_limit": past_limit,
        "speculating_limit": result.get("speculating_limit"),
        "median_error": statistics.median(errors) if errors else None,
        "max_error": max(errors) if errors else None,
        "measured_crossover": measured_cross, "predicted_crossover": pred_cross,
        "crossover_within_one_step": abs(step(measured_cross) - step(pred_cross)) <= 1,
        "goals": {"median_within_10pct": bool(errors) and statistics.median(errors) <= 0.10,
                  "max_within_20pct": bool(errors) and max(errors) <= 0.20},
    }


def load_units(workload: Sequence[Sequence[Mapping[str, Any]]]) -> list[list[Request]]:
    """A load test's ``workload`` (units of turns) as the simulation's units.

    >>> load_units([[{"category": "qa", "prompt_tokens": 40, "new_tokens": 128}]])
    [[('qa', 40, 128)]]
    """
    return [[(str(t["category"]), int(t["prompt_tokens"]), int(t["new_tokens"])) for t in unit] for unit in workload]


def score_load(model: Any, plan: Any, batch_profile: BatchProfile, profile: Profile, raw: Mapping[str, Any],
               policy: str = "served", limit: int | None = None, served: ServedProfile | None = None) -> dict[str, Any]:
    """A load test's measurements (``measured.json``, as
    :func:`draftwise.server.validate.measure_concurrency` writes it) scored against the prediction
    of the very requests it sent: its units, each turn's prompt with its history and its answer's
    length, shared among the clients as it shared them (``units_per_phase``, else R a client);
    the plan's acceptance (:func:`compare_measured`). ``limit``: the speculating limit the servers
    read (``concurrency.json``'s, from the plan's own workload, not from these requests), so that
    past it the speculative phase is scored as the plain batching it ran."""
    if not raw.get("workload"):
        raise ConfigError("the measurements do not say which requests were sent (no 'workload'): measure "
                          "again with `draftwise plan --concurrency ... --validate`")
    measured = {int(n): v for n, v in raw["measured"].items()}
    per_request = {int(n): v for n, v in (raw.get("per_request") or {}).items()}
    per_phase = raw.get("units_per_phase")  # absent before every N sent the same units
    prediction = concurrency_plan(model, plan, batch_profile, profile, sorted(measured),
                                  requests_per_client=int(raw["requests_per_client"]), units=load_units(raw["workload"]),
                                  per_phase=int(per_phase) if per_phase is not None else None, served=served)
    prediction["speculating_limit"] = limit
    out = compare_measured(prediction, measured, policy, per_request)
    out.update(equal=raw.get("equal"), workload=prediction["workload"], max_tokens=raw.get("max_tokens"),
               units_per_phase=prediction["units_per_phase"], requests_per_client=prediction["requests_per_client"],
               prediction={"rows": prediction["rows"], "crossover": prediction["crossover"]})
    return out


#: the load test ``run_concurrency(measure=...)`` runs: ``measure(model, plan_path, concurrency, *,
#: out_dir, measured_path, requests_per_client, max_tokens, status)`` returns what it wrote to
#: ``measured_path`` (:func:`draftwise.server.validate.measure_concurrency`)
Measure = Callable[..., Mapping[str, Any]]
#: the served step ``run_concurrency(serve_profile=...)`` prices with (:mod:`draftwise.cost.served`)
ServeProfile = Callable[..., ServedProfile]


def run_concurrency(
    model: Any, plan: Any, concurrency: str | Sequence[int], *, out_dir: str | Path, profile: Profile,
    batch_profile: BatchProfile | None = None, validate: bool = False, requests_per_client: int = REQUESTS_PER_CLIENT,
    max_new_tokens: int | None = None, plan_path: str | Path | None = None, export: Sequence[str] = (),
    status: Callable[[str], None] | None = None, validate_policy: str = "served", measure: Measure | None = None,
    serve_profile: ServeProfile | None = None,
) -> dict[str, Any]:
    """What ``draftwise plan --concurrency`` runs: the predictions (batch profile resolved or
    measured), ``concurrency.json``, ``concurrency.md`` and ``concurrency.png`` in ``out_dir``,
    one ``schedule-<engine>.txt`` per ``export`` engine that has a per-batch-size table (``hf``
    has none and is skipped), and with ``validate`` the load test ``measure`` at each N
    (``plan_path``: the plan file the servers load; ``measured.json`` and ``load/`` in
    ``out_dir``) scored against the prediction. ``serve_profile(model, batch_profile, profile,
    batches=..., question_ids=..., status=...)`` gives the served step
    (:func:`draftwise.server.served_profile.resolve_served_profile`), measured on the plan's own
    questions; None prices the passes alone."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    concurrency = parse_concurrency(concurrency)
    engines = []
    for engine in export:  # Hugging Face generate runs one request: it has no per-batch table
        name = engine.strip().lower()
        if name not in SCHEDULE_ENGINES and name not in ENGINES:
            raise ConfigError(f"--export {engine!r}: use one of {', '.join(SCHEDULE_ENGINES)}")
        if name in SCHEDULE_ENGINES:
            engines.append(name)
    if validate and plan_path is None:  # these fail before any work
        raise ConfigError("--validate needs the plan's file (the servers load it): pass plan_path")
    traced = int(plan.config.get("max_new_tokens", 128))
    if validate and max_new_tokens not in (None, traced):
        raise ConfigError(f"--validate measures the plan's own workload, answers of up to {traced} tokens a turn, "
                          f"on which its acceptance was measured; max_new_tokens={max_new_tokens} would measure "
                          f"another: leave it out, or make the plan with -n {max_new_tokens}")
    if validate and measure is None:
        raise ConfigError("validate=True needs the load test: pass measure=draftwise.server.validate."
                          "measure_concurrency (the serve extra: pip install 'draftwise[serve]')")
    bp = batch_profile or resolve_batch_profile(model, status=status, batches=tuple(sorted({1, *concurrency})))
    served = None
    if serve_profile is not None:
        served = serve_profile(model, bp, profile, batches=sorted({1, *concurrency}),
                               question_ids=[p.get("question_id") for p in plan.prompts] or None, status=status)
    result = concurrency_plan(model, plan, bp, profile, concurrency, requests_per_client=requests_per_client,
                              max_new_tokens=max_new_tokens, served=served)
    result["speculating_limit"] = limit_of(result) if "goodput" in result["policies"] else None
    if validate and measure is not None:
        write_json_atomic(out / "concurrency.json", result)  # the validation's servers read its limit
        if status is not None:
            status(f"validating: one server at a time at N = {', '.join(map(str, concurrency))}, in this process")
        raw = measure(model, plan_path, concurrency, out_dir=out / "load", measured_path=out / "measured.json",
                      requests_per_client=requests_per_client, max_tokens=traced, status=status)
        if status is not None and (raw.get("errors") or len(set(raw.get("equal") or [0, 0])) > 1):
            status(f"note: {raw['equal'][0]} of {raw['equal'][1]} answers equal to decoding alone, {raw['errors']} "
                   f"errors; see {out / 'load' / 'run.json'}")
        result["validation"] = score_load(model, plan, bp, profile, raw, validate_policy,
                                          limit=result["speculating_limit"], served=served)
    write_json_atomic(out / "concurrency.json", result)
    write_text_atomic(out / "concurrency.md", render_concurrency_markdown(result))
    for engine in engines:
        sched = export_batch_schedule(result, engine, model=model.name)
        write_text_atomic(out / f"schedule-{sched['engine']}.txt", sched["text"] + "\n")
    try:
        plot_concurrency(result, out / "concurrency.png")
    except ImportError as exc:  # matplotlib missing: the tables and JSON still stand
        if status is not None:
            status(str(exc))
    return result
