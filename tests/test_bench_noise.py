"""draftwise.bench.noise: each speedup's spread under redraws of the runs bench kept."""

from __future__ import annotations

import statistics

import pytest

from draftwise.bench.noise import redraw, runs_of, speedup_intervals, speedups
from draftwise.bench.report import render_markdown
from draftwise.bench.summary import summarise
from draftwise.questions import Question

QS = [Question(1, "qa", ("",)), Question(2, "qa", ("",)), Question(3, "rag", ("",))]


def _answers(runs):
    """answers[method][key] with one 10-token turn per question, ``runs[method][i]`` its run seconds."""
    return {m: {str(q.question_id): {"choices": [{"new_tokens": [10], "wall_time": [min(r)],
                                                  "stats": [{"repeat_seconds": r}]}]}
                for q, r in zip(QS, per_q)} for m, per_q in runs.items()}


def test_steady_runs_give_the_reading_itself_and_noisy_ones_a_spread_around_it():
    steady = _answers({"none": [[2.0, 2.0]] * 3, "lookup": [[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]]})
    iv = speedup_intervals(steady, QS, draws=50)["groups"]
    assert iv["qa"]["lookup"] == {"low": pytest.approx(2.0), "median": pytest.approx(2.0), "high": pytest.approx(2.0)}
    assert iv["rag"]["lookup"]["low"] == pytest.approx(1.0) and "none" in iv["qa"]
    noisy = _answers({"none": [[2.0, 2.0]] * 3, "lookup": [[1.0, 2.0], [1.0, 2.0], [2.0, 2.0]]})
    iv = speedup_intervals(noisy, QS, draws=400)["groups"]["qa"]["lookup"]
    assert iv["low"] == pytest.approx(1.0) and iv["high"] == pytest.approx(2.0)  # both runs slow, or both fast


def test_a_redraw_keeps_a_rounds_runs_together_unless_told_not_to():
    # round 0 ran fast for both methods, round 1 slow for both: redrawn together, the ratio never moves
    together = runs_of(_answers({"none": [[2.0, 4.0]] * 3, "lookup": [[1.0, 2.0]] * 3}))

    def reading(s):
        return {"qa": s["qa"]["lookup"]}

    assert {round(r["qa"], 6) for r in redraw(together, QS, reading, 100)} == {2.0}
    apart = {round(r["qa"], 6) for r in redraw(together, QS, reading, 300, unpaired=("lookup",))}
    assert min(apart) < 2.0 < max(apart)
    # another way to keep a turn's time: the slowest of the drawn rounds reads lookup slower
    spread_out = runs_of(_answers({"none": [[2.0, 2.0]] * 3, "lookup": [[1.0, 2.0]] * 3}))
    fastest = statistics.median(r["qa"] for r in redraw(spread_out, QS, reading, 300))
    slowest = statistics.median(r["qa"] for r in redraw(spread_out, QS, reading, 300, keep=max))
    assert fastest == pytest.approx(2.0) and slowest == pytest.approx(1.0)


def test_the_fast_speedups_are_the_summarys():
    answers = _answers({"none": [[2.0, 2.5], [3.0, 3.1], [1.5, 1.7]], "lookup": [[1.0, 1.2], [2.5, 2.0], [1.1, 1.4]],
                        "suffix": [[1.3, 1.3], [1.9, 2.9], [0.8, 0.9]]})
    for q, n in zip(QS, (10, 30, 7)):  # unequal answers, so the mean of rates differs from the total's rate
        for m in answers:
            answers[m][str(q.question_id)]["choices"][0]["new_tokens"] = [n]
    groups, _, _ = summarise(answers, QS, ["none", "lookup", "suffix"])
    runs = runs_of(answers)
    fast = speedups(runs, QS, lambda m, k, t: min(runs[m][k][1][t]))
    assert fast.keys() == groups.keys()
    for g, rows in groups.items():
        for m, row in rows.items():
            assert fast[g][m] == pytest.approx(row["speedup"]), (g, m)


def test_one_run_a_turn_has_nothing_to_redraw_and_the_draws_follow_the_seed():
    assert speedup_intervals(_answers({"none": [[2.0]] * 3, "lookup": [[1.0]] * 3}), QS) is None
    with pytest.raises(ValueError, match="draws=0"):
        redraw(runs_of(_answers({"none": [[2.0, 2.1]] * 3})), QS, lambda s: {}, 0)
    runs = runs_of(_answers({"none": [[2.0, 2.2]] * 3, "lookup": [[1.0, 1.5]] * 3}))

    def reading(groups):
        return {"qa": groups["qa"]["lookup"]}

    assert redraw(runs, QS, reading, 30, seed=4) == redraw(runs, QS, reading, 30, seed=4)
    assert redraw(runs, QS, reading, 30, seed=4) != redraw(runs, QS, reading, 30, seed=5)


def test_the_summary_prints_each_methods_interval_per_group():
    noise = {"draws": 1000, "seed": 0, "groups": {"qa": {"none": {"low": 1.0, "median": 1.0, "high": 1.0},
                                                         "lookup": {"low": 1.234, "median": 1.3, "high": 1.456}}}}
    summary = {"config": {"model": "m", "dtype": "float32", "temperature": 0, "max_new_tokens": 8, "k": 3,
                          "repeats": 3, "date": "d", "methods": ["none", "lookup"], "command": "c"},
               "run": {"questions_finished": 3, "questions_total": 3, "stopped": None},
               "groups": {}, "equality": {"checked": False, "reason": "r"}, "noise": noise}
    text = render_markdown(summary)
    assert "## Run-to-run noise" in text and "| group | lookup |" in text and "| qa | 1.23-1.46x (1.30x) |" in text
