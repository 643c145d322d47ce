"""The goodput policy as the batched server follows it: BatchGoodput.respond (a scored tree's
best response to the batch), BatchKCoordinator's membership (alone, joining, leaving) and
BatchSlotPolicy (alone its own adaptive policy decides; in a crowd the batch does), then on the
tiny model's batched engine, where greedy outputs stay those of each prompt alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from draftwise import generate, load_model
from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.goodput import PLAIN, Choice, Outcome, StepCost, step_goodput
from draftwise.policy.batch import BatchGoodput, BatchKCoordinator, SeqState
from draftwise.policy.batch_limit import read_capacity, speculating_limit
from draftwise.policy.outside_pass import OutsidePass
from draftwise.core.draft import Draft
from draftwise.drafters.factory import make_drafter
from draftwise.core.engine import Engine, PassRows
from draftwise.errors import ConfigError

BATCHES = [1, 2, 4, 8, 16]
ROWS = [1, 2, 3, 5, 9]


def knee_profile(knee: int, per_row: float, intercept: float = 0.01) -> BatchProfile:
    """T(B, R) = intercept, flat up to ``knee`` rows in all, then ``per_row`` a row."""
    grid = {c: [[intercept + per_row * max(b * r - knee, 0) for r in ROWS] for b in BATCHES] for c in (128, 1024)}
    return BatchProfile(model="m", fingerprint="f" * 16, machine_fingerprint="x" * 16, dtype="float32",
                        runtime="NativeRuntime", batches=BATCHES, rows=ROWS, contexts=[128, 1024], times=grid)


KNEE4 = knee_profile(4, 0.05)  # flat to 4 rows, then a row costs 5 plain passes
LINEAR = knee_profile(0, 0.004)  # a CPU: every row costs


class Fake:
    """What BatchSlotPolicy reads of an AdaptiveK, with what it was asked recorded."""

    k_max, probe_every = 8, 4

    def __init__(self, rate: float = 0.7, *, trees: bool = False, shadow: bool = True, alone_k: int = 5) -> None:
        self.rate, self.trees, self.shadow, self.alone_k = rate, trees, shadow, alone_k
        self.trimmed: list[int] = []
        self.sizes: list[int | None] = []  # the proposed tree's size each calibration was asked for
        self.skipped: list[int] = []

    def rates(self) -> list[float]:
        return [self.rate] * 8

    def choose(self, context_len: int) -> int:
        return self.k_max if self.trees else self.alone_k

    def calibration(self, size: int | None = None) -> float:
        self.sizes.append(size)
        return 1.0

    def node_tokens(self, scores: Sequence[float], size: int) -> list[float]:
        lam = self.calibration(size)
        return [min(1.0, lam * s) for s in scores]

    def trim(self, draft: Draft, context_len: int, size: int | None = None) -> Draft:
        self.trimmed.append(len(draft))
        self.sizes.append(size)
        return draft

    def skip(self, draft: Draft) -> Draft:
        self.skipped.append(len(draft))
        return draft.prefix(0)

    def observe(self, positions: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        pass


def coordinator(profile: BatchProfile, seen: list[tuple[str, int]] | None = None) -> BatchKCoordinator:
    on_k = (lambda d, k: seen.append((d, k))) if seen is not None else None
    return BatchKCoordinator(BatchGoodput(profile, k_max=8), wait=lambda member: None, on_k=on_k)


def step(coord: BatchKCoordinator, members: list[Any], context: int, others: PassRows = PassRows()) -> list[int]:
    """One engine step as its scheduler sees it: every member waits for its k (having set its
    context), the scheduler chooses for all of them at once, then each goes on with its k."""
    for m in members:
        m.context = context
    coord.schedule(members, others)
    return [m.choose(context) for m in members]


def tree(scores: list[float]) -> Draft:
    from draftwise.core.tree import TokenTree
    n = len(scores)
    return Draft(list(range(n)), tree=TokenTree(list(range(n)), list(range(n))), scores=tuple(scores))


def test_respond_is_the_best_response_by_the_step_s_goodput() -> None:
    """The n respond() picks maximises step_goodput (written out plainly) with the others fixed."""
    tokens = [1.0, 1.9, 2.7, 3.4, 3.9, 4.2]
    for profile in (KNEE4, LINEAR):
        policy, cost = BatchGoodput(profile, k_max=8), StepCost(profile)
        for crowd in (1, 3, 15):
            ks = policy.choose([SeqState("lookup", [0.6] * 8, 300)] * crowd, prefill_rows=8, prefilling=1)
            n = policy.respond(0, tokens, 300)
            step = policy._step
            assert step is not None and policy.last[0] == n and ks[1:] == policy.last[1:]
            rest = [Choice({0: PLAIN, k: Outcome(step.tokens[i], step.rows[i], 0, 0)}, {0: 0.0, k: 0.0})
                    for i, k in enumerate(ks) if i]
            values = [step_goodput([Choice({0: PLAIN, m: Outcome(t, m + 1.0, t, t)}, {0: 0.0, m: 0.0}), *rest],
                                   [m, *ks[1:]], cost, context=300, fixed_rows=8, fixed_batch=1)
                      for m, t in enumerate(tokens)]
            assert values[n] == pytest.approx(max(values)), (crowd, values)


def test_a_tree_keeps_fewer_nodes_as_the_batch_fills() -> None:
    policy = BatchGoodput(LINEAR, k_max=8)
    tokens = [1.0, 1.95, 2.85, 3.7, 4.45, 5.0, 5.4, 5.7, 5.9]
    kept = []
    for crowd in (1, 4, 16):
        policy.choose([SeqState("suffix", [0.5] * 8, 200)] * crowd)
        kept.append(policy.respond(0, tokens, 200))
    assert kept[0] >= 4 and kept[0] >= kept[1] > kept[2]  # 1, 4, 16 sequences in the pass
    with pytest.raises(ConfigError, match="answers the last choose"):
        policy.respond(16, tokens, 200)


def test_alone_the_request_s_own_policy_chooses_and_a_crowd_turns_it_plain() -> None:
    seen: list[tuple[str, int]] = []
    coord = coordinator(KNEE4, seen)
    me = coord.policy(Fake(alone_k=5), "lookup")
    assert step(coord, [me], 100) == [5] and coord.alone  # exactly what --k auto does for one request
    crowd = [coord.policy(Fake(), "lookup") for _ in range(3)]
    assert step(coord, [me, *crowd], 100) == [0, 0, 0, 0] and not coord.alone  # four fill the flat pass
    assert sum(step(coord, [me, crowd[0]], 100)) == 2  # two ended and do not ask: two rows of room
    assert seen[0] == ("lookup", 5) and seen[1:5] == [("lookup", 0)] * 4 and sum(k for _, k in seen[-2:]) == 2


def test_the_schedule_is_chosen_once_for_every_waiting_sequence_with_its_own_context() -> None:
    coord = coordinator(KNEE4)
    chosen: list[list[SeqState]] = []
    real = coord.goodput.choose
    coord.goodput.choose = lambda states, **kw: chosen.append(list(states)) or real(states, **kw)  # type: ignore[method-assign]
    members = [coord.policy(Fake(), "lookup") for _ in range(3)]
    for m, context in zip(members, (100, 200, 300)):
        m.context = context
    coord.schedule(members, PassRows(decode_rows=2, prompt_rows=8, sequences=3))
    assert len(chosen) == 1 and [s.context for s in chosen[0]] == [100, 200, 300]
    assert [m.index for m in members] == [0, 1, 2] and [m.chosen for m in members] == coord.goodput.last
    assert not coord.alone and coord.goodput._step is not None and coord.goodput._step.fixed_rows == 10.0


def test_a_prompt_in_the_pass_counts_and_a_costly_draft_still_probes() -> None:
    coord = coordinator(KNEE4)
    costly = coord.policy(Fake(shadow=False), "model:x")
    prompt = PassRows(prompt_rows=8, sequences=1)  # a prompt's chunk of 8 rows shares every pass
    ks = [step(coord, [costly], 100, prompt)[0] for _ in range(8)]
    assert not coord.alone and ks == [0, 0, 0, 1, 0, 0, 0, 1]  # one probe every probe_every plain steps


def test_a_tree_is_trimmed_to_its_best_response() -> None:
    coord = coordinator(LINEAR)
    alone = coord.policy(Fake(trees=True), "suffix")
    assert step(coord, [alone], 200) == [8]  # a scored tree is proposed whole
    scores = [0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4]
    assert len(alone.trim(tree(scores), 200)) == 8 and alone.adaptive.trimmed == [8]  # its own trim, alone
    crowd = [coord.policy(Fake(rate=0.5), "lookup") for _ in range(15)]
    step(coord, [alone, *crowd], 200)
    kept = alone.trim(tree(scores), 200)  # 16 in a pass where every row costs: two nodes pay
    assert 0 < len(kept) < 8 and alone.adaptive.trimmed[-1] == len(kept)
    assert coord.goodput.last[0] == len(kept)
    assert alone.adaptive.sizes[-2:] == [8, 8]  # calibrated, and trimmed, as the 8-node tree it was


def test_a_tree_the_batch_keeps_none_of_still_teaches_its_calibration() -> None:
    coord = coordinator(LINEAR)
    weak = coord.policy(Fake(trees=True), "suffix")
    crowd = [coord.policy(Fake(rate=0.5), "lookup") for _ in range(15)]
    step(coord, [weak, *crowd], 200)
    kept = weak.trim(tree([0.05, 0.04, 0.03, 0.02]), 200)  # no node pays in a crowded pass
    assert kept.tokens == [] and weak.adaptive.skipped == [4] and weak.adaptive.trimmed == []


# -- on the tiny model's batched engine -------------------------------------------------------
class Costs:
    """An ordinary profile for AdaptiveK and the goodput model: alone, a pass is nearly flat in
    rows, so a proposal pays at any acceptance the estimate can reach."""

    max_n, token_overhead = 9, 0.0

    def step_time(self, n: int, context: float | None = None) -> float:
        return 0.01 + 0.0001 * n

    def draft_time(self, draft: str, k: int) -> float:
        return 1e-6 * k

    def overhead(self, n: int, context: float | None = None) -> float:
        return 0.0


@pytest.fixture(scope="module")
def tiny_batched(tiny_chat_folder: Any, one_thread: None) -> Any:
    return load_model(str(tiny_chat_folder))


def test_the_engine_follows_the_batch_and_stays_exact(tiny_batched: Any, tiny: Any) -> None:
    prompts = [tiny.tokenizer.encode(t) for t in ("a b c d a b c d a b", "one two three one two three",
                                                  "red green blue red green blue", "x y z x y z x y")]
    eng = Engine(tiny_batched, max_batch=4, context=160, prefill_chunk=8)
    goodput = BatchGoodput(KNEE4, Costs(), k_max=8)  # type: ignore[arg-type]
    seen: list[tuple[int, list[int]]] = []
    choose = goodput.choose

    def spy(states: Any, **kw: Any) -> list[int]:
        out = choose(states, **kw)
        seen.append((len(states), list(out)))
        return out

    goodput.choose = spy  # type: ignore[method-assign]
    coord = BatchKCoordinator(goodput, wait=eng.wait_for_schedule)
    eng.scheduler = coord
    for draft in ("lookup", "suffix"):  # a chain, and a scored tree trimmed to its best response
        slots = [make_drafter(draft, m) for m in eng.slot_models]
        for batch in (prompts[:1], prompts[:2], prompts):
            seen.clear()
            got = eng.generate_all(batch, max_new_tokens=24, drafters=slots,
                                   k=lambda: coord.policy(AdaptiveK(Costs(), draft), draft))  # type: ignore[arg-type]
            assert [r.token_ids for r in got] == [generate(tiny, p, max_new_tokens=24).token_ids for p in batch]
            full = [ks for n, ks in seen if n == len(batch)]
            assert full, (draft, seen)
            if draft == "lookup" and len(batch) == 4:  # four rows fill the flat pass: no proposal pays
                assert all(ks == [0, 0, 0, 0] for ks in full)
            elif draft == "lookup" and len(batch) == 2:  # two rows of room, spent
                assert all(sum(ks) == 2 for ks in full)


# -- what a sequence costs outside the pass, measured while serving -----------------------------
def test_outside_pass_fits_plain_and_speculating_apart_and_keeps_the_prior_for_what_never_ran() -> None:
    est = OutsidePass(prior=0.001)
    for i in range(300):  # batches of 8 to 16, a quarter to a half of them speculating
        n, s = 8 + i % 9, 2 + i % 5
        est.observe((n - s) * 0.0002 + s * 0.0012 + 0.003, plain=n - s, speculating=s, known=0.003)
    plain, spec = est.estimate()
    assert plain == pytest.approx(0.0002, rel=0.05) and spec == pytest.approx(0.0012, rel=0.05)
    only_plain = OutsidePass(prior=0.001)
    for _ in range(300):
        only_plain.observe(16 * 0.0002, plain=16, speculating=0)
    plain, spec = only_plain.estimate()
    assert plain == pytest.approx(0.0002, rel=0.05) and spec == pytest.approx(0.001)
    only_plain.observe(5.0, plain=16, speculating=0)  # a pause: counted at 3x the fit + 2 ms, not 5 s
    assert only_plain.estimate()[0] < 0.0004
    with pytest.raises(ConfigError):
        OutsidePass(prior=-1.0)


def test_a_step_cost_with_measured_overheads_charges_plain_and_speculating_apart() -> None:
    cost = StepCost(LINEAR)
    assert cost.overhead(0, 128) == cost.overhead(3, 128) == 0.0
    cost.per_sequence = (0.0002, 0.003)
    assert (cost.overhead(0, 128), cost.overhead(1, 128), cost.overhead(8, 1024)) == (0.0002, 0.003, 0.003)


def test_speculation_a_step_measures_dear_turns_the_crowd_plain() -> None:
    states = [SeqState("lookup", [0.7] * 8, 300) for _ in range(16)]
    goodput = BatchGoodput(knee_profile(32, 0.004), k_max=8)
    assert min(goodput.choose(states)) > 0  # the pass is flat to 32 rows: by the pass alone, every proposal pays
    goodput.measure_outside()
    assert goodput.cost.per_sequence == (0.0, 0.0)  # no profile: nothing outside the pass until measured
    for _ in range(100):  # a speculating sequence costs 10 ms outside the pass, a plain one 0.1 ms
        goodput.observe_step(8 * 0.0001 + 8 * 0.01, plain=8, speculating=8)
        goodput.observe_step(16 * 0.0001, plain=16, speculating=0)
    assert goodput.choose(states) == [0] * 16
    coord = BatchKCoordinator(BatchGoodput(LINEAR, k_max=8), wait=lambda member: None)
    coord.observe_step(1.0, plain=16, speculating=0)  # not measuring: nothing changes
    assert coord.goodput.cost.per_sequence is None


def test_the_engine_counts_the_sequences_that_verify_a_proposal(tiny_batched: Any) -> None:
    prompts = [tiny_batched.tokenizer.encode(t) for t in ("a b c d a b c d a b", "one two three one two three")]
    eng = Engine(tiny_batched, max_batch=2, context=160, prefill_chunk=8)
    for drafters, k in ((None, 1), ([make_drafter("lookup", m) for m in eng.slot_models], 3)):
        seen: list[tuple[int, int]] = []
        eng.generate_all(prompts, max_new_tokens=16, drafters=drafters, k=k,
                         progress=lambda done: seen.append((eng.stats.batch_sizes[-1], eng.stats.last_speculating)))
        assert all(0 <= s <= n for n, s in seen)
        assert (max(s for _, s in seen) > 0) == (drafters is not None), seen


def test_the_batch_expects_of_a_draft_what_its_batch_steps_accepted() -> None:
    line = knee_profile(0, 0.001)  # 16 plain rows 26 ms: a row pays for 0.7 tokens, not for 0.35
    states = [SeqState("lookup", [0.7] * 8, 300) for _ in range(16)]
    goodput = BatchGoodput(line, k_max=8)
    goodput.record("lookup", 2.0, 0)  # not calibrating: nothing is kept
    assert goodput.factor("lookup") == 1.0 and min(goodput.choose(states)) > 0
    goodput.calibrate()
    for _ in range(400):
        goodput.record("lookup", 2.0, 1)  # expected two draft tokens a step, one accepted
    assert goodput.factor("lookup") == pytest.approx(0.5, abs=0.02) and goodput.factor("suffix") == 1.0
    assert list(goodput.factors()) == ["lookup"]
    assert goodput.choose(states) == [0] * 16


def test_a_slot_in_a_crowd_tells_the_batch_what_it_expected_and_what_was_accepted() -> None:
    coord = coordinator(knee_profile(32, 0.004))
    coord.goodput.calibrate()
    crowd = [coord.policy(Fake(rate=0.9), "lookup") for _ in range(4)]  # 4 x 8 rows fit the flat pass
    assert min(step(coord, crowd, 100)) > 0 and not coord.alone
    crowd[0].observe(2, 0)  # a chain that found two tokens to propose, both rejected
    expected, accepted = coord.goodput._calibration["lookup"]
    assert expected == pytest.approx(0.9 + 0.81) and accepted == 0
    crowd[1].observe_shadow([1], [1])  # a plain step teaches the batch nothing
    assert coord.goodput._calibration["lookup"] == [expected, 0]


# -- the speculating limit: the plan's concurrency prediction, at the low end of its interval ------
def capacity_rows(lows: dict[int, float]) -> list[dict[str, Any]]:
    return [{"n": n, "policies": {"goodput": {"vs_plain_interval": [lo, lo + 0.2]}}} for n, lo in lows.items()]


def test_the_speculating_limit_is_the_largest_n_up_to_which_the_low_end_stays_at_plain(tmp_path: Any) -> None:
    bp = knee_profile(32, 0.004)
    bp.created = "2026-12-05T17:44:49"
    cap = {"model": "m", "batch_profile_created": bp.created, "rows": capacity_rows({16: 0.96, 1: 1.2, 8: 1.07, 4: 1.17})}
    assert speculating_limit(cap, bp) == 8
    assert speculating_limit({**cap, "rows": capacity_rows({1: 0.99, 2: 1.3})}, bp) == 0  # not even alone
    with pytest.raises(ConfigError, match="predict it again"):
        speculating_limit({**cap, "batch_profile_created": "2026-12-04T10:00:00"}, bp)  # another batch profile
    with pytest.raises(ConfigError, match="no 'goodput' interval"):
        speculating_limit({**cap, "rows": [{"n": 1, "policies": {"plain": {}}}]}, bp)
    assert read_capacity(tmp_path) is None and read_capacity(tmp_path / "plan.json") is None
    (tmp_path / "concurrency.json").write_text('{"rows": []}')
    assert read_capacity(tmp_path / "plan.json")["source"] == str(tmp_path / "concurrency.json")
    (tmp_path / "concurrency.json").write_text('{"concurrency": [1]}')
    with pytest.raises(ConfigError, match="not a draftwise concurrency prediction"):
        read_capacity(tmp_path)


def test_past_the_speculating_limit_the_batch_steps_plain_and_trees_are_not_proposed() -> None:
    goodput = BatchGoodput(knee_profile(32, 0.004), k_max=8)  # flat to 32 rows: every proposal pays by the pass
    goodput.speculate_up_to = 2
    states = [SeqState("lookup", [0.9] * 8, 300) for _ in range(4)]
    assert goodput.choose(states) == [0, 0, 0, 0] and goodput.plain
    assert goodput.respond(0, [1.0, 1.9, 2.7], 300) == 0  # a tree's best response past the limit: nothing
    assert min(goodput.choose(states[:2])) > 0 and not goodput.plain
    assert min(goodput.choose(states[:1], prefilling=1)) > 0  # a prompt's chunk counts: two in the pass
    assert goodput.choose(states[:2], prefilling=1) == [0, 0]
    coord = BatchKCoordinator(goodput, wait=lambda member: None)
    crowd = [coord.policy(Fake(rate=0.9, trees=True), "suffix") for _ in range(3)]
    assert step(coord, crowd, 100) == [0, 0, 0]  # three in the pass: no tree is even drafted
    assert not any(p.shadow for p in crowd)  # nor a shadow token: the step is plain whatever they estimate
    assert step(coord, crowd[:2], 100) == [8, 8] and all(p.shadow for p in crowd[:2])  # one ended; two: trees again


def test_past_the_limit_a_sequence_steps_plain_without_waiting_on_the_schedule() -> None:
    goodput = BatchGoodput(knee_profile(32, 0.004), k_max=8)
    goodput.speculate_up_to = 2
    running = [3]
    waited: list[Any] = []
    seen: list[tuple[str, int]] = []
    coord = BatchKCoordinator(goodput, wait=waited.append, size=lambda: running[0],
                              on_k=lambda d, k: seen.append((d, k)))
    policy = coord.policy(Fake(rate=0.9, trees=True), "suffix")
    assert coord.past_limit() and policy.choose(100) == 0 and not policy.shadow
    assert waited == [] and seen == [("suffix", 0)]  # no schedule asked; the metrics still hear its k
    running[0] = 2
    assert not coord.past_limit()
    policy.choose(100)
    assert waited == [policy]  # at the limit: the engine schedules it with the others
    assert not BatchKCoordinator(goodput, wait=waited.append).past_limit()  # no size: the schedule decides
