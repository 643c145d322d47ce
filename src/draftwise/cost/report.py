"""Plans and profiles as markdown, rich tables and PNG plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..plots import pyplot, save_figure
from .plan import NONE, Candidate, Plan
from .profile import Profile


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def best_per_draft(plan: Plan, category: str) -> dict[str, Candidate]:
    """Each draft's best k in a category."""
    out: dict[str, Candidate] = {}
    for c in plan.categories[category]:  # sorted best first
        out.setdefault(c.draft, c)
    return out


def interval_text(interval: Sequence[float] | None) -> str:
    """A 95% prediction interval as ``[lo-hi]`` (empty for plans made before intervals)."""
    return "" if not interval else f" [{interval[0]:.2f}-{interval[1]:.2f}]"


def breakeven_text(c: Candidate) -> str:
    """a* as text: ``never`` when no acceptance makes this (draft, k) pay."""
    return "never" if c.breakeven is None else f"{c.breakeven:.2f}"


def draft_cells(row: dict[str, Any], drafts: Sequence[str], fmt: Callable[[Candidate], str]) -> list[str]:
    """One formatted cell per draft of a :func:`plan_rows` row (``-`` where it has none)."""
    return [fmt(row["drafts"][d]) if d in row["drafts"] else "-" for d in drafts]


def plan_rows(plan: Plan) -> list[dict[str, Any]]:
    """One row per category: the recommendation and each draft's best k, a_eff vs a*."""
    rows = []
    for cat in plan.categories:
        d, k = plan.recommended[cat]
        row: dict[str, Any] = {
            "category": cat,
            "recommended": "none" if d == NONE else f"{d} k={k}",
            "predicted": plan.predicted[cat],
            "interval": plan.intervals.get(cat),
            "drafts": {},
        }
        for name, c in best_per_draft(plan, cat).items():
            row["drafts"][name] = c
        rows.append(row)
    return rows


def render_plan_markdown(plan: Plan) -> str:
    lines = [
        f"Plan for {plan.model} ({plan.dtype}, {'greedy' if plan.greedy else 'sampled'}, "
        f"{plan.config.get('max_new_tokens')} new tokens), {len(plan.prompts)} prompts, "
        f"{plan.config.get('date', '')}.",
        "",
        "Each draft cell: predicted speedup at its best k / the acceptance it achieved "
        "(a_eff, the i.i.d. rate with E(a, k) = tokens per speculative step) / the acceptance "
        "it needs to break even at that k (a*). In brackets: the 95% prediction interval of the "
        f"speedup from the binomial acceptance counts. Candidates are ranked by "
        f"{'the low end of the interval' if plan.config.get('pick') == 'low' else 'the prediction'}.",
        "",
        "| category | recommended | predicted | " + " | ".join(plan.drafts) + " |",
        "|---|---|---:|" + "---|" * len(plan.drafts),
    ]
    for row in plan_rows(plan):
        cells = draft_cells(
            row, plan.drafts,
            lambda c: f"{c.speedup:.2f}x{interval_text(c.interval)} @k={c.k} / a_eff {_pct(c.effective_acceptance)} "
                      f"/ a* {breakeven_text(c)}",
        )
        lines.append(f"| {row['category']} | {row['recommended']} | {row['predicted']:.2f}x{interval_text(row['interval'])} | "
                     + " | ".join(cells) + " |")
    lines += ["", f"Predicted overall speedup with each category's recommendation: {plan.routed_overall:.2f}x"
              f"{interval_text(plan.routed_interval)}.", ""]
    if plan.validation:
        lines += render_validation_markdown(plan.validation).splitlines() + [""]
    cmd = plan.config.get("command")
    if cmd:
        lines += [f"Command: `{cmd}`", ""]
    return "\n".join(lines)


def render_validation_markdown(validation: dict[str, Any]) -> str:
    lines = [
        "| category | draft | k | predicted [95% interval] | measured | error | inside |",
        "|---|---|---:|---:|---:|---:|:-:|",
    ]
    for c in validation["checks"]:
        k = "-" if c["k"] is None else c["k"]
        lines.append(
            f"| {c['category']} | {c['draft']} | {k} | {c['predicted']:.2f}x{interval_text(c.get('interval'))} | "
            f"{c['measured']:.2f}x | {100 * c['error']:.1f}% | {inside_text(c)} |"
        )
    lines += ["", validation_summary(validation) + "."]
    return "\n".join(lines)


def inside_text(check: dict[str, Any]) -> str:
    inside = check.get("inside")
    return "-" if inside is None else ("yes" if inside else "no")


def validation_summary(validation: dict[str, Any]) -> str:
    """One line: the errors and the share of categories inside their interval, with the goals."""
    text = (f"Median absolute error {100 * validation['median_abs_error']:.1f}% (goal <= 10%), "
            f"max {100 * validation['max_abs_error']:.1f}% (goal <= 20%)")
    share = validation.get("inside_share")
    if share is not None:
        text += f"; {100 * share:.0f}% of categories measured inside their 95% interval (goal >= 80%)"
    return text


def plot_plan(plan: Plan, path: str | Path) -> Path:
    """Predicted speedup against k for each draft, one panel per category."""
    plt = pyplot()
    cats = list(plan.categories)
    cols = min(4, len(cats))
    rows = (len(cats) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for ax, cat in zip(axes.flat, cats):
        for d in plan.drafts:
            pts = sorted((c.k, c.speedup, c.interval) for c in plan.categories[cat] if c.draft == d)
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=d)
            if all(p[2] for p in pts):  # the 95% prediction interval as a band
                ax.fill_between([p[0] for p in pts], [p[2][0] for p in pts], [p[2][1] for p in pts],
                                color=line[0].get_color(), alpha=0.15, lw=0)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(cat, fontsize=9)
        ax.set_xlabel("k", fontsize=8)
    for ax in axes.flat[len(cats):]:
        ax.axis("off")
    axes[0][0].set_ylabel("predicted speedup")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{plan.model}: predicted speedup over plain decoding (bands: 95% prediction intervals)",
                 fontsize=10)
    return save_figure(fig, path)


def plot_profile(profile: Profile, path: str | Path) -> Path:
    """T(n) and the whole step against n, at each profiled context."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for c in sorted(profile.step):
        n = range(1, len(profile.step[c]) + 1)
        line = ax.plot(n, [1000 * t for t in profile.step[c]], marker="o", ms=3, label=f"step, context {c}")
        ax.plot(n, [1000 * t for t in profile.forward[c]], ls="--", color=line[0].get_color(),
                label=f"T(n) pass only, context {c}")
    ax.set_xlabel("tokens per pass n (= k + 1)")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{profile.model} ({profile.dtype}): cost of one target pass")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
