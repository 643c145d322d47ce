"""Reports of sampled plans (issue 28, items 4-6): k "auto" wherever a k is shown, the plan's
notes on wide spreads, the per-unit plot, and the validation's noise, width and losses."""

from __future__ import annotations

import pytest
from rich.console import Console

from draftwise.cli.demo import breakeven_table, picks_table
from draftwise.planner import report
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.planner.report import (
    breakeven_text, plan_rows, plot_plan, plot_samples, render_plan_markdown, render_validation_markdown,
    validation_summary,
)

from .images import is_complete_png


def _cand(draft, k, speedup, samples=None, breakeven=0.2):
    return Candidate(draft=draft, k=k, speedup=speedup, mat=2.0, acceptance=0.6, effective_acceptance=0.6,
                     breakeven=breakeven, interval=[speedup - 0.3, speedup + 0.2], samples=samples)


LOOKUP_AUTO = [1.1, 2.9, 4.7, 1.4]


def sample_plan() -> Plan:
    """extraction -> lookup k=auto, rag -> suffix k=3, writing -> plain decoding."""
    cats = {
        "extraction": [_cand("lookup", "auto", 2.5, LOOKUP_AUTO, breakeven=None), _cand("lookup", 4, 2.2),
                       _cand("suffix", 3, 1.6)],
        "rag": [_cand("suffix", 3, 1.3, [1.2, 1.4]), _cand("lookup", "auto", 1.2), _cand("lookup", 4, 1.1)],
        "writing": [_cand("lookup", 4, 0.95), _cand("lookup", "auto", 0.97), _cand("suffix", 3, 0.9)],
        "overall": [_cand("lookup", "auto", 1.5), _cand("lookup", 4, 1.4), _cand("suffix", 3, 1.2)],
    }
    return Plan(
        model="tiny", fingerprint="-", dtype="float32", greedy=False, drafts=["lookup", "suffix"], ks=[3, 4, "auto"],
        categories=cats,
        recommended={"extraction": ("lookup", "auto"), "rag": ("suffix", 3), "writing": ("none", 0),
                     "overall": ("lookup", "auto")},
        predicted={"extraction": 2.5, "rag": 1.3, "writing": 1.0, "overall": 1.5}, routed_overall=1.5,
        intervals={"extraction": [2.2, 2.7], "rag": [1.0, 1.5], "writing": [1.0, 1.0], "overall": [1.2, 1.7]},
        routed_interval=[1.3, 1.7], config={"temperature": 0.7, "max_new_tokens": 96, "samples": 2, "pick": "low"},
        notes={"extraction": "lookup pays 1.1-4.7x here, depending on the continuation"},
    )


def validation() -> dict:
    def unit(cat, draft, k, plain, method, rec=True):
        return {"question_id": 1, "category": cat, "seed": 10_000, "setting": f"{draft} k={k}", "draft": draft,
                "k": k, "recommended": rec, "plain": plain, "method": method}

    return {
        "checks": [
            {"category": "extraction", "draft": "lookup", "k": "auto", "predicted": 2.5, "measured": 2.0,
             "error": 0.25, "noise": 0.04, "interval": [2.2, 2.7], "inside": False},
            {"category": "rag", "draft": "suffix", "k": 3, "predicted": 1.3, "measured": 0.9, "error": 0.44,
             "noise": 0.02, "interval": [1.0, 1.5], "inside": False},
            {"category": "overall (routed)", "draft": "per category", "k": None, "predicted": 1.5, "measured": 1.4,
             "error": 0.07, "noise": None, "interval": [1.3, 1.7], "inside": True},
        ],
        "median_abs_error": 0.25, "max_abs_error": 0.44, "inside_share": 0.0, "median_noise": 0.03,
        "median_width": 0.5, "below_097": ["rag"], "repeats": 2, "seeds": 2, "notes": [],
        "units": [unit("extraction", "lookup", "auto", [10.0, 9.0], [30.0, 25.0]),
                  unit("extraction", "lookup", "auto", [10.0, 10.0], [12.0, 11.0]),
                  unit("extraction", "lookup", 4, [10.0, 10.0], [50.0, 50.0], rec=False),
                  unit("rag", "suffix", 3, [20.0, 20.0], [18.0, 17.0])],
    }


