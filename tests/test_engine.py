"""The batched engine: every generation in a batch equals the same generation run alone (greedy,
and sampled with a seed), whatever its draft, and one that fails ends alone."""

from __future__ import annotations

import functools
import json
import operator
from typing import Any

import pytest

from draftwise.core import engine as engine_mod
from draftwise import generate
from draftwise.drafters.factory import make_drafter
from draftwise.core.engine import Engine
from draftwise.errors import ConfigError, DraftwiseError
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.core.sampling import SamplingConfig
from draftwise.server import pass_trace


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


# one draft of each kind, one per slot, all in the same passes: plain, a lookup chain, a suffix
# tree, a lookup tree and self-speculation (whose draft passes run on a subset of layers)
KINDS = ("none", "lookup", "suffix", "lookup:branches=3", "self")


@pytest.mark.real_model
def test_batched_greedy_equals_alone_with_every_kind_of_draft(batched_model: Any, prompts: list[list[int]],
                                                              tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = [generate(batched_model, p, max_new_tokens=16, draft="none").token_ids for p in prompts]
    eng = Engine(batched_model, max_batch=len(KINDS), context=1024, prefill_chunk=32)  # 6 prompts: a slot is reused
    monkeypatch.setenv(pass_trace.TRACE_ENV, str(tmp_path / "passes.jsonl"))
    pass_trace.attach(eng)  # and the passes traced, as `serve` does with DRAFTWISE_PASS_TRACE set
    drafters = [make_drafter(spec, slot) for spec, slot in zip(KINDS, eng.slot_models)]  # self runs on its slot
    got = eng.generate_all(prompts, max_new_tokens=16, drafters=drafters, k=4)
    pass_trace.flush(eng)
    trace = [json.loads(line) for line in (tmp_path / "passes.jsonl").read_text().splitlines()]
    assert len(trace) == eng.stats.passes and eng.stats.trace == []
    assert sum(t["prompt_rows"] + t["rows"] for t in trace) == eng.stats.rows
    assert sum(t["prompt_rows"] for t in trace) == sum(len(p) for p in prompts)  # every prompt token, once
    # each traced pass is one the engine counted, in order: its sequences, and its seconds (added in order)
    assert [t["sequences"] for t in trace] == eng.stats.batch_sizes
    assert functools.reduce(operator.add, (t["seconds"] for t in trace), 0.0) == eng.stats.seconds
    # every sequence in a pass brings a row or more: a prompt chunk to prompt_rows, the others to rows
    assert all((t["prompting"] == 0) == (t["prompt_rows"] == 0) and t["prompting"] <= t["prompt_rows"]
               and (t["prompting"] == t["sequences"]) == (t["rows"] == 0) and t["sequences"] - t["prompting"] <= t["rows"]
               for t in trace)
    assert max(t["context"] for t in trace) > max(len(p) for p in prompts)
    for spec, want, res in zip(KINDS + ("(a reused slot)",), plain, got):
        assert res.token_ids == want, spec
    # prompt i ran in slot i: every kind of draft proposed, and the model rejected some
    assert all(res.stats.proposed > 0 for res in got[1 : len(KINDS)]), [r.stats.proposed for r in got]
    assert sum(r.stats.accepted for r in got) < sum(r.stats.proposed for r in got)
    assert max(eng.stats.batch_sizes) == len(KINDS)
    assert eng.running == 0 and eng.free == len(KINDS)


EAGLE_KINDS = ("eagle:default", "suffix:cache=0+eagle:default", "eagle:default,topk=4,depth=4")


@pytest.mark.real_model
def test_the_shipped_head_and_hybrid_batched_equal_plain_decoding(batched_model: Any, prompts: list[list[int]]) -> None:
    """The shipped EAGLE head (chain and tree) and the suffix hybrid, six prompts in three slots
    (each slot reused, its features recorded afresh): every answer is plain greedy's, and each
    draft proposes and has accepted exactly what it does alone."""
    plain = [generate(batched_model, p, max_new_tokens=16, draft="none").token_ids for p in prompts]
    specs = [EAGLE_KINDS[i % 3] for i in range(len(prompts))]
    alone = [generate(batched_model, p, max_new_tokens=16, draft=spec, k=4) for p, spec in zip(prompts, specs)]
    eng = Engine(batched_model, max_batch=3, context=1024, prefill_chunk=32)
    got: dict[int, Any] = {}
    todo = list(range(len(prompts)))

    def job(i: int) -> Any:
        def run(model: Any) -> None:  # prompt i's own draft, on whichever slot it got
            got[i] = generate(model, prompts[i], max_new_tokens=16, draft=make_drafter(specs[i], model), k=4)
        return run

    eng.run(lambda free, idle: [job(todo.pop(0)) for _ in range(min(free, len(todo)))] if todo else None)
    assert [got[i].token_ids for i in range(len(prompts))] == plain
    assert [(got[i].stats.proposed, got[i].stats.accepted) for i in range(len(prompts))] == [
        (r.stats.proposed, r.stats.accepted) for r in alone]
    assert all(r.stats.accepted > 0 for r in alone) and max(eng.stats.batch_sizes) == 3


@pytest.mark.real_model
def test_sampled_with_a_seed_is_the_same_alone_and_batched(batched_model: Any, prompts: list[list[int]]) -> None:
    """Plain and lookup generations side by side in the same passes, each with its own seed."""
    cfgs = [SamplingConfig(temperature=0.8, top_p=0.95, seed=100 + i) for i in range(len(prompts))]
    specs = ["none", "lookup"] * (len(prompts) // 2)  # prompt i runs in slot i (8 slots, 6 prompts)
    want = [generate(batched_model, p, max_new_tokens=10, sampling=c, draft=spec, k=3).token_ids
            for p, c, spec in zip(prompts, cfgs, specs)]
    eng = Engine(batched_model, max_batch=8, context=1024)
    drafters = [make_drafter(spec, batched_model) for spec in specs] + [None, None]
    got = eng.generate_all(prompts, max_new_tokens=10, sampling=cfgs, drafters=drafters, k=3)
    assert [r.token_ids for r in got] == want
    assert all(r.stats.proposed > 0 for r in got[1::2]) and max(eng.stats.batch_sizes) == len(prompts)


@pytest.mark.real_model
def test_a_failing_generation_ends_alone(batched_model: Any, prompts: list[list[int]]) -> None:
    eng = Engine(batched_model, max_batch=4, context=256)
    outcome: dict[int, Any] = {}

    def job(i: int, ids: list[int], n: int):
        def run(model: Any) -> None:
            try:
                outcome[i] = generate(model, ids, max_new_tokens=n, draft="none").token_ids
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
            from draftwise.core.draft import Draft

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
    assert outcome[0] == generate(batched_model, prompts[0], max_new_tokens=8, draft="none").token_ids
    assert outcome[2] == generate(batched_model, prompts[2], max_new_tokens=8, draft="none").token_ids


@pytest.mark.real_model
def test_each_prompt_its_own_budget(batched_model: Any, prompts: list[list[int]]) -> None:
    """``max_new_tokens`` per prompt: each generation stops at its own, as it would alone."""
    budgets = [3, 11, 6]
    eng = Engine(batched_model, max_batch=3, context=1024)
    got = eng.generate_all(prompts[:3], max_new_tokens=budgets)
    want = [generate(batched_model, p, max_new_tokens=n, draft="none").token_ids for p, n in zip(prompts, budgets)]
    assert [r.token_ids for r in got] == want
    assert [len(r.token_ids) for r in got] == budgets  # none of these ends early
    with pytest.raises(ConfigError, match="2 max_new_tokens and 3 sampling configs for 3 prompts"):
        eng.generate_all(prompts[:3], max_new_tokens=[4, 4])


def pass_rows(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> list[dict[int, int]]:
    """Filled as ``eng`` runs: per pass, slot -> rows."""
    rows: list[dict[int, int]] = []
    forward = eng.runtime.forward_batch

    def spy(passes: Any, **kw: Any) -> Any:
        rows.append({p.slot: len(p.ids) for p in passes})
        return forward(passes, **kw)

    monkeypatch.setattr(eng.runtime, "forward_batch", spy)
    return rows


@pytest.mark.real_model
def test_prompts_enter_in_small_chunks_only_while_decoders_outnumber_them(
        batched_model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """engine.step_chunk: a burst of prompts enters in one pass each; a long prompt that joins
    three decoding generations enters prefill_chunk rows a pass; every answer is the one alone."""
    long = prompts[5]
    assert len(long) > 3 * 8
    eng = Engine(batched_model, max_batch=4, context=1024, prefill_chunk=8)
    rows = pass_rows(eng, monkeypatch)
    got: dict[int, list[int]] = {}

    new = [len(long) // 8 + 8] * 3 + [8]  # the first three decode all through the long prompt's

    def job(i: int, ids: list[int]):
        def run(model: Any) -> None:
            got[i] = generate(model, ids, max_new_tokens=new[i], draft="none").token_ids

        return run

    for i in range(3):
        eng.start(job(i, prompts[i]))
    eng.step()
    assert rows == [{i: len(prompts[i]) for i in range(3)}]  # no one decodes yet: whole prompts at once
    eng.step()
    eng.start(job(3, long))  # 1 prefilling against 3 decoding
    while eng.running:
        eng.step()
    chunks = [r[3] for r in rows if 3 in r][: -(-len(long) // 8)]
    assert sum(chunks) == len(long) and set(chunks[:-1]) == {8}, chunks
    for i, ids in enumerate(prompts[:3] + [long]):
        assert got[i] == generate(batched_model, ids, max_new_tokens=new[i], draft="none").token_ids, i


@pytest.mark.real_model
def test_a_prompt_beside_speculating_decoders_enters_as_many_rows_as_they_bring(
        batched_model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """engine.step_chunk: three decoders verifying k + 1 = 6 rows a pass let a joining prompt in
    18 tokens a pass, not prefill_chunk's 8; every answer is still the one alone."""
    from draftwise.core.draft import Draft

    class Wrong:  # proposes k tokens every step: each decoder brings k + 1 rows a pass
        name, capabilities = "wrong", make_drafter("lookup", batched_model).capabilities

        def start(self, *args: Any) -> None: ...

        def propose(self, context: list[int], k: int) -> Any:
            return Draft([0] * k)

        def observe(self, accepted: int) -> None: ...

        def end(self, output: Any) -> None: ...

    long = prompts[5]
    eng = Engine(batched_model, max_batch=4, context=1024, prefill_chunk=8)
    rows = pass_rows(eng, monkeypatch)
    got: dict[int, list[int]] = {}
    new = len(long) // 18 + 8

    def job(i: int, ids: list[int], draft: Any):
        def run(model: Any) -> None:
            got[i] = generate(model, ids, max_new_tokens=new, draft=draft, k=5).token_ids

        return run

    for i in range(3):
        eng.start(job(i, prompts[i], Wrong()))
    eng.step()
    eng.step()
    assert rows[-1] == {0: 6, 1: 6, 2: 6}
    eng.start(job(3, long, "none"))
    while eng.running:
        eng.step()
    chunks = [r[3] for r in rows if 3 in r][: -(-len(long) // 18)]
    assert sum(chunks) == len(long) and set(chunks[:-1]) == {18}, chunks
    for i, ids in enumerate(prompts[:3] + [long]):
        assert got[i] == generate(batched_model, ids, max_new_tokens=new, draft="none").token_ids, i


@pytest.mark.real_model
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


def test_the_pass_trace_is_written_when_the_batch_empties_or_grows_long(tmp_path: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    class Held:
        stats = engine_mod.PassStats()

    path = tmp_path / "t.jsonl"
    pass_trace.attach(Held)
    assert Held.stats.trace is None  # no file named: nothing is kept
    monkeypatch.setenv(pass_trace.TRACE_ENV, str(path))
    pass_trace.attach(Held)
    assert Held.stats.trace is not None
    Held.stats.trace.extend([(2, 0, 0, 2, 100, 0.01)] * 3)
    pass_trace.flush(Held, idle=False)  # under load, 3 passes held: kept for later
    assert not path.exists() and len(Held.stats.trace) == 3
    Held.stats.trace.extend([(2, 1, 16, 1, 90, 0.02)] * (pass_trace.FLUSH_EVERY - 3))
    pass_trace.flush(Held, idle=False)
    lines = path.read_text().splitlines()
    assert len(lines) == pass_trace.FLUSH_EVERY and Held.stats.trace == []
    assert json.loads(lines[-1]) == {"sequences": 2, "prompting": 1, "prompt_rows": 16, "rows": 1, "context": 90,
                                     "seconds": 0.02}
