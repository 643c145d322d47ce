"""benchmarks/auto_vs_best.py: issue 28's greedy clause, and the noise floor, from a bench folder."""

from __future__ import annotations

import json

import pytest

from .benchmark_scripts import load_benchmark

avb = load_benchmark("auto_vs_best")


def _method(folder, name, turns):
    """``name``'s answers file: one question per (category, draft, passes, accept lengths, wall s)."""
    lines = []
    for qid, (category, draft, passes, lengths, wall) in enumerate(turns):
        choice = {"wall_time": [wall], "accept_lengths": [lengths],
                  "stats": [{"draft": draft, "target_passes": passes, "repeat_seconds": [wall, wall * 1.01]}]}
        lines.append(json.dumps({"question_id": qid, "category": category, "choices": [choice]}))
    (folder / "answers" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def _bench(tmp_path, groups):
    (tmp_path / "answers").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"groups": groups}))
    _method(tmp_path, "lookup", [("qa", "lookup", 5, [2, 2, 2, 2, 2], 1.0), ("rag", "lookup", 4, [1, 1, 1, 1], 2.0)])
    _method(tmp_path, "suffix", [("qa", "suffix", 4, [3, 3, 2, 2], 1.2), ("rag", "suffix", 4, [1, 1, 2, 1], 2.0)])
    _method(tmp_path, "auto", [("qa", "suffix", 4, [3, 3, 2, 2], 1.5), ("rag", "lookup", 4, [1, 1, 1, 1], 1.6)])
    return tmp_path


def _row(speedup, total):
    return {"speedup": speedup, "speedup_total_time": total}


def test_the_clause_reads_the_better_peer_in_each_group_and_names_the_misses(tmp_path):
    groups = {"qa": {"lookup": _row(1.5, 1.4), "suffix": _row(1.6, 1.5), "auto": _row(1.56, 1.5)},
              "rag": {"lookup": _row(1.2, 1.2), "suffix": _row(1.0, 1.0), "auto": _row(1.1, 1.1)},
              "overall": {"lookup": _row(1.4, 1.3), "suffix": _row(1.4, 1.35), "auto": _row(1.41, 1.35)}}
    text, fig = avb.report(_bench(tmp_path, groups))
    assert fig["groups"]["qa"]["speedup"] == pytest.approx(1.56 / 1.6)  # 0.975: held
    assert fig["groups"]["rag"]["speedup"] == pytest.approx(1.1 / 1.2)  # lookup was the better one here
    assert fig["missed_groups"] == ["rag"] and fig["overall_held"]
    assert "missed in rag" in text and "| qa | 0.975 | 1.000 |" in text
    # the same work: auto ran exactly suffix's qa turn and lookup's rag turn, not lookup's qa turn
    same = {(f["category"], f["peer"]): f["ratio"] for f in fig["same_work"]}
    assert same == {("qa", "suffix"): pytest.approx(1.2 / 1.5), ("rag", "lookup"): pytest.approx(2.0 / 1.6)}
    assert "2 turns" in text and "from 0.800 to 1.250" in text


def test_a_folder_without_a_summary_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no summary.json"):
        avb.main(["--bench", str(tmp_path)])
