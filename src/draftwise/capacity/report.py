"""The text and the plot of ``plan --concurrency`` (:mod:`.capacity`): the predictions as Markdown,
throughput against N, and the validation's table. Split from :mod:`.capacity`, which re-exports
these, so that each module stays short."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftwise.plots import pyplot, save_figure


def _iv(x: Sequence[float]) -> str:
    return f"[{x[0]:.2f}-{x[1]:.2f}]"


def _workload_text(w: Mapping[str, Any] | None, where: str = ", on the plan's prompts") -> str:
    if not w:
        return ""
    return (f"{where}: {w['units']} questions, {w['requests']} turns, {w['mean_prompt_tokens']:.0f} "
            f"prompt tokens and {w['mean_answer_tokens']:.0f} answer tokens a turn on average")


def render_concurrency_markdown(result: Mapping[str, Any]) -> str:
    """The predictions as Markdown: one row per N, the crossover, where T stays linear in rows."""
    lines = [
        f"# Speculation at N concurrent requests: {result.get('model', '')}", "",
        f"Predicted for {result['requests_per_client']} questions per client, one after the other, every turn of "
        "a question one request with the earlier answers in its history (as the plan traced them and "
        f"`--validate` sends them){_workload_text(result.get('workload'))}; tokens/s of the "
        "whole server (aggregate) and of one request; [95% interval from the plan's acceptance intervals, "
        "errors treated as correlated; timing noise not included].", "",
        "| N | plain tok/s | best policy | its tok/s | x plain | per-request tok/s (plain -> best) | "
        "goodput x plain | goodput mean k | best fixed k | x plain |",
        "|---:|---:|---|---:|---:|---|---:|---:|---|---:|",
    ]
    for row in result["rows"]:
        p = row["policies"]
        plain, best = p["plain"], p[row["best"]]
        gp = p.get("goodput")
        fixed = p.get(row["best_fixed"]) if row.get("best_fixed") else None
        lines.append(
            f"| {row['n']} | {plain['aggregate_tps']:.1f} | {row['best']} | {best['aggregate_tps']:.1f} "
            f"{_iv(best['aggregate_interval'])} | {best['vs_plain']:.2f}x | {plain['per_request_tps']:.1f} -> "
            f"{best['per_request_tps']:.1f} | "
            + (f"{gp['vs_plain']:.2f}x {_iv(gp['vs_plain_interval'])} | {gp['mean_k']:.2f} | " if gp else "- | - | ")
            + (f"{row['best_fixed']} | {fixed['vs_plain']:.2f}x {_iv(fixed['vs_plain_interval'])} |" if fixed
               else "- | - |")
        )
    cross = result.get("crossover")
    lines += ["", "Crossover: " + (
        f"**N = {cross}** is the smallest N in the grid where the best fixed speculation is predicted "
        "below plain batching." if cross is not None else
        "**none**: at every N in the grid some fixed speculation is predicted at or above plain batching.")]
    limit = result.get("speculating_limit")
    if limit is not None:
        lines += ["", f"Speculating limit: **{limit}** sequences a pass, the largest N up to which the goodput policy's "
                  "interval stays at or above plain batching at its low end; `serve --k auto` with this plan steps "
                  "plain in larger passes."]
    fits = result.get("linear_fit") or {}
    if fits:
        lines += ["", "The batched pass against a straight line in total rows (within 10%):", ""]
        for c, f in fits.items():
            end = ("holds over the whole grid" if f["breaks_at_rows"] is None
                   else f"holds to {f['holds_to_rows']} rows, breaks at {f['breaks_at_rows']}")
            lines.append(f"- context {c}: T = {f['intercept_s'] * 1000:.2f} ms + {f['per_row_s'] * 1000:.3f} ms "
                         f"x rows; {end} (worst miss over the grid {f['max_error'] * 100:.0f}%).")
        share = result.get("prompt_share")
        lines.append(f"- a prompt chunk's row (no logits) is priced at {share:.2f} of a verified row (measured)."
                     if share is not None else "- a prompt chunk's row is priced as a verified row (not measured).")
    if result.get("validation"):
        lines += ["", render_validation_markdown(result["validation"])]
    return "\n".join(lines) + "\n"


def plot_concurrency(result: Mapping[str, Any], path: str | Path) -> Path:
    """Aggregate tokens/s against N: plain, each draft's best fixed k and its goodput policy,
    and the goodput policy over all categories (its interval shaded)."""
    plt = pyplot()
    ns = [row["n"] for row in result["rows"]]
    fig, ax = plt.subplots(figsize=(7, 4.2))

    def series(name: str) -> list[float]:
        return [row["policies"][name]["aggregate_tps"] for row in result["rows"]]

    ax.plot(ns, series("plain"), "o-", color="#777777", label="plain batching")
    colours = ["#2a7ab9", "#d95f02", "#1b9e77", "#7570b3", "#e7298a"]
    drafts = list(result["rows"][0]["best_fixed_per_draft"])
    for d, colour in zip(drafts, colours * 4):
        best = []
        for row in result["rows"]:
            fixed = [v["aggregate_tps"] for name, v in row["policies"].items()
                     if result["policies"][name][0] == "fixed" and result["policies"][name][1] == d]
            best.append(max(fixed) if fixed else float("nan"))
        ax.plot(ns, best, "s-", color=colour, label=f"{d}, best fixed k")
        if f"goodput:{d}" in result["policies"]:
            ax.plot(ns, series(f"goodput:{d}"), "^--", color=colour, label=f"{d}, goodput k")
    if "goodput" in result["policies"]:
        ax.plot(ns, series("goodput"), "D-", color="black", label="goodput policy")
        lo = [row["policies"]["goodput"]["aggregate_interval"][0] for row in result["rows"]]
        hi = [row["policies"]["goodput"]["aggregate_interval"][1] for row in result["rows"]]
        ax.fill_between(ns, lo, hi, color="black", alpha=0.1)
    measured = (result.get("validation") or {}).get("rows") or []
    if measured:
        ax.plot([m["n"] for m in measured], [m["measured_tps"] for m in measured], "x", color="red",
                markersize=9, label="measured")
    if result.get("crossover") is not None:
        ax.axvline(result["crossover"], color="#bbbbbb", linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("concurrent requests N")
    ax.set_ylabel("aggregate tokens/s (predicted)")
    ax.set_title(f"{result.get('model', '')}: throughput against concurrency")
    ax.legend(fontsize=7)
    return save_figure(fig, path)



def _sent_text(validation: Mapping[str, Any]) -> str:
    """How the load test shared its questions among the clients of each N."""
    if validation.get("units_per_phase"):
        return (f"every N sent the same {validation['units_per_phase']} questions, client i the i-th, "
                "(i + N)-th, ... of them")
    if validation.get("requests_per_client"):
        return f"each N sent N x {validation['requests_per_client']} questions, so each N measured other questions"
    return "the questions each N sent are not recorded"


def render_validation_markdown(validation: Mapping[str, Any]) -> str:
    who = ("the policy the server runs: `plan` at N = 1, `goodput` at N > 1" if validation["policy"] == "served"
           else f"`{validation['policy']}`")
    lines = [f"## Measured (load test, one server per N; the speculative phase predicted by {who})",
             "", "Predicted on the requests the load test sent" + _workload_text(validation.get("workload"), "") + "; "
             + _sent_text(validation) + ".",
             "",
             "| N | phase | predicted tok/s | measured tok/s | error | inside interval | per request: predicted | "
             "measured | error |", "|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in validation["rows"]:
        one = (f"{r['predicted_per_request']:.1f} | {r['measured_per_request']:.1f} | "
               f"{r['per_request_error'] * 100:+.1f}% |" if "per_request_error" in r else "- | - | - |")
        lines.append(f"| {r['n']} | {r['phase']} | {r['predicted_tps']:.1f} {_iv(r['interval'])} | "
                     f"{r['measured_tps']:.1f} | {r['error'] * 100:+.1f}% | {'yes' if r['inside'] else 'no'} | " + one)
    if validation.get("median_error") is not None:
        lines += ["", f"Median |error| {validation['median_error'] * 100:.1f}% (goal <= 10%), max "
                  f"{validation['max_error'] * 100:.1f}% (goal <= 20%). Crossover: measured "
                  f"{validation['measured_crossover'] or 'none'}, predicted {validation['predicted_crossover'] or 'none'}"
                  f" ({'within' if validation['crossover_within_one_step'] else 'not within'} one grid step)."]
        if validation.get("plain_past_limit"):
            ns = ", ".join(map(str, validation["plain_past_limit"]))
            lines[-1] += (f" At N = {ns} the server stepped plain past the speculating limit "
                          f"({validation.get('speculating_limit')}): scored as plain batching, and not counted "
                          "in the measured crossover.")
    return "\n".join(lines)
