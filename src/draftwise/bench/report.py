"""What a run leaves for people: ``summary.md`` (one table per group) and two plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftwise.bench.methods import BASELINE, is_peer
from draftwise.bench.runner import SETTLE_CAP
from draftwise.plots import pyplot, save_figure

#: what the two speedups of a bench mean, for every report that shows them
SPEEDUPS_LEGEND = (
    "Two speedups over `none` (draftwise plain decoding) on the same questions. "
    "speedup (mean tok/s) is Spec-Bench's: the mean of each question's tokens/s over the same "
    "mean for `none`; every question weighs alike, so a short answer that copies a lot counts "
    "as much as a long one (it can exceed #MAT). speedup (total time) is all the new tokens "
    "over all the time, over the same for `none`: with the same output (greedy) it is `none`'s "
    "total time over the method's, what a user waiting for every answer sees."
)


def format_value(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or ``-`` when there is none."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _equality_lines(eq: Mapping[str, Any]) -> list[str]:
    if not eq.get("checked"):
        return [f"Equality not checked: {eq.get('reason', '')}."]
    parts = [f"{m}: {c['equal']}/{c['total']}" for m, c in eq["methods"].items()]
    lines = ["Turns equal to `none` token for token: " + (", ".join(parts) or "-") + "."]
    for mm in eq["mismatches"]:
        lines.append(
            f"- q{mm['question_id']} {mm['method']} turn {mm['turn']}: first differs at token "
            f"{mm['position']}, top-2 logit margin {mm['margin']:.4f}"
            + (" (after an earlier mismatch)" if mm["after_earlier_mismatch"] else "")
        )
    return lines


def _batched_lines(batched: Mapping[str, Any]) -> list[str]:
    """The ``bench --batch N`` table: each method's batched phase beside its one-at-a-time row."""
    n = batched["batch"]
    lines = [
        "", f"## Batched: {n} at a time", "",
        f"The {batched['questions']} finished questions again, {n} at a time on the batched engine (all "
        "first turns, then all second turns). aggregate tok/s = all new tokens over the phase's wall "
        "time; per-request tok/s = the mean of each request's tokens over its own seconds; x one at a "
        "time = aggregate over the one-at-a-time row's total tokens over total time; equal = turns "
        "whose tokens equal the one-at-a-time run's.", "",
        "| method | aggregate tok/s | per-request tok/s | one at a time tok/s | x one at a time | equal "
        "| requests | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, row in batched["methods"].items():
        equal = f"{row['equal']}/{row['requests']}" if row["equal"] is not None else "n/a"
        lines.append(
            f"| {m} | {format_value(row['tokens_per_s'], '.1f')} | "
            f"{format_value(row['per_request_tokens_per_s'], '.1f')} | "
            f"{format_value(row['one_at_a_time_tokens_per_s'], '.1f')} | "
            f"{format_value(row['x_one_at_a_time'], '.2f', 'x')} | {equal} | {row['requests']} | "
            f"{row['wall_s']:.2f} |"
        )
    if batched["skipped"] or any(row["mismatches"] for row in batched["methods"].values()):
        lines.append("")
    for m, row in batched["methods"].items():
        if row["mismatches"]:
            turns = ", ".join(f"q{mm['question_id']} turn {mm['turn']}" for mm in row["mismatches"])
            lines.append(f"- {m}: batched output differs from one at a time in {turns}.")
    for m, why in batched["skipped"].items():
        lines.append(f"- {m}: not batched ({why}).")
    return lines


def _noise_lines(noise: Mapping[str, Any]) -> list[str]:
    """The run-to-run noise table: each speedup's 95% interval and median over redraws of the rounds."""
    methods = list(dict.fromkeys(m for rows in noise["groups"].values() for m in rows if m != BASELINE))
    lines = ["", "## Run-to-run noise", "",
             f"Each speedup (mean tok/s) over {noise['draws']} redraws of every turn's rounds, the same rounds "
             "for every method, each keeping its fastest run among them as above: 95% of the draws fall in "
             "the interval (median in brackets). That is how far this host's noise alone moves the speedup "
             "on these questions; other questions would vary more.", "",
             "| group | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for group, rows in noise["groups"].items():
        cells = [f"{rows[m]['low']:.2f}-{rows[m]['high']:.2f}x ({rows[m]['median']:.2f}x)" if m in rows else "n/a"
                 for m in methods]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(summary: Mapping[str, Any]) -> str:
    """``summary.md``: one table per group (methods as rows), the equality line, the command."""
    cfg, run = summary["config"], summary["run"]
    sampling = "greedy" if cfg["temperature"] == 0 else f"temperature {cfg['temperature']}"
    lines = [
        f"# draftwise bench: {cfg['model']} ({cfg['dtype']}), {sampling}, "
        f"up to {cfg['max_new_tokens']} new tokens, k={cfg['k']}",
        "",
        f"{run['questions_finished']} of {run['questions_total']} questions finished"
        + (f" (stopped: {run['stopped']})" if run["stopped"] else "")
        + "; methods interleaved turn by turn"
        + (f", each turn the fastest of {cfg['repeats']} runs, the methods alternating run by run"
           if cfg.get("repeats", 1) > 1 else "")
        + (f" (more rounds of every method, up to {SETTLE_CAP * cfg['repeats']}, until each one's two fastest agreed "
           f"within {cfg['settle']:.0%})"
           if cfg.get("settle") else "")
        + f"; {cfg['date']}.",
        "",
        SPEEDUPS_LEGEND + " #MAT = committed tokens per target pass (bonus included).",
    ]
    if any(is_peer(m) for m in cfg["methods"]):
        lines += ["", "Peers (`hf*`: Hugging Face `generate` on the same weights) are also "
                  "measured against draftwise `none`, not against `hf`."]
    for group, table in summary["groups"].items():
        lines += ["", f"## {group}", "",
                  "| method | tok/s | speedup (mean tok/s) | speedup (total time) | #MAT | acceptance "
                  "| draft share | questions |",
                  "|---|---|---|---|---|---|---|---|"]
        for m, row in table.items():
            lines.append(
                f"| {m} | {format_value(row['tokens_per_s'], '.1f')} | {format_value(row['speedup'], '.2f', 'x')} | "
                f"{format_value(row.get('speedup_total_time'), '.2f', 'x')} | "
                f"{format_value(row['mat'], '.2f')} | {format_value(row['acceptance'], '.2f')} | "
                f"{format_value(row['draft_time_share'], '.2f')} | {row['questions']} |"
            )
    if summary.get("noise"):
        lines += _noise_lines(summary["noise"])
    lines += ["", *_equality_lines(summary["equality"])]
    if summary.get("batched"):
        lines += _batched_lines(summary["batched"])
    if run.get("skipped"):
        lines += ["", "Skipped (too long for the context): "
                  + ", ".join(str(s["question_id"]) for s in run["skipped"]) + "."]
    lines += ["", f"Command: `{cfg['command']}`", ""]
    return "\n".join(lines)


def _speedup_plot(plt: Any, summary: Mapping[str, Any], out_dir: Path) -> bool:
    groups = list(summary["groups"])
    methods = [m for m in summary["config"]["methods"] if m != BASELINE]
    if not groups or not methods:
        return False
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(methods)) ** 0.5), 4))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        ys = [summary["groups"][g].get(m, {}).get("speedup") or 0.0 for g in groups]
        ax.bar([i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))], ys, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel("speedup over plain decoding (mean tok/s)")
    ax.legend(fontsize="small")
    save_figure(fig, out_dir / "speedup.png", dpi=120)
    return True


def _position_plot(plt: Any, summary: Mapping[str, Any], out_dir: Path) -> bool:
    from matplotlib.ticker import MaxNLocator

    positions = summary["acceptance_by_position"]
    if not positions:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, row in positions.items():
        xs = [i + 1 for i, r in enumerate(row["rate"]) if r is not None]
        ys = [r for r in row["rate"] if r is not None]
        ax.plot(xs, ys, marker="o", label=m)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (given earlier positions accepted)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    save_figure(fig, out_dir / "acceptance_by_position.png", dpi=120)
    return True


def write_plots(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """``speedup.png`` (grouped bars per group) and ``acceptance_by_position.png``; returns the
    file names written (none when matplotlib is missing)."""
    try:
        plt = pyplot()
    except ImportError:
        return []
    written = []
    if _speedup_plot(plt, summary, out_dir):
        written.append("speedup.png")
    if _position_plot(plt, summary, out_dir):
        written.append("acceptance_by_position.png")
    return written
