"""EAGLE heads and hybrids in the batched engine: each slot records its own features.

On the tiny random chat model, with a head that mostly copies its input feature (so some of its
proposals are accepted and some rejected) and a random EAGLE-3 head reading three other layers:

- every EAGLE draft (chain, tree, EAGLE-3, the suffix hybrid) run in a batch of three gives, per
  prompt, exactly the tokens and the draft statistics (proposed, accepted, target passes) of the
  same generation run alone with a fresh drafter. A slot reading another slot's features, or
  features a pass did not record, proposes other tokens and fails the statistics;
- a batch mixing an EAGLE draft, lookup, plain decoding and the other head equals each alone;
- the slots' drafters share one copy of the head and of the target's parts;
- a slot whose generation ended stops recording; an EAGLE sequence reuses a cached prefix and its
  head starts at the copy's end (a copied prefix has no features), with plain decoding's answer;
- the runtime's per-slot features match what a single-sequence pass records, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from draftwise import load_model
from draftwise.core import decode
from draftwise.core.engine import Engine
from draftwise.drafters.factory import make_drafter
from draftwise.eagle.head import HeadCache
from draftwise.runtime.base import Rows
from draftwise.runtime.prefix_cache import PrefixCache

from .benchmark_scripts import load_benchmark
from .eagle_heads import head_folder

N = 24
K = 4
STATS = ("proposed", "accepted", "target_passes")
PROMPTS = ["one two three four five one two three four five", "The numbers: 1 2 3 1 2 3",
           "a b c d a b c d a b c d e"]


@pytest.fixture(scope="module")
def model(tiny_chat_folder: Any, one_thread: Any) -> Any:
    """A model of its own: the engine re-allocates its runtime's cache in slots."""
    return load_model(str(tiny_chat_folder))


