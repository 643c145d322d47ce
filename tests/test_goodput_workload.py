"""The workload the concurrency planner predicts is the one its acceptance was measured on and the
one the validation sends: every turn of a question one request (history included), each answer
up to the plan's token budget; a validation is scored against a prediction of the very requests
it sent. (The first measured run predicted a plan's merged turns as one 64-token first-turn
request, on the plan's prompts, and overpredicted speculation by 27-81%.) No model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draftwise.capacity import plan as capacity
from draftwise.capacity.report import render_validation_markdown
from draftwise.cost.batch_profile import BatchProfile, machine_fingerprint
from draftwise.cost.goodput import StepCost
from draftwise.capacity.simulate import (
    client_units, describe, plan_units, predict, simulate, workload_from_plan, workload_from_rates,
)
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.cost.profile import Profile, model_fingerprint
from draftwise.errors import ConfigError

BATCHES, ROWS = [1, 2, 4], [1, 2, 3, 5, 9]


def steep() -> BatchProfile:
    grid = {c: [[(0.010 + 0.004 * b * r) * (1 + c / 4096) for r in ROWS] for b in BATCHES] for c in (128, 1024)}
    return BatchProfile(model="tiny", fingerprint="f" * 16, machine_fingerprint="x" * 16, dtype="float32",
                        runtime="NativeRuntime", batches=BATCHES, rows=ROWS, contexts=[128, 1024], times=grid)


def candidate(k: int, mat: float, acceptance: float | None, speedup: float = 1.3) -> Candidate:
    return Candidate("lookup", k, speedup=speedup, mat=mat, acceptance=acceptance, effective_acceptance=None,
                     breakeven=0.1, interval=[speedup * 0.9, speedup * 1.1])


def two_turn_plan(prompts: list[dict[str, Any]] | None = None) -> Plan:
    cands = [candidate(2, 1.8, 0.6), candidate(4, 2.2, 0.4)]
    prompts = prompts or [{"question_id": 1, "category": "writing", "turns": 2, "prompt_tokens": 70,
                           "new_tokens": 256}]
    return Plan(model="tiny", fingerprint="f" * 16, dtype="float32", greedy=True, drafts=["lookup"], ks=[2, 4],
                categories={"writing": cands, "overall": cands}, recommended={"writing": ("lookup", 2)},
                predicted={"writing": 1.3}, routed_overall=1.3, prompts=prompts, config={"max_new_tokens": 128})


def test_a_two_turn_question_is_two_requests_each_up_to_the_plan_s_budget() -> None:
    # the old workload: one request ("writing", 70, 256), which a 64-token cap made one short first turn
    w = workload_from_plan(two_turn_plan())
    assert w.units == [[("writing", 70, 128), ("writing", 198, 128)]]  # the second turn's history: the first answer
    exact = two_turn_plan([{"question_id": 1, "category": "writing", "turns": 2, "prompt_tokens": 70,
                            "new_tokens": 200, "turn_prompt_tokens": [70, 180], "turn_new_tokens": [128, 72]}])
    assert workload_from_plan(exact).units == [[("writing", 70, 128), ("writing", 180, 72)]]
    assert plan_units(exact, {}) == []  # no category of the plan's: no units
    assert describe(w) == {"units": 1, "requests": 2, "mean_prompt_tokens": 134.0, "mean_answer_tokens": 128.0}


def test_tokens_and_rows_per_decoding_step_are_the_plan_s_counts_exactly() -> None:
    # two answers as the plan counts them: each (proposed, accepted) step commits accepted + 1,
    # and the prefill commits each answer's first token in a step of its own
    answers = [[(2, 2), (2, 0), (0, 0), (2, 1)], [(2, 2), (2, 2), (2, 1)]]
    committed = sum(1 + sum(a + 1 for _, a in steps) for steps in answers)
    steps = sum(len(s) + 1 for s in answers)
    proposed = sum(m for s in answers for m, _ in s)
    accepted = sum(a for s in answers for _, a in s)
    decoding = sum(len(s) for s in answers)
    plan = two_turn_plan([{"question_id": 1, "category": "writing", "turns": 2, "prompt_tokens": 9,
                           "new_tokens": committed}])
    plan.categories["writing"] = [candidate(2, committed / steps, accepted / proposed)]
    o = workload_from_plan(plan).kinds["writing"].options["lookup"][2]
    assert o.tokens == pytest.approx((committed - len(answers)) / decoding)  # what a decoding step commits
    assert o.rows == pytest.approx(1 + proposed / decoding)  # and feeds


def test_the_simulation_sends_each_unit_s_turns_and_counts_every_token() -> None:
    w = workload_from_rates({"qa": {"lookup": [0.5] * 4}}, k_max=4)
    w.units = [[("qa", 40, 30), ("qa", 100, 20)], [("qa", 40, 10)]]
    cost = StepCost(steep())
    one = simulate(w, cost, 1, ("plain", "none", 0), requests_per_client=2)
    assert one.aggregate * one.seconds == pytest.approx(60)  # both units, all three requests
    # per request: a client's second turn starts when its first ends, so the three latencies add up
    two = simulate(w, cost, 2, ("plain", "none", 0), requests_per_client=1)
    assert two.aggregate * two.seconds == pytest.approx(60)
    assert two.seconds < one.seconds  # the second client's unit ran beside the first's


def test_every_n_can_send_the_same_units() -> None:
    # the default: N clients x R units, so N = 1 and N = 2 decode other questions
    w = workload_from_rates({"qa": {"lookup": [0.5] * 4}}, k_max=4)
    w.units = [[("qa", 40, 30)], [("qa", 40, 10)], [("qa", 40, 50)], [("qa", 40, 70)]]
    cost, plain = StepCost(steep()), ("plain", "none", 0)
    tokens = [simulate(w, cost, n, plain, requests_per_client=1) for n in (1, 2)]
    assert [p.aggregate * p.seconds for p in tokens] == pytest.approx([30, 40])
    # per_phase: every N the same first U units, client i the i-th, (i + N)-th, ...
    for n in (1, 2, 3):
        run = simulate(w, cost, n, plain, requests_per_client=1, per_phase=3)
        assert run.aggregate * run.seconds == pytest.approx(90)
    assert client_units(3, 4, per_phase=4) == [[0, 3], [1], [2]]
    assert client_units(2, 3, per_phase=4) == [[0, 2], [1, 0]]  # indices wrap around the units
    with pytest.raises(ConfigError, match="must be an integer >= the 4 clients"):
        client_units(4, 8, per_phase=3)
    with pytest.raises(ConfigError, match="no units"):
        client_units(1, 0)


def test_a_validation_of_the_same_units_at_every_n_is_predicted_so(tmp_path: Path) -> None:
    model, bp, profile = _model_and_profiles(tmp_path)
    plan = two_turn_plan()
    plan.fingerprint = bp.fingerprint
    sent = [[{"question_id": q, "category": "writing", "turn": 1, "prompt_tokens": 50, "new_tokens": t}]
            for q, t in ((7, 128), (8, 20), (9, 60), (10, 100))]
    raw = {"measured": {"1": {"plain": 50.0, "auto": 60.0}, "2": {"plain": 80.0, "auto": 85.0}},
           "workload": sent, "requests_per_client": 2, "units_per_phase": 4, "max_tokens": 128, "equal": [12, 12]}
    v = capacity.score_load(model, plan, bp, profile, raw, "plan")
    want = predict(workload_from_plan(plan, capacity.load_units(sent)), StepCost(bp, profile), [1, 2],
                   requests_per_client=2, per_phase=4)
    assert [r["predicted_tps"] for r in v["rows"] if r["phase"] == "plain"] == pytest.approx(
        [row["policies"]["plain"]["aggregate_tps"] for row in want["rows"]])
    blocks = predict(workload_from_plan(plan, capacity.load_units(sent)), StepCost(bp, profile), [1],
                     requests_per_client=2)  # N = 1 would have sent 2 units, not 4
    assert blocks["rows"][0]["policies"]["plain"]["aggregate_tps"] != pytest.approx(v["rows"][0]["predicted_tps"])
    text = render_validation_markdown(v)
    assert "every N sent the same 4 questions" in text
    old = capacity.score_load(model, plan, bp, profile, {k: x for k, x in raw.items() if k != "units_per_phase"})
    assert "each N sent N x 2 questions" in render_validation_markdown(old)
    served = capacity.score_load(model, plan, bp, profile, raw)  # no limit: the goodput policy at N = 2
    assert [(r["n"], r["phase"], r["policy"]) for r in served["rows"]][-1] == (2, "auto", "goodput")
    limited = capacity.score_load(model, plan, bp, profile, raw, limit=1)  # the servers read limit 1: plain at N = 2
    assert [(r["n"], r["phase"], r["policy"]) for r in limited["rows"]] == [
        (1, "plain", "plain"), (1, "auto", "plan"), (2, "plain", "plain"), (2, "auto", "plain")]
    assert limited["rows"][3]["predicted_tps"] == pytest.approx(limited["rows"][2]["predicted_tps"])


class _Rt:
    max_context = 2048

    def forward_batch(self) -> None: ...

    def cache_bytes(self, slots: int, ctx: int) -> int:
        return slots * 1024


def _model_and_profiles(tmp_path: Path) -> tuple[Any, BatchProfile, Profile]:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    model = type("M", (), {"name": "tiny", "folder": folder, "mode": "float32", "runtime": _Rt()})()
    fp = model_fingerprint(model)
    bp = steep()
    bp.fingerprint, bp.machine_fingerprint = fp, machine_fingerprint()
    profile = Profile(model="tiny", fingerprint=fp, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9}, step={128: [0.0105] * 9}, drafts={"lookup": [1e-4] * 8})
    return model, bp, profile


def test_a_validation_is_scored_against_the_requests_it_sent(tmp_path: Path) -> None:
    model, bp, profile = _model_and_profiles(tmp_path)
    plan = two_turn_plan()
    plan.fingerprint = bp.fingerprint
    sent = [[{"question_id": 7, "category": "writing", "turn": 1, "prompt_tokens": 50, "new_tokens": 128},
             {"question_id": 7, "category": "writing", "turn": 2, "prompt_tokens": 230, "new_tokens": 90}],
            [{"question_id": 8, "category": "writing", "turn": 1, "prompt_tokens": 60, "new_tokens": 40}]]
    raw = {"measured": {"1": {"plain": 50.0, "auto": 60.0}, "2": {"plain": 80.0, "auto": 85.0}},
           "per_request": {"1": {"plain": 50.0, "auto": 60.0}, "2": {"plain": 40.0, "auto": 45.0}},
           "workload": sent, "requests_per_client": 1, "max_tokens": 128, "equal": [10, 10]}
    v = capacity.score_load(model, plan, bp, profile, raw, "plan")
    want = predict(workload_from_plan(plan, capacity.load_units(sent)), StepCost(bp, profile), [1, 2],
                   requests_per_client=1)
    got = {(r["n"], r["phase"]): r for r in v["rows"]}
    for row in want["rows"]:
        n = row["n"]
        assert got[(n, "plain")]["predicted_tps"] == pytest.approx(row["policies"]["plain"]["aggregate_tps"])
        assert got[(n, "auto")]["predicted_tps"] == pytest.approx(row["policies"]["plan"]["aggregate_tps"])
        assert got[(n, "auto")]["predicted_per_request"] == pytest.approx(row["policies"]["plan"]["per_request_tps"])
        assert got[(n, "auto")]["per_request_error"] == pytest.approx(
            row["policies"]["plan"]["per_request_tps"] / raw["per_request"][str(n)]["auto"] - 1)
    # not the prediction on the plan's own prompts, whose lengths differ
    own = capacity.concurrency_plan(model, plan, bp, profile, [1], requests_per_client=1)
    assert own["rows"][0]["policies"]["plain"]["aggregate_tps"] != pytest.approx(got[(1, "plain")]["predicted_tps"])
    assert v["workload"]["requests"] == 3 and v["equal"] == [10, 10]
    assert "Predicted on the requests the load test sent: 2 questions" in render_validation_markdown(v)
    with pytest.raises(ConfigError, match="no 'workload'"):
        capacity.score_load(model, plan, bp, profile, {k: v for k, v in raw.items() if k != "workload"})


def test_validation_refuses_another_token_budget(tmp_path: Path) -> None:
    model, bp, profile = _model_and_profiles(tmp_path)
    plan = two_turn_plan()
    plan.fingerprint = bp.fingerprint
    with pytest.raises(ConfigError, match="answers of up to 128 tokens a turn.*-n 64"):
        capacity.run_concurrency(model, plan, "1,2", out_dir=tmp_path / "out", profile=profile, batch_profile=bp,
                                 validate=True, plan_path=tmp_path / "plan.json", max_new_tokens=64)
