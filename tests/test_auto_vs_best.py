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


def _runs_bench(tmp_path, runs):
    """A bench folder whose methods answer one one-turn question per category with ``runs[method][category]``
    (each run's seconds; 10 tokens each), the kept time being the fastest run, as bench keeps it."""
    (tmp_path / "answers").mkdir(parents=True)
    for name, by_category in runs.items():
        lines = []
        for qid, (category, seconds) in enumerate(by_category.items()):
            choice = {"new_tokens": [10], "wall_time": [min(seconds)], "accept_lengths": [[1]],
                      "stats": [{"draft": name, "target_passes": 10, "repeat_seconds": seconds}]}
            lines.append(json.dumps({"question_id": qid, "category": category, "choices": [choice]}))
        (tmp_path / "answers" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_resampling_reads_the_runs_as_bench_keeps_them_and_a_perfect_pick_as_the_better_peer(tmp_path):
    bench = _runs_bench(tmp_path, {"none": {"qa": [2.0] * 3, "rag": [2.0] * 3},
                                   "lookup": {"qa": [1.0] * 3, "rag": [1.25] * 3},
                                   "suffix": {"qa": [1.25] * 3, "rag": [1.0] * 3},
                                   "auto": {"qa": [1.25] * 3, "rag": [1.0, 1.0, 1.0]}})
    rs = avb.resample(bench, draws=20)
    # one run time per turn: every draw reads what bench read; auto ran suffix's time where lookup led in qa
    assert rs["better_peer"] == {"qa": "lookup", "rag": "suffix"}
    qa = rs["as_run"]["groups"]["qa"]
    assert qa["low"] == pytest.approx(0.8) and qa["high"] == pytest.approx(0.8) and qa["held"] == 0.0
    assert rs["as_run"]["groups"]["rag"]["held"] == 1.0 and rs["as_run"]["clause_held"] == 0.0
    # a pick that is exactly the better peer in each group reads 1.0 there, beats both overall (10 tok/s
    # against 9) and holds the clause
    perfect = rs["perfect_pick"]["groups"]
    assert all(perfect[g]["low"] == pytest.approx(1.0) == perfect[g]["high"] for g in ("qa", "rag"))
    assert perfect["overall"]["low"] == pytest.approx(10 / 9)
    assert rs["perfect_pick"]["clause_held"] == 1.0


def test_resampling_spreads_a_turn_over_its_runs_and_the_report_prints_it(tmp_path):
    bench = _runs_bench(tmp_path, {"none": {"qa": [2.0] * 3}, "lookup": {"qa": [1.0] * 3},
                                   "suffix": {"qa": [1.6] * 3}, "auto": {"qa": [1.0, 1.1, 1.25]}})
    (bench / "summary.json").write_text(json.dumps({"groups": {}}))
    rs = avb.resample(bench, draws=400, seed=3)
    qa = rs["as_run"]["groups"]["qa"]
    # auto's fastest of three draws from [1.0, 1.1, 1.25]: 1.0 (70% of draws), 1.1 or 1.25 otherwise
    assert qa["high"] == pytest.approx(1.0) and qa["low"] in (pytest.approx(0.8), pytest.approx(1.0 / 1.1))
    assert 0.6 < qa["held"] < 0.8  # >= 0.97 only when the 1.0 s run is drawn: 1 - (2/3)^3 = 0.70
    text, fig = avb.report(bench, draws=50)
    assert "| qa | lookup |" in text and "perfect pick" in text and fig["resampled"]["draws"] == 50
    assert rs["runs_per_turn"] == [3, 3] and "3-3 rounds" in text
    with pytest.raises(SystemExit, match="--draws -1"):
        avb.main(["--bench", str(bench), "--draws", "-1"])
    once = _runs_bench(tmp_path / "once", {m: {"qa": [1.0]} for m in ("none", "lookup", "suffix", "auto")})
    with pytest.raises(SystemExit, match="every turn ran once"):
        avb.resample(once)


def test_the_plot_needs_draws_and_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    bench = _runs_bench(tmp_path, {"none": {"qa": [2.0] * 3}, "lookup": {"qa": [1.0] * 3},
                                   "suffix": {"qa": [1.6] * 3}, "auto": {"qa": [1.0, 1.1, 1.25]}})
    (bench / "summary.json").write_text(json.dumps({"groups": {}}))
    with pytest.raises(SystemExit, match="give --draws too"):
        avb.main(["--bench", str(bench), "--plot", str(tmp_path / "noise.png")])
    avb.main(["--bench", str(bench), "--draws", "20", "--plot", str(tmp_path / "noise.png")])
    assert (tmp_path / "noise.png").stat().st_size > 1000