def test_k_auto_reads_as_such_and_the_notes_show():
    plan = sample_plan()
    rows = {r["category"]: r for r in plan_rows(plan)}
    assert rows["extraction"]["recommended"] == "lookup k=auto" and rows["writing"]["recommended"] == "none"
    assert breakeven_text(plan.categories["extraction"][0]) == "-"  # a* belongs to a fixed k
    assert breakeven_text(plan.categories["extraction"][1]) == "0.20"
    md = render_plan_markdown(plan)
    assert "| extraction | lookup k=auto | 2.50x [2.20-2.70] |" in md
    assert "2 sampled continuations per prompt" in md
    assert "- extraction: lookup pays 1.1-4.7x here, depending on the continuation" in md
    plan.notes = {}
    assert "depending on the continuation" not in render_plan_markdown(plan)


def test_the_demo_tables_show_k_auto():
    console = Console(width=120, record=True)
    console.print(picks_table(sample_plan()))
    console.print(breakeven_table(sample_plan()))
    text = console.export_text()
    assert "lookup k=auto" in text
    cells = {r[0]: r[1:] for r in ([c.strip() for c in line.strip("│").split("│")] for line in text.splitlines()
                                   if line.startswith("│"))}
    # the draft's best k is the adaptive one: its a* is not a number (it belongs to a fixed k)
    assert cells["lookup"][:2] == ["auto", "-"] and cells["suffix"][:2] == ["3", "0.20"]
    assert cells["extraction"][0] == "lookup k=auto"


def test_the_validation_report_says_its_noise_width_and_losses():
    v = validation()
    md = render_validation_markdown(v)
    assert "| extraction | lookup | auto | 2.50x [2.20-2.70] | 2.00x | 25.0% | no | 4.0% |" in md
    assert "| overall (routed) | per category | - |" in md and md.count("| - |") >= 1
    line = validation_summary(v)
    assert "own noise of 3.0%" in line and "median interval width 0.50 (goal <= 0.40)" in line
    # the width goal is the sampled plan's: a greedy validation states its width without one
    greedy = validation_summary({**v, "goals": {**(v.get("goals") or {}), "width": None}})
    assert "median interval width 0.50;" in greedy and "goal <= 0.40" not in greedy
    assert "1 category measured below 0.97x plain (goal: none): rag" in line
    v.update(below_097=[], median_noise=None)
    assert "no category's recommendation measured below 0.97x plain" in validation_summary(v)
    assert "noise" not in render_validation_markdown(v).splitlines()[0]


def test_plot_samples_draws_each_units_prediction_and_measurement(tmp_path, monkeypatch):
    figures = []
    real = report.save_figure
    monkeypatch.setattr(report, "save_figure", lambda fig, path: (figures.append(fig), real(fig, path))[1])
    plan = sample_plan()
    out = plot_samples(plan, tmp_path / "samples.png", validation())
    assert is_complete_png(out)
    ax = figures[0].axes[0]
    # left of each category's tick: the pick's per-unit predictions; right: what was measured
    left: dict[int, list[float]] = {}
    right: dict[int, list[float]] = {}
    for c in ax.collections:
        for x, y in c.get_offsets():
            (left if x < round(x) else right).setdefault(round(x), []).append(float(y))
    assert sorted(left[0]) == sorted(LOOKUP_AUTO) and sorted(left[1]) == [1.2, 1.4] and 2 not in left
    # each unit's measured speedup (best repeat over best repeat, the recommended setting only)
    # and the category's measured speedup (the check's)
    assert sorted(right[0]) == [pytest.approx(1.2), 2.0, pytest.approx(3.0)]
    assert sorted(right[1]) == [pytest.approx(0.9), 0.9] and 2 not in right
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["extraction\nlookup k=auto", "rag\nsuffix k=3", "writing\nnone"]
    # without a validation, and with a plan from before per-unit samples: the intervals alone
    for c in plan.categories.values():
        for x in c:
            x.samples = None
    assert is_complete_png(plot_samples(plan, tmp_path / "bare.png"))
    assert not figures[-1].axes[0].collections


def test_plot_plan_draws_k_auto_as_a_level(tmp_path, monkeypatch):
    figures = []
    real = report.save_figure
    monkeypatch.setattr(report, "save_figure", lambda fig, path: (figures.append(fig), real(fig, path))[1])
    assert is_complete_png(plot_plan(sample_plan(), tmp_path / "plan.png"))
    extraction = figures[0].axes[0]
    levels = {line.get_label(): line.get_ydata()[0] for line in extraction.get_lines() if "k=auto" in line.get_label()}
    assert levels == {"lookup k=auto": 2.5}
