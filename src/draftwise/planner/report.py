"""Plans and profiles as markdown, rich tables and PNG plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftwise.cost.profile import Profile
from draftwise.planner.plan import NONE, Candidate, Plan
from draftwise.plots import pyplot, save_figure


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
    """a* as text: ``never`` when no acceptance makes this (draft, k) pay; ``-`` for the
    adaptive k, whose k (and so its a*) changes step by step."""
    if c.k == "auto":
        return "-"
    return "never" if c.breakeven is None else f"{c.breakeven:.2f}"


def setting_text(draft: str, k: Any) -> str:
    """A (draft, k) as a reader types it: ``lookup k=5``, ``lookup k=auto``, ``none``."""
    return "none" if draft == NONE else f"{draft} k={k}"


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
            "recommended": setting_text(d, k),
            "predicted": plan.predicted[cat],
            "interval": plan.intervals.get(cat),
            "drafts": {},
        }
        for name, c in best_per_draft(plan, cat).items():
            row["drafts"][name] = c
        rows.append(row)
    return rows


def render_plan_markdown(plan: Plan) -> str:
    samples = int(plan.config.get("samples", 1))
    traced = "" if plan.greedy or samples <= 1 else f", {samples} sampled continuations per prompt"
    lines = [
        f"Plan for {plan.model} ({plan.dtype}, {'greedy' if plan.greedy else 'sampled'}, "
        f"{plan.config.get('max_new_tokens')} new tokens), {len(plan.prompts)} prompts{traced}, "
        f"{plan.config.get('date', '')}.",
        "",
        "Each draft cell: predicted speedup at its best k (k=auto: the adaptive k) / the acceptance "
        "it achieved (a_eff, the i.i.d. rate with E(a, k) = tokens per speculative step) / the "
        "acceptance it needs to break even at that k (a*). In brackets: the 95% prediction interval "
        f"of the speedup. Candidates are ranked by "
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
    if plan.notes:  # where the continuations disagree, the prediction is a range in practice
        lines += ["Where the speedup depends on the continuation:", ""]
        lines += [f"- {cat}: {note}" for cat, note in plan.notes.items()] + [""]
    if fit := plan.config.get("loop_fit"):
        lines += [loop_fit_text(fit), ""]
    if plan.config.get("timing_df"):
        lines += [f"The intervals hold the timing noise of a measured speedup: one unit's, from the plan's own "
                  f"runs beside plain decoding's, {100 * plan.config['timing_sd']:.1f}% (standard deviation of its "
                  f"log), shrinking with the units measured.", ""]
    if plan.validation:
        lines += render_validation_markdown(plan.validation).splitlines() + [""]
    cmd = plan.config.get("command")
    if cmd:
        lines += [f"Command: `{cmd}`", ""]
    return "\n".join(lines)


def loop_fit_text(fit: dict[str, Any]) -> str:
    """One sentence: the factors the plan fitted its profile with (:mod:`draftwise.cost.loop_fit`).

    >>> loop_fit_text({"plain": 0.97, "verify": 1.21, "drafts": {"suffix+eagle:default": 1.4}})
    "Priced as the decode loop ran during the plan (the profile's costs times: one-row steps 0.97, a step's extra rows 1.21, suffix+eagle:default's proposals 1.40)."
    """
    parts = [f"one-row steps {fit['plain']:.2f}", f"a step's extra rows {fit['verify']:.2f}"]
    parts += [f"{d}'s proposals {v:.2f}" for d, v in (fit.get("drafts") or {}).items()]
    return f"Priced as the decode loop ran during the plan (the profile's costs times: {', '.join(parts)})."


def render_validation_markdown(validation: dict[str, Any]) -> str:
    """The checks as a table (with the validation's own noise when it ran 2 or more repeats)
    and :func:`validation_summary` under it."""
    noisy = validation.get("median_noise") is not None
    split = any("acceptance_error" in c for c in validation["checks"])
    lines = [
        "| category | draft | k | predicted [95% interval] | measured | error | inside |"
        + (" noise |" if noisy else "") + (" tokens/pass predicted, measured | from acceptance | from price |" if split else ""),
        "|---|---|---:|---:|---:|---:|:-:|" + ("---:|" if noisy else "") + ("---:|---:|---:|" if split else ""),
    ]
    for c in validation["checks"]:
        k = "-" if c["k"] is None else c["k"]
        line = (f"| {c['category']} | {c['draft']} | {k} | {c['predicted']:.2f}x{interval_text(c.get('interval'))} | "
                f"{c['measured']:.2f}x | {100 * c['error']:.1f}% | {inside_text(c)} |")
        if noisy:
            line += f" {noise_text(c)} |"
        if split:
            line += (f" {c['mat_predicted']:.2f}, {c['mat_measured']:.2f} | {100 * c['acceptance_error']:+.1f}% | "
                     f"{100 * c['price_error']:+.1f}% |" if "acceptance_error" in c else " - | - | - |")
        lines.append(line)
    lines += ["", validation_summary(validation) + "."]
    seeds = validation.get("seeds")
    if seeds:
        lines += ["", f"Each prompt measured with {seeds} seed{'s' if seeds > 1 else ''} none of which the plan "
                  f"traced (each (prompt, seed) one unit of the mean tokens/s), best of {validation.get('repeats', 1)} "
                  "repeats." + (" Noise: the same speedup from repeat round 1 alone against round 2 alone, "
                                "|s1 - s2| / mean; an error well above it is the plan's." if noisy else "")
                  + (" The error's two factors (predicted over measured, minus 1; they multiply to the whole): "
                     "tokens committed per target pass, and the rest, what each pass cost against plain "
                     "decoding's." if split else "")]
    for note in validation.get("notes") or ():
        lines += ["", f"Note: {note}."]
    return "\n".join(lines)


def inside_text(check: dict[str, Any]) -> str:
    inside = check.get("inside")
    return "-" if inside is None else ("yes" if inside else "no")


def noise_text(check: dict[str, Any]) -> str:
    """A check's measurement noise (round 1 against round 2) as a percentage, ``-`` without."""
    noise = check.get("noise")
    return "-" if noise is None else f"{100 * noise:.1f}%"


#: how the summary names the pricing checks of plain decoding (the rest are "DRAFT k=K")
PRICING_LABELS = {"plain": "plain decoding", "plain (validation)": "plain decoding at validation"}


def validation_summary(validation: dict[str, Any]) -> str:
    """One line: the errors, the share of categories inside their interval, the intervals'
    median width and the categories that lost to plain decoding, with the goals; and the
    validation's own noise."""
    goals = {"median": 0.10, "max": 0.20, **(validation.get("goals") or {})}
    text = (f"Median absolute error {100 * validation['median_abs_error']:.1f}% (goal <= {100 * goals['median']:.0f}%), "
            f"max {100 * validation['max_abs_error']:.1f}% (goal <= {100 * goals['max']:.0f}%)")
    noise = validation.get("median_noise")
    if noise is not None:
        text += f", against the measurement's own noise of {100 * noise:.1f}% (median, round 1 vs round 2)"
    share = validation.get("inside_share")
    if share is not None:
        text += f"; {100 * share:.0f}% of categories measured inside their 95% interval (goal >= 80%)"
    width = validation.get("median_width")
    if width is not None:
        goal = goals.get("width", 0.40)  # None: no goal (a greedy plan's); absent in older files: 0.40
        text += f"; median interval width {width:.2f}" + (f" (goal <= {goal:.2f})" if goal else "")
    below = validation.get("below_097")
    if below is not None:
        text += ("; no category's recommendation measured below 0.97x plain" if not below else
                 f"; {len(below)} categor{'y' if len(below) == 1 else 'ies'} measured below 0.97x plain "
                 f"(goal: none): {', '.join(below)}")
    pricing = validation.get("pricing") or {}
    if pricing:
        text += ". Measured over the profile's price (median over prompts): " + ", ".join(
            f"{PRICING_LABELS.get(run, run)} {ratio:.2f}" for run, ratio in pricing.items())
    return text


def plot_plan(plan: Plan, path: str | Path) -> Path:
    """Predicted speedup against k for each draft, one panel per category; the adaptive k
    (a candidate with k "auto") is a dotted level in its draft's colour."""
    plt = pyplot()
    cats = list(plan.categories)
    cols = min(4, len(cats))
    rows = (len(cats) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for ax, cat in zip(axes.flat, cats):
        for d in plan.drafts:
            mine = [c for c in plan.categories[cat] if c.draft == d]
            pts = sorted((c.k, c.speedup, c.interval) for c in mine if c.k != "auto")
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=d)
            color = line[0].get_color()
            if pts and all(p[2] for p in pts):  # the 95% prediction interval as a band
                ax.fill_between([p[0] for p in pts], [p[2][0] for p in pts], [p[2][1] for p in pts],
                                color=color, alpha=0.15, lw=0)
            for c in mine:
                if c.k == "auto":
                    ax.axhline(c.speedup, color=color, lw=1.2, ls=":", label=f"{d} k=auto")
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


def measured_by_unit(validation: dict[str, Any], category: str) -> list[float]:
    """Each unit's measured speedup (best method tokens/s over best plain tokens/s, one unit: a
    prompt and a seed) of ``category``'s recommendation, from ``validate_plan``'s ``units``."""
    return [max(u["method"]) / max(u["plain"]) for u in validation.get("units") or ()
            if u["category"] == category and u["recommended"]]


def plot_samples(plan: Plan, path: str | Path, validation: dict[str, Any] | None = None) -> Path:
    """Each category's pick: its per-unit predicted speedups (a unit: a prompt and one sampled
    continuation; one per prompt when greedy) as dots against its 95% interval as a bar, the
    prediction as a tick and, with a ``validation``, each unit's measured speedup and the
    category's measured speedup (Spec-Bench's mean tokens/s over plain's). A category routed to
    plain decoding shows only the 1.00x line."""
    plt = pyplot()
    cats = [c for c in plan.categories if c != "overall"]
    checks = {x["category"]: x for x in (validation or {}).get("checks", ())}
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(cats) + 2), 4.2))
    ticks = []
    for i, cat in enumerate(cats):
        d, k = plan.recommended[cat]
        ticks.append(f"{cat}\n{setting_text(d, k)}")
        if d == NONE:
            continue
        lo, hi = plan.intervals.get(cat) or [plan.predicted[cat]] * 2
        ax.plot([i, i], [lo, hi], color="tab:blue", lw=7, alpha=0.25, solid_capstyle="butt",
                label=None if "95% interval" in _labels(ax) else "95% interval")
        ax.plot([i - 0.25, i + 0.25], [plan.predicted[cat]] * 2, color="tab:blue", lw=1.5,
                label=None if "predicted" in _labels(ax) else "predicted")
        cand = plan.candidate(cat, d, k)
        samples = (cand.samples if cand is not None else None) or []
        if samples:
            ax.scatter(_spread(i - 0.12, len(samples)), samples, s=12, color="tab:blue", zorder=3,
                       label=None if "predicted, per unit" in _labels(ax) else "predicted, per unit")
        measured = measured_by_unit(validation, cat) if validation else []
        if measured:
            ax.scatter(_spread(i + 0.12, len(measured)), measured, s=16, marker="x", color="tab:red", zorder=3,
                       label=None if "measured, per unit" in _labels(ax) else "measured, per unit")
        if cat in checks:
            ax.scatter([i + 0.12], [checks[cat]["measured"]], s=60, marker="D", facecolor="none",
                       edgecolor="tab:red", zorder=4, label=None if "measured" in _labels(ax) else "measured")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(ticks, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain decoding")
    samples = int(plan.config.get("samples", 1))
    unit = "prompt" if plan.greedy or samples <= 1 else f"prompt x continuation ({samples} per prompt)"
    ax.set_title(f"{plan.model}: each category's pick, per {unit}", fontsize=9)
    if _labels(ax):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def _labels(ax: Any) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def _spread(x: float, n: int, width: float = 0.16) -> list[float]:
    """``n`` x positions around ``x`` (dots side by side rather than on top of each other)."""
    if n == 1:
        return [x]
    return [x - width / 2 + width * j / (n - 1) for j in range(n)]


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
