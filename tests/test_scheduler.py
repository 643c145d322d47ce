"""The engine's scheduler, per-request timing when batched, and the one generation object.

- Before each pass the engine asks its scheduler once for every sequence that waits on it, in
  slot order, with the exact rows the others bring (prompt chunks, plain and fixed-k rows).
- A batched request's draft and verify seconds are its own: its share of the passes it was in,
  not the time it was parked while others ran.
- :class:`~draftwise.core.generation.Generation` starts a drafter once and ends it once, with
  the answer of a finished generation (no EOS) and None for a cancelled one, on every path.
- The capacity simulator asks the same batch policy object the server runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from draftwise import generate, load_model
from draftwise.capacity.simulate import simulate, workload_from_rates
from draftwise.core.decode import Stream
from draftwise.core.draft import Capabilities, Draft
from draftwise.core.engine import Engine, PassRows
from draftwise.core.generation import Generation
from draftwise.core.sampling import SamplingConfig
from draftwise.cost.goodput import StepCost
from draftwise.drafters.factory import make_drafter
from draftwise.errors import ConfigError
from draftwise.planner.replay import replay_lookup, trace_generation
from draftwise.policy.batch import BatchGoodput
from tests.test_goodput_policy import KNEE4


@pytest.fixture(scope="module")
def batched(tiny_chat_folder: Any, one_thread: None) -> Any:
    return load_model(str(tiny_chat_folder))


class Waiting:
    """A k policy that defers to the engine's scheduler, as ``--k auto`` at batch does."""

    k_max, shadow = 4, False

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine, self.name, self.k = engine, name, 0

    def choose(self, context_len: int) -> int:
        self.engine.wait_for_schedule(self)
        return self.k

    def trim(self, draft: Any, context_len: int) -> Any:
        return draft

    def observe(self, positions: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        pass


class Recorder:
    """A scheduler that gives every member k = 2 and records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], PassRows, int]] = []

    def schedule(self, members: list[Any], others: PassRows) -> None:
        self.calls.append(([m.name for m in members], others, members[0].engine.stats.passes))
        for m in members:
            m.k = 2


def test_the_scheduler_is_asked_once_a_pass_for_every_waiting_sequence(batched: Any) -> None:
    prompts = [batched.tokenizer.encode(t) for t in ("a b c d a b c d a b", "one two three one two three",
                                                     "red green blue red green blue red green blue")]
    eng = Engine(batched, max_batch=3, context=200, prefill_chunk=4)
    rec = Recorder()
    eng.scheduler = rec
    passes: dict[int, list[tuple[int, int]]] = {}  # pass number -> (slot, rows) of each sequence in it
    forward = eng.runtime.forward_batch

    def spy(rows: Any, **kw: Any) -> Any:
        if "layers" not in kw:
            passes[eng.stats.passes] = [(r.slot, len(r.ids)) for r in rows]
        return forward(rows, **kw)

    eng.runtime.forward_batch = spy
    drafters = [make_drafter("lookup", m) for m in eng.slot_models]
    policies = iter([Waiting(eng, "a"), 4, Waiting(eng, "c")])  # slot 1: a fixed k = 4, chosen alone
    got = eng.generate_all(prompts, max_new_tokens=12, drafters=drafters, k=lambda: next(policies))
    assert [r.token_ids for r in got] == [generate(batched, p, max_new_tokens=12).token_ids for p in prompts]
    assert len({c[2] for c in rec.calls}) == len(rec.calls)  # at most one schedule a pass
    assert any(names == ["a", "c"] for names, _, _ in rec.calls)  # chosen together, in slot order
    slot_of = {"a": 0, "c": 2}
    for names, others, at in rec.calls:
        mine = {slot_of[n] for n in names}
        theirs = [(slot, n) for slot, n in passes[at] if slot not in mine]
        assert others.sequences == len(theirs) and others.decode_rows + others.prompt_rows == sum(n for _, n in theirs)
        assert {slot for slot, _ in passes[at]} >= mine  # every scheduled sequence is in that pass


def test_a_sequence_waiting_on_a_schedule_with_no_scheduler_fails_clearly(batched: Any) -> None:
    eng = Engine(batched, max_batch=1, context=64)
    with pytest.raises(ConfigError, match="no scheduler"):
        eng.generate_all([batched.tokenizer.encode("a b c")], max_new_tokens=4,
                         drafters=[make_drafter("lookup", eng.slot_models[0])], k=lambda: Waiting(eng, "x"))


def test_a_failing_schedule_fails_the_sequences_that_waited_on_it_and_the_engine_goes_on(batched: Any) -> None:
    class Broken:
        def schedule(self, members: list[Any], others: PassRows) -> None:
            raise RuntimeError("a bug in the batch policy")

    prompts = [batched.tokenizer.encode(t) for t in ("a b c d a b", "one two three one two")]
    eng = Engine(batched, max_batch=2, context=128)
    eng.scheduler = Broken()
    policies = iter([Waiting(eng, "a"), 3])
    drafters = [make_drafter("lookup", m) for m in eng.slot_models]
    results: dict[int, Any] = {}
    with pytest.raises(RuntimeError, match="a bug in the batch policy"):
        eng.generate_all(prompts, max_new_tokens=8, drafters=drafters, k=lambda: next(policies),
                         on_result=lambda i, r: results.__setitem__(i, r))
    assert list(results) == [1] and results[1].token_ids == generate(batched, prompts[1], max_new_tokens=8).token_ids
    assert eng.running == 0 and eng.free == 2


def test_batched_verify_seconds_are_each_request_s_share_not_its_wait(batched: Any) -> None:
    prompts = [batched.tokenizer.encode(t) for t in ("a b c d", "one two three", "red green blue", "x y z")]
    eng = Engine(batched, max_batch=4, context=128, prefill_chunk=16)
    eng.generate_all(prompts[:1], max_new_tokens=2)  # lazy set-up, untimed
    t0 = time.perf_counter()
    got = eng.generate_all(prompts, max_new_tokens=24)
    wall = time.perf_counter() - t0
    # parked time counted as verification would make the sum about 4x the wall time
    assert sum(r.stats.verify_seconds for r in got) <= wall
    assert all(0 < r.stats.draft_seconds < r.stats.verify_seconds for r in got)  # no draft: the loop alone
    assert all(eng.parked[s] >= 0 for s in range(4))


class Spy:
    name = "spy"
    capabilities = Capabilities(learns=True)

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, prompt: Any, sampling: Any, generator: Any) -> None:
        self.calls.append(("start", len(prompt)))

    def propose(self, context: Any, k: int) -> Draft:
        return Draft([])

    def observe(self, n: int) -> None:
        pass

    def end(self, output: Any) -> None:
        self.calls.append(("end", output))


def test_a_generation_starts_and_ends_its_drafter_once_on_every_path(tiny: Any) -> None:
    spy = Spy()
    s = Stream(tiny, [5, 6, 7], max_new_tokens=6, sampling=SamplingConfig(), stop=(), drafter=spy, k=2)
    result = None
    for _ in s:
        pass
    result = s.result
    assert result is not None and spy.calls == [("start", 3), ("end", result.token_ids)]
    spy.calls.clear()
    cut = Stream(tiny, [5, 6, 7], max_new_tokens=6, sampling=SamplingConfig(), stop=(), drafter=spy, k=2)
    next(iter(cut.by_step()))
    cut.close()  # a cancelled generation teaches nothing
    assert spy.calls == [("start", 3), ("end", None)]
    spy.calls.clear()
    trace = trace_generation(tiny, [5, 6, 7], spy, 2, 6)
    assert spy.calls == [("start", 3), ("end", trace.tokens[: trace.new_tokens])]
    spy.calls.clear()
    replay_lookup(spy, [5, 6, 7], [9, 9, 2], 2, 6, eos_token_ids={2})
    assert spy.calls == [("start", 3), ("end", [9, 9])]  # the answer without the EOS that ended it
    g = Generation(eos_token_ids={2}, max_new_tokens=4, drafter=spy, learn=False)
    g.start([1], SamplingConfig(), torch.Generator())
    g.play([4, 4])
    g.end()
    g.end()
    assert spy.calls[-2:] == [("start", 1), ("end", None)]  # learn=False: ended once, with nothing


def test_the_simulator_asks_the_batch_policy_the_server_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    real = BatchGoodput.choose

    def spy(self: BatchGoodput, states: Any, **kw: Any) -> list[int]:
        asked.append(len(states))
        return real(self, states, **kw)

    monkeypatch.setattr(BatchGoodput, "choose", spy)
    w = workload_from_rates({"qa": {"lookup": [0.8, 0.7, 0.6]}}, requests=[("qa", 40, 30)])
    run = simulate(w, StepCost(KNEE4), 3, ("goodput", "none", 0), requests_per_client=2)
    assert asked and max(asked) == 3 and run.steps > 0  # every decoding sequence of a full pass, asked at once
