"""The defaults that win and the tables a newcomer reads (issue 30, items 4 and 6).

No model loads here: plans and bench answers are built by hand, so each number is known.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from draftwise.bench.report import render_markdown
from draftwise.bench.summary import summarise
from draftwise.cli.demo import breakeven_table, measured_table, picks_table
from draftwise.cli.plan import plan_table
from draftwise.planner.defaults import DEFAULT_DRAFTS, HEAD_DRAFT, default_drafts, head_draft
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.eagle.drafter import SHIPPED_HEADS
from draftwise.drafters.spec import DraftSpec
from draftwise.questions import Question

CATEGORIES = ["writing", "math_reasoning", "summarization", "overall"]


def _plan(drafts: list[str]) -> Plan:
    """Every draft at k = 1..8 in every category; the last draft wins everywhere but in
    summarization, where nothing beats plain decoding."""
    cats: dict[str, list[Candidate]] = {}
    for cat in CATEGORIES:
        cands = [
            Candidate(d, k, speedup=(0.8 if cat == "summarization" else 1.0 + 0.1 * j + 0.01 * k),
                      mat=1.5, acceptance=0.4, effective_acceptance=0.55, breakeven=None if k == 1 else 0.3,
                      interval=[0.7, 2.45])
            for j, d in enumerate(drafts) for k in range(1, 9)
        ]
        cats[cat] = sorted(cands, key=lambda c: -c.speedup)
    recommended = {c: ("none", 0) if c == "summarization" else (drafts[-1], 8) for c in CATEGORIES}
    predicted = {c: 1.0 if c == "summarization" else cats[c][0].speedup for c in CATEGORIES}
    return Plan(model="SmolLM2-135M-Instruct.Q4_1", fingerprint="x", dtype="float32", greedy=True,
                drafts=drafts, ks=list(range(1, 9)), categories=cats, recommended=recommended,
                predicted=predicted, routed_overall=1.23, intervals={c: [0.9, 1.5] for c in CATEGORIES},
                routed_interval=[1.1, 1.4])


def _rendered(table: Any) -> str:
    console = Console(width=80, record=True, force_terminal=False)
    console.print(table)
    return console.export_text()


def _assert_fits(text: str, names: list[str]) -> None:
    """Every line within 80 columns, nothing cut to an ellipsis, every name whole."""
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    for name in names:
        assert re.search(rf"(?<![\w:+]){re.escape(name)}(?![\w:+])", text), (name, text)


DRAFTS = ["lookup", "suffix", "suffix+eagle:default"]


def test_default_drafts_are_the_measured_winners_and_the_hybrid_in_greedy_plans_with_a_head(tmp_path):
    assert DEFAULT_DRAFTS == ("lookup", "suffix") and "self" not in DEFAULT_DRAFTS
    assert str(DraftSpec.parse(HEAD_DRAFT)) == HEAD_DRAFT  # canonical, as a plan keys drafts
    shipped = next(p for p in SHIPPED_HEADS.iterdir() if (p / "eagle_head.safetensors").is_file())
    with_head = SimpleNamespace(folder=tmp_path / shipped.name)
    # with the ShareGPT head the hybrid's pick beat the copy drafts on unseen questions: planned greedy
    assert default_drafts(with_head) == [*DEFAULT_DRAFTS, HEAD_DRAFT] and head_draft(with_head) == HEAD_DRAFT
    assert default_drafts(with_head, temperature=0.0) == [*DEFAULT_DRAFTS, HEAD_DRAFT]
    # sampled plans trace every distribution-proposing draft once per continuation: copy drafts only
    assert default_drafts(with_head, temperature=0.7) == list(DEFAULT_DRAFTS)
    other = SimpleNamespace(folder=tmp_path / "some-other-model")
    assert default_drafts(other) == default_drafts(other, temperature=0.7) == list(DEFAULT_DRAFTS)
    assert head_draft(other) is None


def test_plan_passes_its_temperature_to_the_default_drafts(tiny_chat_folder, tmp_path, monkeypatch):
    """A sampled plan without --drafts must not pick up the greedy-only hybrid."""
    from typer.testing import CliRunner

    import draftwise.cli.plan as plan_cli
    from draftwise.cli import app

    class Stop(Exception):
        pass

    seen: list[float] = []

    def recording(model: Any, temperature: float = 0.0) -> list[str]:
        seen.append(temperature)
        raise Stop  # what the plan does with the list is tested elsewhere

    monkeypatch.setattr(plan_cli, "default_drafts", recording)
    prompts = tmp_path / "p.txt"
    prompts.write_text("What is 2 + 2?\n")
    for temperature in ("0.7", "0"):
        r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tiny_chat_folder),
                                     "--temperature", temperature, "-n", "4"])
        assert isinstance(r.exception, Stop), r.output
    assert seen == [0.7, 0.0]


def test_plan_table_fits_80_columns_with_one_row_per_category_and_draft():
    text = _rendered(plan_table(_plan(DRAFTS)))
    _assert_fits(text, DRAFTS + CATEGORIES)
    rows = [line for line in text.splitlines() if re.match(r"\W*(lookup|suffix|none)", line)]
    assert len(rows) == len(CATEGORIES) * len(DRAFTS) + 1  # + "none (plain)" where nothing pays
    picked = [line for line in rows if "<-" in line]
    assert len(picked) == len(CATEGORIES)
    assert sum("none (plain)" in line for line in picked) == 1
    assert all("suffix+eagle:default" in line and " 8 " in line for line in picked if "none" not in line)
    assert "never" in text  # a* where no acceptance pays (k = 1 here)


def test_demo_tables_fit_80_columns_and_keep_break_even_next_to_the_result():
    plan = _plan(DRAFTS)
    picks = _rendered(picks_table(plan))
    _assert_fits(picks, CATEGORIES + ["suffix+eagle:default k=8"])
    breakeven = _rendered(breakeven_table(plan))
    _assert_fits(breakeven, DRAFTS)
    line = next(x for x in breakeven.splitlines() if "suffix+eagle:default" in x)
    assert "0.30" in line and "0.55" in line  # needs a*, achieved a_eff: side by side


def _answers(seconds: dict[str, list[float]], tokens: list[int]) -> dict[str, dict[str, Any]]:
    """One single-turn answer per question for each method, with the stats of a plain pass."""
    return {
        m: {str(i): {"choices": [{"index": 0, "turns": ["x"], "new_tokens": [n], "wall_time": [s],
                                  "stats": [{"committed": n, "target_passes": n, "proposed": 0, "accepted": 0}]}]}
            for i, (n, s) in enumerate(zip(tokens, secs))}
        for m, secs in seconds.items()
    }


def test_the_two_speedups_differ_as_documented():
    """A short answer that speeds up a lot and a long one that does not: Spec-Bench's mean of
    tokens/s weighs them alike, the ratio of total times by their length."""
    qs = [Question(0, "qa", ("a",)), Question(1, "qa", ("b",))]
    tokens = [10, 100]
    seconds = {"none": [1.0, 10.0], "lookup@k=4": [0.25, 10.0]}  # 4x on the short one, 1x on the long
    groups, _, _ = summarise(_answers(seconds, tokens), qs, list(seconds))
    row = groups["overall"]["lookup@k=4"]
    assert row["speedup"] == pytest.approx((40 + 10) / 2 / 10)  # mean of 40 and 10 tok/s, over 10
    assert row["speedup_total_time"] == pytest.approx(11.0 / 10.25)  # none's total time over lookup's
    assert row["new_tokens"] == 110 and row["wall_s"] == pytest.approx(10.25)
    assert groups["overall"]["none"]["speedup_total_time"] == pytest.approx(1.0)


def _summary() -> dict[str, Any]:
    qs = [Question(i, c, ("q",)) for i, c in enumerate(["writing", "math_reasoning", "qa"])]
    methods = ["none", "lookup@k=5", "suffix@k=6", "suffix+eagle:default@k=3", "auto"]
    seconds = {m: [1.0 / (1 + 0.2 * j)] * 3 for j, m in enumerate(methods)}
    groups, by_position, complete = summarise(_answers(seconds, [50, 60, 70]), qs, methods)
    return {
        "groups": groups, "acceptance_by_position": by_position,
        "equality": {"checked": True, "mismatches": [],
                     "methods": {m: {"equal": 3, "total": 3} for m in methods[1:]}},
        "config": {"model": "m", "dtype": "float32", "temperature": 0.0, "max_new_tokens": 128, "k": 4,
                   "date": "today", "command": "draftwise demo", "methods": methods,
                   "drafts": {m: {"spec": m.split("@")[0], "k": int(m.split("=")[1]) if "=" in m else 4}
                              for m in methods}},
        "run": {"questions_total": 3, "questions_finished": len(complete), "stopped": None, "skipped": []},
    }


def test_summary_md_labels_both_speedups():
    md = render_markdown(_summary())
    assert "| speedup (mean tok/s) | speedup (total time) |" in md
    assert "Spec-Bench's" in md and "what a user waiting for every answer sees" in md
    overall = md.split("## overall")[1]
    assert "| suffix@k=6 | 84.0 | 1.40x | 1.40x |" in overall  # equal lengths: the two agree


def test_summary_md_of_an_older_run_without_the_total_time_speedup_still_renders():
    summary = _summary()
    for table in summary["groups"].values():
        for row in table.values():
            del row["speedup_total_time"]
    assert "| lookup@k=5 | 72.0 | 1.20x | - |" in render_markdown(summary)


def test_demo_measured_table_fits_80_columns_and_labels_both_speedups():
    text = _rendered(measured_table(_summary()))
    _assert_fits(text, ["none", "lookup", "suffix", "suffix+eagle:default", "auto"])
    assert "mean tok/s" in text and "total time" in text
    line = next(x for x in text.splitlines() if "suffix+eagle:default" in x)
    assert re.search(r"\b3\b.*1\.60x.*1\.60x.*3/3", line), line


def test_plan_and_demo_default_to_the_shared_list():
    """No second copy of the list: the commands read it from draftwise.planner.defaults."""
    cli = Path(__file__).resolve().parents[1] / "src" / "draftwise" / "cli"
    for name in ("plan.py", "demo.py", "bench.py"):
        source = (cli / name).read_text()
        assert "DEFAULT_DRAFTS" in source or "default_drafts(" in source, name
        assert '"lookup,self"' not in source and '"self"]' not in source, name


# -- the commands on the tiny random model (no head ships for it) -----------------------------
def test_plan_without_drafts_plans_the_defaults_and_its_table_fits_80_columns(tiny_chat_folder, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from draftwise.cli import app

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "80")
    prompts = tmp_path / "p.txt"
    prompts.write_text("Repeat after me: the cat sat on the mat.\nWhat is 2 + 2?\n")
    prof = tmp_path / "prof.json"  # the tiny model's context is too short for a measured default profile
    r = CliRunner().invoke(app, ["profile", "--model", str(tiny_chat_folder), "--draft", ",".join(DEFAULT_DRAFTS),
                                 "--max-n", "5", "--contexts", "16,64", "--repeats", "1", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tiny_chat_folder), "--profile",
                                 str(prof), "--ks", "1-3", "-n", "6", "--out", str(tmp_path / "plan")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["drafts"] == list(DEFAULT_DRAFTS)
    _assert_fits(r.stdout, list(DEFAULT_DRAFTS))


def test_demo_runs_the_defaults_and_prints_within_80_columns(tiny_chat_folder, one_thread, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from draftwise.cli import app

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "80")
    r = CliRunner().invoke(app, ["demo", "--model", str(tiny_chat_folder), "--num-questions", "2", "-n", "3",
                                 "--out", str(tmp_path / "demo")])
    assert r.exit_code == 0, r.output
    _assert_fits(r.stdout, [*DEFAULT_DRAFTS, "auto", "none"])
    assert "mean tok/s" in r.stdout and "total time" in r.stdout and "break-even" in r.stdout
    bench = json.loads((tmp_path / "demo" / "demo.json").read_text())["bench"]
    assert [m.split("@")[0] for m in bench["config"]["methods"]] == ["none", *DEFAULT_DRAFTS, "auto"]
    assert "speedup (total time)" in (tmp_path / "demo" / "bench" / "summary.md").read_text()
