"""benchmarks/goodput_validate.py sends the plan's workload (no server, no model): every turn of
each unseen question, at the plan's token budget, and records what it sent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions

from .benchmark_scripts import load_benchmark

pytest.importorskip("httpx")
_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))
validate = load_benchmark("goodput_validate")


def test_a_unit_is_every_turn_of_a_question_in_order():
    qs = [Question(1, "writing", ("w1a", "w1b")), Question(3, "qa", ("q3",)), Question(2, "writing", ("w2a", "w2b"))]
    units = validate.conversations(qs, 2)
    assert [[(p["question_id"], p["turn"], p["users"]) for p in u] for u in units] == [
        [(1, 1, ["w1a"]), (1, 2, ["w1a", "w1b"])], [(3, 1, ["q3"])]]


def test_the_units_are_questions_the_plan_did_not_trace():
    questions = read_questions(DEFAULT_QUESTIONS)
    seen = [q.question_id for q in questions[:30]]
    plan = {"prompts": [{"question_id": q} for q in seen]}
    units = validate.unseen_units(plan, 20)
    assert len(units) == 20 and not {u[0]["question_id"] for u in units} & set(seen)
    assert any(len(u) == 2 for u in units)  # MT-bench questions bring both turns
    with pytest.raises(SystemExit, match="dev questions are not in the plan"):
        validate.unseen_units(plan, len(questions))


def test_the_token_budget_is_the_plan_s():
    plan = {"config": {"max_new_tokens": 128}}
    assert validate.budget(plan, None) == 128 == validate.budget(plan, 128)
    with pytest.raises(SystemExit, match="up to 128 tokens a turn.*-n 64"):
        validate.budget(plan, 64)


def test_the_workload_it_records_is_what_the_clients_sent():
    units = [[{"question_id": 1, "category": "writing", "turn": 1, "users": ["a"], "answers": [], "prompt_tokens": 30,
               "reference": [5, 6, 7]},
              {"question_id": 1, "category": "writing", "turn": 2, "users": ["a", "b"], "answers": ["x"],
               "prompt_tokens": 50, "reference": [8]}]]
    assert validate.workload(units) == [[
        {"question_id": 1, "category": "writing", "turn": 1, "prompt_tokens": 30, "new_tokens": 3},
        {"question_id": 1, "category": "writing", "turn": 2, "prompt_tokens": 50, "new_tokens": 1}]]


def test_the_policy_runs_summary_reads_the_goal_both_ways(tmp_path):
    """run_policy.py compares goodput with the best fixed k at each N (chosen in hindsight per N)
    and with the one k a static configuration would set for every N; --rescore adds the second
    to a finished run's result.json."""
    import json

    policy = load_benchmark("results/goodput-policy/run_policy")
    measured = {"1": {"plain": 10.0, "goodput": 15.0, "k=1": 12.0, "k=8": 15.0},
                "16": {"plain": 50.0, "goodput": 52.0, "k=1": 60.0, "k=8": 40.0}}
    one = policy.single_k(measured)
    # k=1: 1.2 and 1.2 over plain, geomean 1.2; k=8: 1.5 and 0.8, geomean 1.095
    assert one["k"] == "k=1" and one["geomean_vs_plain"] == pytest.approx(1.2)
    assert one["goodput_over"] == pytest.approx({"1": 1.25, "16": 52 / 60})
    result = {"measured": measured, "paired": {}, "equal": [4, 4], "config": {"rounds": 1},
              "goals": {"every_n_097": True, "n1_13": True, "beats_fixed_105": False}}
    (tmp_path / "result.json").write_text(json.dumps(result))
    assert policy.rescore(tmp_path) == 0
    again = json.loads((tmp_path / "result.json").read_text())
    assert again["goals"]["beats_single_105"] is True and again["goals"]["beats_fixed_105"] is False
    assert "One k for every N" in (tmp_path / "result.md").read_text()
    assert policy.single_k({"1": {"plain": 1.0, "goodput": 1.0}}) is None
