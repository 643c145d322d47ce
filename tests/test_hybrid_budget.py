"""benchmarks/hybrid_budget.py: a draft's time a pass, from a bench's answers files."""

from __future__ import annotations

import json

import pytest

from .benchmark_scripts import load_benchmark

hb = load_benchmark("hybrid_budget")


def _answers(path, turns):
    """An answers file of one question whose turns have these (passes, verify s, draft s, wall s, tokens)."""
    stats = [{"target_passes": p, "verify_seconds": v, "draft_seconds": d, "proposed": 2 * p} for p, v, d, _, _ in turns]
    choice = {"wall_time": [w for *_, w, _ in turns], "new_tokens": [n for *_, n in turns], "stats": stats}
    path.write_text(json.dumps({"question_id": 1, "choices": [choice]}) + "\n")


def test_totals_sum_every_turn_and_a_free_draft_only_removes_drafting(tmp_path):
    _answers(tmp_path / "base.jsonl", [(60, 4.2, 0.0, 4.5, 120), (40, 2.8, 0.0, 3.0, 80)])
    _answers(tmp_path / "hyb.jsonl", [(50, 3.9, 0.3, 4.3, 120), (30, 2.1, 0.2, 2.6, 80)])
    base, method = hb.totals(tmp_path / "base.jsonl"), hb.totals(tmp_path / "hyb.jsonl")
    assert (base["passes"], base["wall_s"], base["tokens"], method["draft_s"]) == (100, 7.5, 200, pytest.approx(0.5))
    r = hb.budget(base, method, 1.15)
    assert r["measured"] == pytest.approx(7.5 / 6.9)
    assert r["free_draft"] == pytest.approx(7.5 / 6.4)  # the same passes, 0.5 s less
    assert r["passes_needed"] * (6.9 / 80) * 1.15 == pytest.approx(7.5)  # at the measured cost a pass
    assert r["mat_needed"] == pytest.approx(200 / r["passes_needed"]) and r["mat"] == pytest.approx(2.5)


def test_a_file_without_passes_is_refused(tmp_path):
    _answers(tmp_path / "none.jsonl", [(0, 0.0, 0.0, 0.1, 0)])
    with pytest.raises(SystemExit, match="no passes"):
        hb.totals(tmp_path / "none.jsonl")


def test_a_method_the_run_did_not_have_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "answers").mkdir()
    _answers(tmp_path / "answers" / "suffix.jsonl", [(10, 0.7, 0.0, 0.8, 20)])
    monkeypatch.setattr("sys.argv", ["hybrid_budget.py", "--bench", str(tmp_path), "--method", "lookup"])
    with pytest.raises(SystemExit, match="lookup"):
        hb.main()


def test_head_vocab_resizes_the_shipped_rows_by_frequency():
    hv = load_benchmark("head_vocab")
    rank = [5, 7, 9, 2, 1, 3]  # every id, most frequent first
    assert hv.resized([2, 5, 9], rank, 2) == [5, 9]  # narrower: the shipped rows' most frequent
    assert hv.resized([2, 5, 9], rank, 3) == [2, 5, 9]
    assert hv.resized([2, 5, 9], rank, 5) == [1, 2, 5, 7, 9]  # wider: all of them, then the next others