@pytest.fixture(scope="module")
def heads(model: Any, tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("engine-heads")
    a = head_folder(model, root / "a", arch="eagle1", seed=0, copy_feature=True)
    c = head_folder(model, root / "c", arch="eagle3", seed=2)
    return {"chain": f"eagle:{a}", "tree": f"eagle:{a},topk=3,depth=3", "eagle3": f"eagle:{c}",
            "hybrid": f"suffix:cache=0+eagle:{a}"}


def _ids(model: Any) -> list[list[int]]:
    return [model.encode_prompt(p) for p in PROMPTS]


def _alone(model: Any, ids: list[int], spec: str | None) -> Any:
    drafter = None if spec is None else make_drafter(spec, model)
    return decode.generate(model, ids, max_new_tokens=N, draft=drafter, k=K)


def _batched(engine: Engine, prompts: list[list[int]], specs: list[str | None], **kw: Any) -> list[Any]:
    """``prompts[i]`` in slot ``i`` with draft ``specs[i]`` (a new engine's slots free in order)."""
    slots = engine.slot_models
    drafters = [None if s is None else make_drafter(s, slots[i]) for i, s in enumerate(specs)]
    return engine.generate_all(prompts, max_new_tokens=N, drafters=drafters, k=K, **kw)


def _stats(result: Any) -> tuple[int, ...]:
    return tuple(getattr(result.stats, s) for s in STATS)


@pytest.mark.parametrize("kind", ["chain", "tree", "eagle3", "hybrid"])
def test_each_eagle_draft_batched_equals_it_alone(model: Any, heads: dict[str, str], kind: str) -> None:
    prompts = _ids(model)
    alone = [_alone(model, ids, heads[kind]) for ids in prompts]
    plain = [_alone(model, ids, None) for ids in prompts]
    engine = Engine(model, max_batch=3, context=256)
    batched = _batched(engine, prompts, [heads[kind]] * 3)
    for a, b, p in zip(alone, batched, plain):
        assert b.token_ids == a.token_ids == p.token_ids
        assert _stats(b) == _stats(a)
    assert sum(r.stats.accepted for r in alone) > 0 or kind == "eagle3"  # some proposals pass: earned equality
    assert engine.stats.batch_sizes and max(engine.stats.batch_sizes) == 3  # the three ran in the same passes
    if kind != "tree":  # greedy chains (the hybrid's too) gather their head steps: three in one call
        assert max(engine.gathered) == 3


def test_a_mixed_batch_equals_each_alone(model: Any, heads: dict[str, str]) -> None:
    prompts = _ids(model) + [_ids(model)[0][:9]]
    specs: list[str | None] = [heads["chain"], "lookup", None, heads["eagle3"]]
    alone = [_alone(model, ids, s) for ids, s in zip(prompts, specs)]
    engine = Engine(model, max_batch=4, context=256)
    batched = _batched(engine, prompts, specs)
    for a, b in zip(alone, batched):
        assert b.token_ids == a.token_ids and _stats(b) == _stats(a)
    assert max(engine.stats.batch_sizes) == 4


def test_the_slots_share_one_head_and_stop_recording_when_their_generation_ends(model: Any,
                                                                                heads: dict[str, str]) -> None:
    engine = Engine(model, max_batch=2, context=256)
    first, second = (make_drafter(heads["chain"], m) for m in engine.slot_models)
    assert first.head is second.head and first.parts is second.parts
    assert first.cache is not second.cache  # each sequence its own head state
    _batched(engine, _ids(model)[:2], [heads["chain"]] * 2)
    assert [engine.runtime.slot_feature_width(s) for s in range(2)] == [0, 0]


def test_an_eagle_sequence_reuses_a_cached_prefix_and_its_head_starts_after_it(model: Any,
                                                                              heads: dict[str, str]) -> None:
    """A copied prefix has no target features: the slot records from the copy's end on, the head
    starts there (it attends to no row before it), and the answer is plain decoding's."""
    prompts = _ids(model)[:2]
    engine = Engine(model, max_batch=2, context=256)
    cache = PrefixCache(max_bytes=32 << 20)
    long = [prompts[0] * 3, prompts[0] * 3 + prompts[1]]  # the second's first 30-odd tokens are the first's
    warm = engine.generate_all(long[:1], max_new_tokens=2, prefix_cache=cache)
    assert warm[0].cached_tokens == 0
    seen: dict[str, int] = {}

    def job(spec: str | None) -> Any:
        def run(slot_model: Any) -> Any:
            drafter = None if spec is None else make_drafter(spec, slot_model)
            stream = decode.stream(slot_model, long[1], max_new_tokens=N, draft=drafter, k=K, prefix_cache=cache)
            for _ in stream.by_step():
                if spec is not None:
                    seen.setdefault("feature_start", slot_model.runtime.feature_start)
                    with pytest.raises(Exception, match="copied from a prefix cache"):
                        slot_model.runtime.features(0, 1)
            seen[str(spec)] = stream.result
        return run

    todo = [job(heads["chain"]), job(None)]
    engine.run(lambda free, idle: [todo.pop(0) for _ in range(min(free, len(todo)))] if todo else None)
    eagle, plain = seen[heads["chain"]], seen["None"]
    # the second to start waited for the first's prefill (PrefixCache.in_flight): it reuses more
    assert eagle.cached_tokens == seen["feature_start"] > 0 and plain.cached_tokens > 0
    assert eagle.token_ids == plain.token_ids == _alone(model, long[1], None).token_ids
    assert eagle.stats.proposed > 0 and eagle.stats.accepted > 0  # the head drafted from its first real row


def test_per_slot_features_are_those_a_pass_of_its_own_records(model: Any) -> None:
    rt = model.runtime
    engine = Engine(model, max_batch=3, context=128)
    ids = _ids(model)
    layers = (0, 1)
    rt.capture_slot_features(1, layers)
    rt.capture_slot_features(2, None)
    rt.forward_batch([Rows(0, ids[0]), Rows(1, ids[1]), Rows(2, ids[2])])
    batched = [rt.slot_features(1, 0, len(ids[1])), rt.slot_features(2, 0, len(ids[2]))]
    assert rt.slot_feature_width(0) == 0
    for slot, taps in ((1, layers), (2, None)):
        for s in range(3):
            rt.rollback_slot(s, 0)
        rt.capture_slot_features(slot, enabled=False)
        rt.capture_features(taps)  # slot 0, one sequence
        rt.forward_batch([Rows(0, ids[slot])])
        alone = rt.features(0, len(ids[slot]))
        assert torch.equal(alone, batched[slot - 1])
        rt.capture_features(enabled=False)
    del engine


@pytest.mark.parametrize("batch", [True, False])
def test_gathered_calls_run_once_per_key_or_one_each(model: Any, batch: bool) -> None:
    engine = Engine(model, max_batch=4, context=64)
    engine.batch_drafts = batch
    calls: list[list[Any]] = []
    got: dict[int, Any] = {}

    def run(items: list[Any]) -> list[Any]:
        calls.append(list(items))
        if any(item == ("b", 4) for item in items):
            raise RuntimeError("the draft broke")
        return [item[1] * 10 for item in items]

    def job(i: int) -> Any:
        def go(slot_model: Any) -> None:
            key = "a" if i < 2 else "b"  # two keys: two calls, whatever the order they asked in
            try:
                got[i] = [slot_model.runtime.gather(key, (key, i + r), run) for r in range(2)]
            except RuntimeError as exc:
                got[i] = str(exc)
        return go

    todo = list(range(4))
    engine.run(lambda free, idle: [job(todo.pop(0)) for _ in range(min(free, len(todo)))] if todo else None)
    assert got[0] == [0, 10] and got[1] == [10, 20]
    if batch:  # per round, one call per key; "b" breaks in its second round, failing both its sequences
        assert sorted(map(len, calls)) == [2, 2, 2, 2] and got[2] == got[3] == "the draft broke"
    else:  # one call each: only the sequence whose item breaks fails
        assert sorted(map(len, calls)) == [1] * 8 and got[2] == [20, 30] and got[3] == "the draft broke"
    assert engine.running == 0 and engine.free == 4


def test_time_head_steps_times_one_call_for_all_and_one_each(model: Any, heads: dict[str, str]) -> None:
    """benchmarks/head_gather.py's timing: per size, one gathered call and (asked) n calls of one."""
    time_head_steps = load_benchmark("head_gather").time_head_steps
    drafter = make_drafter(heads["chain"], model)
    timed = time_head_steps(drafter, [1, 3], context=16, rounds=2, alone=True)
    assert set(timed) == {1, 3} and all(t > 0 and a is not None and a > 0 for t, a in timed.values())
    assert all(a is None for _, a in time_head_steps(drafter, [2], context=8, rounds=1).values())
    assert drafter.cache.length == 0  # the timing used caches of its own


def test_the_head_attends_to_no_row_before_its_cache_s_first(model: Any, heads: dict[str, str]) -> None:
    """Rows before ``HeadCache.first`` hold nothing (NaN here): a chain's and a tree's steps are
    finite and the same whatever those rows hold."""
    drafter = make_drafter(heads["chain"], model)
    head, parts, cfg = drafter.head, drafter.parts, drafter.head.cfg
    d = cfg.hidden_size
    gen = torch.Generator().manual_seed(3)
    feats, tokens = torch.randn(6, d, generator=gen), [5, 6, 7, 8, 9, 10]
    outs = []
    for fill in (float("nan"), 0.0):
        cache = HeadCache(cfg, 32)
        cache.k[:, :, :4] = fill
        cache.v[:, :, :4] = fill
        cache.length = cache.first = 4  # positions 0..3 came from a prefix cache
        with torch.inference_mode():
            out = head(parts.embed(tokens)[None], feats[None], torch.arange(4, 10)[None], cache)[0]
            mask = torch.ones(2, cache.length + 2, dtype=torch.bool)
            tree = head(parts.embed([1, 2])[None], out[-2:][None], torch.full((1, 2), 10), cache, attn_mask=mask)[0]
        assert torch.isfinite(out).all() and torch.isfinite(tree).all()
        outs.append((out, tree))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
