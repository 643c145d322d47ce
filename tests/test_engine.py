"""The batched engine: every generation in a batch equals the same generation run alone (greedy,
and sampled with a seed), whatever its draft, and one that fails ends alone."""

from __future__ import annotations

from typing import Any

import pytest

from draftwise import engine as engine_mod
from draftwise.decode import generate
from draftwise.drafters.factory import make_drafter
from draftwise.engine import Engine
from draftwise.errors import ConfigError, DraftwiseError
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.sampling import SamplingConfig


@pytest.fixture(scope="module")
def batched_model(default_folder: Any) -> Any:
    """A model of its own: the engine re-allocates its runtime's cache in slots."""
    from draftwise import load_model

    return load_model("default", dtype="float32", max_context=1024)


@pytest.fixture(scope="module")
def prompts(batched_model: Any) -> list[list[int]]:
    questions = spread_questions(read_questions(DEFAULT_QUESTIONS), 4)
    ids = [batched_model.encode_prompt(q.turns[0]) for q in questions]
    return ids + [ids[0][:7], ids[1] + ids[2]]  # a short prompt and a long one


def test_batched_greedy_equals_alone_with_every_kind_of_draft(batched_model: Any, prompts: list[list[int]]) -> None:
    plain = [generate(batched_model, p, max_new_tokens=16, draft="none").token_ids for p in prompts]
    eng = Engine(batched_model, max_batch=4, context=1024, prefill_chunk=32)  # 6 prompts: slots are reused
    for spec, k in (("none", 1), ("lookup", 4), ("suffix", 6), ("lookup:branches=3", 4), ("self", 3)):
        drafters = [make_drafter(spec, slot) for slot in eng.slot_models]  # a self draft runs on its slot
        got = eng.generate_all(prompts, max_new_tokens=16, drafters=drafters, k=k)
        assert [r.token_ids for r in got] == plain, spec
    assert max(eng.stats.batch_sizes) == 4
    assert eng.running == 0 and eng.free == 4


def test_sampled_with_a_seed_is_the_same_alone_and_batched(batched_model: Any, prompts: list[list[int]]) -> None:
    cfgs = [SamplingConfig(temperature=0.8, top_p=0.95, seed=100 + i) for i in range(len(prompts))]
    for spec in ("none", "lookup"):
        want = [generate(batched_model, p, max_new_tokens=10, sampling=c, draft=spec, k=3).token_ids
                for p, c in zip(prompts, cfgs)]
        eng = Engine(batched_model, max_batch=8, context=1024)
        drafters = [make_drafter(spec, batched_model) for _ in range(8)]
        got = eng.generate_all(prompts, max_new_tokens=10, sampling=cfgs, drafters=drafters, k=3)
        assert [r.token_ids for r in got] == want, spec


def test_a_failing_generation_ends_alone(batched_model: Any, prompts: list[list[int]]) -> None:
    eng = Engine(batched_model, max_batch=4, context=256)
    outcome: dict[int, Any] = {}

    def job(i: int, ids: list[int], n: int):
        def run(model: Any) -> None:
            try:
                outcome[i] = generate(model, ids, max_new_tokens=n).token_ids
            except Exception as exc:  # noqa: BLE001 - the test reads it
                outcome[i] = exc

        return run

    class Broken:  # a drafter that fails at its third proposal
        name, capabilities, calls = "broken", make_drafter("lookup", batched_model).capabilities, 0

        def start(self, *args: Any) -> None: ...

        def propose(self, context: list[int], k: int) -> Any:
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the draft broke")
            from draftwise.drafters.base import Draft

            return Draft([])

        def observe(self, accepted: int) -> None: ...

        def end(self, output: Any) -> None: ...

    def broken(model: Any) -> None:
        try:
            generate(model, prompts[1], max_new_tokens=8, draft=Broken(), k=2)
        except RuntimeError as exc:
            outcome[1] = exc

    eng.start(job(0, prompts[0], 8))
    eng.start(broken)
    eng.start(job(2, prompts[2], 8))
    eng.start(job(3, prompts[1][:40] * 10, 8))  # 400 tokens: over the slot's 256, refused at once
    eng.run_until_done()
    assert str(outcome[1]) == "the draft broke"
    assert isinstance(outcome[3], DraftwiseError) and "context of 256" in str(outcome[3])
    assert outcome[0] == generate(batched_model, prompts[0], max_new_tokens=8).token_ids
    assert outcome[2] == generate(batched_model, prompts[2], max_new_tokens=8).token_ids


def test_bad_batches_get_one_clear_line(batched_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="max_batch"):
            Engine(batched_model, max_batch=bad)
    monkeypatch.setattr(engine_mod, "memory_available", lambda: 2**30)
    with pytest.raises(ConfigError, match=r"max_batch=64 needs .* GiB of KV cache .* use max_batch \d+ or less"):
        Engine(batched_model, max_batch=64)
    with pytest.raises(ConfigError, match="prefill_chunk"):
        Engine(batched_model, max_batch=2, prefill_chunk=0)


def test_the_hf_runtime_runs_one_sequence(tiny_chat_folder: Any) -> None:
    from draftwise import load_model

    model = load_model(str(tiny_chat_folder), runtime="hf")
    with pytest.raises(ConfigError, match="one sequence at a time"):
        Engine(model, max_batch=2)
