"""The prefix cache (``draftwise.runtime.prefix_cache``): a prompt reuses the K/V of the longest
cached prefix and prefills only the rest, bit for bit what prefilling it gives.

- the cache alone: the longest chain and the block after it, one token left to prefill, LRU under
  the byte bound, pinned blocks never evicted, one runtime per cache, bad sizes refused;
- the runtime: a reused prefix gives the logits of its prefill (float32 and bfloat16, both
  attention paths), a kept tree path and a chain are cached the same, a pending tree or a draft
  pass on some layers is not cached, a bad ``prefill(start=...)`` is refused;
- the loop and the engine: greedy with the cache equals greedy without, alone and batched, with
  and without speculation; races (two requests on one new prefix, a prefix evicted while its
  request decodes, a request that ends during a shared prefill, many distinct prefixes) corrupt
  nothing and keep the bound; a Conversation keeps its K/V between turns.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from draftwise import Conversation, PrefixCache, generate, load_model
from draftwise.core import engine as engine_mod
from draftwise.core.decode import Stream, decode_steps
from draftwise.core.engine import Engine
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.factory import make_drafter
from draftwise.errors import ConfigError, ContextLengthError, DraftwiseError
from draftwise.runtime import kernels
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config

B = 16  # the default block


def fake_read(start: int, end: int) -> torch.Tensor:
    return torch.full((2, 1, end - start, 2), float(start))  # 16 bytes a position


BLOCK_BYTES = 16 * B


# -- the cache alone ---------------------------------------------------------------------------
def test_a_lookup_takes_the_longest_chain_then_what_the_next_block_shares() -> None:
    cache = PrefixCache(1 << 20)
    seq = list(range(3, 3 + 3 * B + 5))  # three full blocks and 5 tokens
    assert cache.insert(seq, fake_read, block_bytes=BLOCK_BYTES) == 3 and len(cache) == 3
    assert cache.insert(seq, fake_read, block_bytes=BLOCK_BYTES) == 0  # cached once
    cases = [
        (seq, len(seq) - 1, 3 * B),  # the chain, and nothing after it is cached
        (seq[: 3 * B], 3 * B - 1, 3 * B - 1),  # exactly cached: all but the last token
        (seq[:B] + [1] * 20, 35, B),  # leaves the chain after one block
        (seq[: B + 5] + [1] * 20, 40, B + 5),  # leaves it inside the second block
        (seq[:7], 6, 6),  # a short prompt inside the first block
        ([1] + seq[1:], 40, 0),  # differs at the first token
    ]
    for ids, usable, want in cases:
        with cache.lookup(ids, usable=usable) as lease:
            assert lease.tokens == want, (ids[:3], usable)
            if want:
                kv = lease.kv()
                assert kv.shape == (2, 1, want, 2)
                assert kv[0, 0, :, 0].tolist() == [float(p // B * B) for p in range(want)]  # each block's own K/V
    assert all(b.refs == 0 for b in cache._blocks.values())  # every lease released
    assert cache.queries == sum(len(c[0]) for c in cases) and cache.hits == sum(c[2] for c in cases)


def test_a_tail_keeps_the_positions_after_the_last_full_block() -> None:
    """What a chat's next turn needs: the whole of the answer before it, not its full blocks only."""
    cache = PrefixCache(1 << 20)
    seq = list(range(3, 3 + 3 * B + 5))  # three full blocks and a tail of 5
    assert cache.insert(seq, fake_read, block_bytes=BLOCK_BYTES, tail=True) == 4
    assert cache.insert(seq, fake_read, block_bytes=BLOCK_BYTES, tail=True) == 0  # cached once
    assert cache.insert(seq[:-2], fake_read, block_bytes=BLOCK_BYTES, tail=True) == 0  # a tail holds it
    assert cache.bytes == 4 * BLOCK_BYTES and cache.cached(seq) == 3 * B  # whole blocks only for in_flight
    for ids, usable, want in [
        (seq + [1, 2], len(seq) + 1, len(seq)),  # the next turn: all of it
        (seq + [1, 2], len(seq) - 2, len(seq) - 2),  # no more than usable
        (seq[:-1] + [1], len(seq), len(seq) - 1),  # leaves the tail inside it
        (seq[: 3 * B + 2], 3 * B + 1, 3 * B + 1),  # exactly inside the tail: one token left to prefill
    ]:
        with cache.lookup(ids, usable=usable) as lease:
            assert lease.tokens == want
            assert lease.kv()[0, 0, :, 0].tolist() == [float(p // B * B) for p in range(want)]
    longer = seq + [1, 2, 3]  # the tail grows (8 tokens): it replaces the tail of 5
    assert cache.insert(longer, fake_read, block_bytes=BLOCK_BYTES, tail=True) == 1 and len(cache) == 4
    whole = longer + list(range(100, 108))  # a full block replaces the tail
    with cache.lookup(longer + [9], usable=len(longer)) as lease:  # ... unless it is pinned: then both stay
        assert lease.tokens == len(longer)
        assert cache.insert(whole, fake_read, block_bytes=BLOCK_BYTES, tail=True) == 1 and len(cache) == 5
        assert lease.kv()[0, 0, -1, 0].item() == 3 * B
    assert cache.insert(whole + [7], fake_read, block_bytes=BLOCK_BYTES, tail=True) == 1  # the old tail goes
    assert len(cache) == 5 and cache.lookup(whole + [7, 7], usable=len(whole) + 1).tokens == len(whole) + 1


@pytest.mark.parametrize("positions", [1, B, B + 3, 2 * B, 1000])
def test_runs_join_a_leases_blocks_into_copies_of_a_bounded_size(positions: int) -> None:
    cache = PrefixCache(1 << 20)
    seq = list(range(3, 3 + 5 * B + 7))
    cache.insert(seq, fake_read, block_bytes=BLOCK_BYTES, tail=True)
    with cache.lookup(seq + [1], usable=len(seq)) as lease:
        runs = list(lease.runs(positions))
        starts = [0] + [int(sum(kv.shape[2] for _, kv in runs[: i + 1])) for i in range(len(runs) - 1)]
        assert [start for start, _ in runs] == starts  # each run where the last ended
        assert all(kv.shape[2] <= max(positions, B) for _, kv in runs)  # a block is never split
        assert len(runs) == (len(list(lease.pieces())) if positions < 2 * B else -(-len(seq) // (positions // B * B)))
        assert torch.equal(torch.cat([kv for _, kv in runs], dim=2), lease.kv())


def test_a_full_cache_evicts_the_least_recently_used_leaf_and_stays_under_its_bound() -> None:
    cache = PrefixCache(4 * BLOCK_BYTES)
    a, b = [5] * (2 * B), [6] * (2 * B)
    cache.insert(a, fake_read, block_bytes=BLOCK_BYTES)
    cache.insert(b, fake_read, block_bytes=BLOCK_BYTES)
    cache.lookup(a, usable=2 * B).release()  # a is used again: b is the least recently used
    cache.insert([7] * B, fake_read, block_bytes=BLOCK_BYTES)
    assert cache.bytes <= cache.max_bytes and cache.evictions == 1
    assert cache.lookup(a, usable=2 * B).tokens == 2 * B  # a whole
    assert cache.lookup(b, usable=2 * B).tokens == B  # b lost its leaf, not its first block
    for n in range(20):  # far past the bound: it holds, and nothing is orphaned
        cache.insert([8 + n] * (3 * B), fake_read, block_bytes=BLOCK_BYTES)
        assert cache.bytes <= cache.max_bytes == 4 * BLOCK_BYTES
        ids = {blk.id for blk in cache._blocks.values()}
        assert all(key[0] == -1 or key[0] in ids for key in cache._blocks)
    assert cache.insert([1] * B, fake_read, block_bytes=cache.max_bytes + 1) == 0  # a block over the bound


def test_a_pinned_block_is_never_evicted() -> None:
    cache = PrefixCache(3 * BLOCK_BYTES)
    a = [5] * (2 * B)
    cache.insert(a, fake_read, block_bytes=BLOCK_BYTES)
    lease = cache.lookup(a, usable=2 * B)  # a copy of a is under way
    assert cache.insert([6] * (3 * B), fake_read, block_bytes=BLOCK_BYTES) == 1  # room for one block only
    assert cache.bytes <= cache.max_bytes
    assert lease.kv()[0, 0, :, 0].tolist() == [0.0] * B + [float(B)] * B  # a's K/V, whole
    lease.release()
    lease.release()  # twice is once
    with pytest.raises(ConfigError, match="released"):
        lease.kv()
    assert cache.insert([6] * (3 * B), fake_read, block_bytes=BLOCK_BYTES) == 2  # now a can go
    assert cache.lookup(a, usable=2 * B).tokens == 0


def test_random_use_keeps_the_bound_and_every_chain_whole() -> None:
    rng = random.Random(0)
    cache = PrefixCache(10 * BLOCK_BYTES)
    held: list[Any] = []
    for _ in range(300):
        ids = [rng.randrange(3, 6) for _ in range(rng.randrange(1, 5 * B))]
        if rng.random() < 0.5:
            cache.insert(ids, fake_read, block_bytes=BLOCK_BYTES, tail=rng.random() < 0.5)
        else:
            held.append(cache.lookup(ids, usable=len(ids) - 1))
            if held[-1].tokens:  # every position's K/V is its own
                assert held[-1].kv()[0, 0, :, 0].tolist() == [float(p // B * B) for p in range(held[-1].tokens)]
            if len(held) > 3:
                held.pop(0).release()
        assert cache.bytes == BLOCK_BYTES * len(cache) <= cache.max_bytes
        ids_held = {b.id for b in cache._blocks.values()}
        assert all(key[0] == -1 or key[0] in ids_held for key in cache._blocks)
        assert not any(cache._kids.get(b.id) for b in cache._blocks.values() if len(b.key[1]) < B)  # a tail ends a chain
        assert all(b in cache._blocks.values() for lease in held for b in lease.blocks)


def test_bad_sizes_and_another_runtime_are_refused(models: dict[str, Any]) -> None:
    for bad in (-1, 1.5, True, "256"):
        with pytest.raises(ConfigError, match="whole number"):
            PrefixCache.of_megabytes(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_tokens"):
        PrefixCache(1 << 20, block_tokens=0)
    assert PrefixCache.of_megabytes(0) is None and PrefixCache.of_megabytes(2).max_bytes == 2 << 20
    with pytest.raises(ConfigError, match="prefix_cache="):
        generate(models["float32"], [5, 6, 7], max_new_tokens=2, prefix_cache="yes")  # type: ignore[arg-type]
    cache = PrefixCache(1 << 20)
    generate(models["float32"], [5, 6, 7], max_new_tokens=2, prefix_cache=cache)
    with pytest.raises(ConfigError, match="another runtime"):  # another model's K/V, or another layout
        generate(models["bfloat16"], [5, 6, 7], max_new_tokens=2, prefix_cache=cache)


# -- the runtime ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state(one_thread: None) -> dict[str, torch.Tensor]:
    model = random_hf_model(tiny_llama_config(max_position_embeddings=512), seed=2)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def native(state: dict[str, torch.Tensor], dtype: torch.dtype, path: str) -> NativeRuntime:
    rt = NativeRuntime(tiny_llama_config(max_position_embeddings=512), state, dtype=dtype, max_context=512)
    if path == "kernel" and not rt.kernel_attention:
        pytest.skip(f"the attention kernel is not built here ({kernels.why_not()})")
    rt.kernel_attention = path == "kernel"
    return rt


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_reused_prefix_gives_the_logits_of_its_prefill(state: dict[str, torch.Tensor], dtype: torch.dtype,
                                                         path: str) -> None:
    """Cached from a sequence decoded by a prompt, a chain, a tree and a plain step, reused by
    prompts that leave it at a block's end, inside a block, or are exactly it."""
    rt = native(state, dtype, path)
    rng = random.Random(3)
    prompt = [rng.randrange(3, 96) for _ in range(137)]
    rt.prefill(prompt)
    chain = [rng.randrange(3, 96) for _ in range(4)]
    rt.forward(chain)
    rt.keep(137, [0, 1, 2])  # holds prompt + chain[:3]: 140
    tree = [rng.randrange(3, 96) for _ in range(4)]
    rt.forward(tree, parents=[-1, 0, 0, 1])
    rt.keep(140, [0, 1, 3])  # + tree[0], tree[1], tree[3]: 143
    rt.forward([9])  # 144: nine full blocks
    seq = prompt + chain[:3] + [tree[0], tree[1], tree[3], 9]
    cache = PrefixCache(1 << 20)
    assert rt.save_prefix(cache) == 9
    for query, reused in [(seq + [7, 8, 9], 144), (seq[:150 - 13] + [1, 2], 137), (seq[:144], 143)]:
        want = [rt.prefill(query), rt.forward([10, 11])]
        rt.rollback(0)  # an empty slot: all of it from the cache (what the slot holds is not copied)
        assert rt.reuse_prefix(query, cache) == reused
        got = [rt.prefill(query, start=reused), rt.forward([10, 11])]
        for g, w in zip(got, want):
            assert torch.equal(g, w), f"{len(query)} tokens: logits differ by {(g - w).abs().max().item()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_reused_tail_gives_the_logits_of_its_prefill(state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """A next turn reuses the positions after the last full block (its tail) too, bit for bit."""
    rt = native(state, dtype, "kernel")
    rng = random.Random(4)
    seq = [rng.randrange(3, 96) for _ in range(2 * B + 13)]
    rt.prefill(seq)
    cache = PrefixCache(1 << 20)
    assert rt.save_prefix(cache) == 3  # two blocks and a tail of 13
    query = seq + [7, 8, 9]
    want = [rt.prefill(query), rt.forward([10, 11])]
    rt.rollback(0)
    assert rt.reuse_prefix(query, cache) == len(seq)
    got = [rt.prefill(query, start=len(seq)), rt.forward([10, 11])]
    for g, w in zip(got, want):
        assert torch.equal(g, w), f"logits differ by {(g - w).abs().max().item()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_slot_keeps_the_prefix_it_holds_and_copies_only_what_follows(state: dict[str, torch.Tensor],
                                                                       dtype: torch.dtype) -> None:
    """A prompt that starts as the slot's last sequence did keeps those positions (no copy) and
    takes from the cache only the positions after them; either way the logits of its prefill."""
    rt, ref = native(state, dtype, "kernel"), native(state, dtype, "kernel")
    rng = random.Random(5)
    seq = [rng.randrange(3, 96) for _ in range(3 * B + 5)]

    def check(query: list[int], reused: int, cache: PrefixCache) -> None:
        assert rt.reuse_prefix(query, cache) == reused
        got = [rt.prefill(query, start=reused), rt.forward([10, 11])]
        want = [ref.prefill(query), ref.forward([10, 11])]
        for g, w in zip(got, want):
            assert torch.equal(g, w), f"logits differ by {(g - w).abs().max().item()}"

    rt.prefill(seq)
    empty = PrefixCache(1 << 20)
    check(seq[:40] + [7, 8, 9], 40, empty)  # the slot's own 40, with nothing cached
    assert empty.hits == 40 and empty.queries == 43
    rt.rollback(0)
    rt.prefill(seq)
    cache = PrefixCache(1 << 20)
    assert rt.save_prefix(cache) == 4  # three blocks and a tail of 5
    rt.rollback(20)  # the slot holds 20, the cache all of seq
    with torch.inference_mode():  # the cache's K/V of the positions the slot holds, spoilt: not copied
        blocks = sorted(cache._blocks.values(), key=lambda b: b.id)
        blocks[0].kv.fill_(1e4)
        blocks[1].kv[:, :, : 20 - B].fill_(1e4)
    check(seq + [7, 8], len(seq), cache)


def test_a_slot_holds_no_pending_tree_nor_a_draft_pass_on_some_layers(state: dict[str, torch.Tensor]) -> None:
    rt = native(state, torch.float32, "torch")
    prompt = list(range(3, 3 + 40))
    rt.prefill(prompt)
    rt.forward([5, 6, 7], parents=[-1, 0, 0])  # a tree not kept yet: its rows are not a chain
    assert rt.held_prefix(0, prompt + [5, 6, 7, 1]) == 40
    rt.keep(40, [0, 2])  # the path 5, 7
    assert rt.held_prefix(0, prompt + [5, 7, 1]) == 42 and rt.held_prefix(0, prompt + [5, 6, 1]) == 41
    rt.forward([8] * 3, layers=[0])  # a draft pass on one layer: stale in the others
    assert rt.held_prefix(0, prompt + [5, 7, 8, 8, 8, 1]) == 42
    assert rt.held_prefix(0, prompt[:10]) == 9  # all but the last token
    assert rt.held_prefix(0, [1] + prompt) == 0


def test_only_positions_that_hold_a_chain_of_full_passes_are_cached(state: dict[str, torch.Tensor]) -> None:
    rt = native(state, torch.float32, "torch")
    prompt = list(range(3, 3 + 40))
    rt.prefill(prompt)
    rt.forward([5, 6, 7], parents=[-1, 0, 0])  # a tree not kept yet: its rows are not a chain
    cache = PrefixCache(1 << 20)
    assert rt.save_prefix(cache) == 3  # 40 positions: two blocks and a tail of 8
    rt.keep(40, [0, 2])
    rt.forward([8] * 10, layers=[0])  # a draft pass on one layer: stale in the others
    assert rt.save_prefix(cache) == 1  # 42 known: a tail of 10 (it replaces the tail of 8)
    later = prompt + [5, 7] + [8] * 10 + [1]
    with cache.lookup(later, usable=52) as lease:
        assert lease.tokens == 42 and len(cache) == 3
    rt.rollback(42)
    rt.forward([8] * 10)
    assert rt.save_prefix(cache) == 2  # 52: a third block (it replaces the tail of 10) and a tail of 4
    with cache.lookup(later, usable=52) as lease:
        assert lease.tokens == 52 and len(cache) == 4


def test_a_bad_start_is_refused_and_a_compiled_runtime_reuses_nothing(state: dict[str, torch.Tensor]) -> None:
    rt = native(state, torch.float32, "torch")
    cache = PrefixCache(1 << 20)
    ids = list(range(3, 3 + 40))
    rt.prefill(ids)
    rt.save_prefix(cache)
    for start in (41, 40, 2):  # past the prompt, no token left, not what the slot holds
        rt.prefill([1] * 40)
        with pytest.raises(ConfigError, match=f"prefill\\(start={start}\\)"):
            rt.prefill(ids, start=start)
    assert rt.reuse_prefix(ids, cache) == 39  # two blocks and 7 of the tail's 8 (one token to prefill)
    rt.compiled = True  # (not compiled: only what the runtime says about it)
    assert not rt.reuses_prefixes and rt.reuse_prefix(ids, cache) == 0 and rt.save_prefix(cache) == 0


# -- the loop and the engine ---------------------------------------------------------------------
SYSTEM = "You are a careful assistant. Answer briefly and repeat the key words of the question. " * 2
QUESTIONS = ["Name three colours.", "Count to five.", "What is the sea?", "Name three colours.",
             "Say hello to the sea."]


@pytest.fixture(scope="module")
def models(tiny_chat_folder: Any, one_thread: None) -> dict[str, Any]:
    """One model per dtype for references and one-at-a-time runs, and one per dtype for the
    engine (which splits its runtime's cache into slots)."""
    return {f"{d}{'-engine' if e else ''}": load_model(str(tiny_chat_folder), dtype=d)
            for d in ("float32", "bfloat16") for e in (False, True)}


def scenario(model: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts with a shared system prefix, a repeat, one that is exactly a cached prefix and one
    that continues an earlier prompt's answer (the next turn of a chat); their greedy answers."""
    prompts = [model.encode_prompt(SYSTEM + q) for q in QUESTIONS]
    want = [generate(model, p, max_new_tokens=20, draft="none").token_ids for p in prompts]
    prompts += [prompts[0][: 2 * B], prompts[1] + want[1] + [2, 198, 1]]
    want += [generate(model, p, max_new_tokens=20, draft="none").token_ids for p in prompts[len(want) :]]
    return prompts, want


@pytest.mark.parametrize("max_batch", [1, 3])
@pytest.mark.parametrize("spec", ["none", "lookup", "suffix"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_with_the_cache_equals_greedy_without(models: dict[str, Any], dtype: str, spec: str,
                                                     max_batch: int) -> None:
    model = models[dtype]
    prompts, want = scenario(model)
    cache = PrefixCache(1 << 20)
    if max_batch == 1:
        got = [generate(model, p, max_new_tokens=20, draft=spec, prefix_cache=cache) for p in prompts]
    else:
        eng = Engine(models[f"{dtype}-engine"], max_batch=max_batch, context=256, prefill_chunk=8)
        drafters = [make_drafter(spec, slot) for slot in eng.slot_models]
        got = eng.generate_all(prompts, max_new_tokens=20, drafters=drafters, k=4, prefix_cache=cache)
    for i, (res, ids) in enumerate(zip(got, want)):
        assert res.token_ids == ids, f"prompt {i}"
        assert 0 <= res.cached_tokens < len(prompts[i])
    cached = [r.cached_tokens for r in got]
    assert cached[3] == len(prompts[3]) - 1  # a repeat: everything but its last token
    assert cached[5] == 2 * B - 1  # exactly a cached prefix: still one token prefilled
    assert cached[6] > len(prompts[1])  # the next turn reuses the answer too
    assert cache.hits == sum(cached) and cache.queries == sum(map(len, prompts))
    if spec != "none":
        assert sum(r.stats.proposed for r in got) > 0


def run_jobs(eng: Engine, jobs: list[Any]) -> list[Any]:
    """Run each job (``job(slot_model) -> result``) in the engine as slots free up, in order."""
    out: list[Any] = [None] * len(jobs)
    todo = list(range(len(jobs)))

    def wrap(i: int) -> Any:
        def run(slot_model: Any) -> None:
            try:
                out[i] = jobs[i](slot_model)
            except DraftwiseError as exc:
                out[i] = exc
        return run

    def admit(free: int, idle: bool) -> list[Any] | None:
        if not todo:
            return None
        return [wrap(todo.pop(0)) for _ in range(min(free, len(todo)))]

    eng.run(admit)
    return out


def greedy(ids: list[int], cache: PrefixCache, tokens: int = 20) -> Any:
    def job(slot_model: Any) -> Any:
        s = Stream(slot_model, ids, max_new_tokens=tokens, sampling=SamplingConfig(), stop=(), prefix_cache=cache)
        for _ in s.by_step():
            pass
        return s.result
    return job


def full_blocks(cache: PrefixCache) -> list[tuple[int, ...]]:
    """The token ids from position 0 through each full block the cache holds, sorted (a block
    cached twice is in it twice; the tails, which depend on the order sequences ended, are not)."""
    by_id = {b.id: b for b in cache._blocks.values()}

    def path(b: Any) -> tuple[int, ...]:
        return b.key[1] if b.key[0] == -1 else path(by_id[b.key[0]]) + b.key[1]

    return sorted(path(b) for b in cache._blocks.values() if len(b.key[1]) == cache.block_tokens)


def test_the_engine_starts_a_prompt_in_the_slot_that_holds_most_of_it(models: dict[str, Any]) -> None:
    """A chat's next turn goes to the slot its last turn ran in (not the one free the longest), and
    reuses what it holds with an empty cache, to the tokens decoding it alone gives."""
    model, eng_model = models["float32"], models["float32-engine"]
    prompts = [model.encode_prompt(SYSTEM + q) for q in QUESTIONS[:3]]
    eng = Engine(eng_model, max_batch=3, context=256, prefill_chunk=8)
    first = eng.generate_all(prompts, max_new_tokens=8, prefix_cache=PrefixCache(1 << 20))
    rt = eng.runtime
    last = eng._free[-1]  # the slot free the shortest: the default pick takes another
    i = next(i for i, p in enumerate(prompts) if rt.held_prefix(last, p) == len(p) - 1)
    follow = prompts[i] + first[i].token_ids + [2, 198, 1]
    held = rt.held_prefix(last, follow)
    assert held >= len(prompts[i]) + len(first[i].token_ids) - 1
    assert all(rt.held_prefix(s, follow) < held for s in eng._free if s != last)
    got = eng.generate_all([follow], max_new_tokens=20, prefix_cache=PrefixCache(1 << 20))[0]
    assert got.cached_tokens == held
    assert got.token_ids == generate(model, follow, max_new_tokens=20).token_ids


def test_two_requests_racing_for_one_new_prefix(models: dict[str, Any]) -> None:
    model, eng_model = models["float32"], models["float32-engine"]
    shared = model.encode_prompt(SYSTEM * 2 + "Name three colours.")
    prompts = [shared + [300, 301], shared + [302]]
    want = [generate(model, p, max_new_tokens=20).token_ids for p in prompts]
    cache = PrefixCache(1 << 20)
    eng = Engine(eng_model, max_batch=2, context=256, prefill_chunk=8)
    got = run_jobs(eng, [greedy(p, cache) for p in prompts])  # the second waits for the first's prefill
    whole = len(shared) // B * B
    assert [r.token_ids for r in got] == want and got[0].cached_tokens == 0 and got[1].cached_tokens >= whole
    alone = PrefixCache(1 << 20)
    for p in prompts:
        generate(model, p, max_new_tokens=20, prefix_cache=alone)
    assert full_blocks(cache) == full_blocks(alone)  # each block once
    third = run_jobs(eng, [greedy(shared + [303], cache)])[0]
    assert third.token_ids == generate(model, shared + [303], max_new_tokens=20).token_ids
    assert third.cached_tokens == len(shared)


def test_a_prefix_evicted_while_its_request_decodes(models: dict[str, Any]) -> None:
    model, eng_model = models["float32"], models["float32-engine"]
    first = model.encode_prompt(SYSTEM + "Name three colours.")
    others = [model.encode_prompt(f"Question {i}: what is {i} and {i}? " * 4) for i in range(8)]
    cache = PrefixCache(12 * B * 768)  # 12 blocks of the tiny model (768 bytes a position)
    generate(eng_model, first, max_new_tokens=4, prefix_cache=cache)  # (the cache serves one runtime)
    key = next(iter(cache._blocks))  # the first block of `first`
    eng = Engine(eng_model, max_batch=2, context=256, prefill_chunk=8)
    seen: list[bool] = []

    def job_a(slot_model: Any) -> Any:
        s = Stream(slot_model, first + [400], max_new_tokens=60, sampling=SamplingConfig(), stop=(),
                   prefix_cache=cache)
        for _ in s.by_step():
            seen.append(key in cache._blocks)
        return s.result

    got = run_jobs(eng, [job_a] + [greedy(p, cache, 4) for p in others])
    assert got[0].cached_tokens == len(first) and got[0].token_ids == generate(
        model, first + [400], max_new_tokens=60).token_ids
    assert seen[0] and not all(seen), "the prefix was not evicted while its request decoded"
    assert cache.evictions > 0 and cache.bytes <= cache.max_bytes
    for p, res in zip(others, got[1:]):
        assert res.token_ids == generate(model, p, max_new_tokens=4).token_ids


def test_a_request_that_ends_during_a_shared_prefill(models: dict[str, Any], monkeypatch: Any) -> None:
    """Two requests prefill one new prefix together; one fails at its third chunk (as a pass that
    cannot run ends its sequence), a third is closed right after its first token (where the server
    cancels). The other's answer, the cache and a later request on the prefix are untouched."""
    model, eng_model = models["float32"], models["float32-engine"]
    shared = model.encode_prompt(SYSTEM * 2 + "Count to five.")
    cache = PrefixCache(1 << 20)
    eng = Engine(eng_model, max_batch=3, context=256, prefill_chunk=8)
    monkeypatch.setattr(engine_mod, "BURST_CHUNK", 8)  # every prompt in chunks of 8, even alone
    real, chunks = eng.runtime.forward_batch, [0]

    def flaky(passes: Any, layers: Any = None) -> Any:
        for p in passes:
            if p.slot == 0 and not p.logits:
                chunks[0] += 1
                if chunks[0] >= 3:
                    raise ContextLengthError("injected: this chunk cannot run")
        return real(passes, layers=layers)

    monkeypatch.setattr(eng.runtime, "forward_batch", flaky)

    def closed(slot_model: Any) -> Any:
        s = Stream(slot_model, shared + [7], max_new_tokens=20, sampling=SamplingConfig(), stop=(),
                   prefix_cache=cache)
        next(iter(s.by_step()))
        s.close()
        return s

    got = run_jobs(eng, [greedy(shared + [5], cache), greedy(shared + [6], cache), closed])
    assert isinstance(got[0], ContextLengthError)
    assert got[1].token_ids == generate(model, shared + [6], max_new_tokens=20).token_ids
    assert got[2].result is None
    monkeypatch.setattr(eng.runtime, "forward_batch", real)
    later = run_jobs(eng, [greedy(shared + [5], cache)])[0]
    assert later.cached_tokens == len(shared)
    assert later.token_ids == generate(model, shared + [5], max_new_tokens=20).token_ids


@pytest.mark.parametrize("close_after_first", [False, True])
def test_the_prompts_blocks_are_saved_after_its_first_token(models: dict[str, Any], monkeypatch: Any,
                                                             close_after_first: bool) -> None:
    """The copy into the cache is not part of the time to first token: the first step comes out
    with the prompt still registered as being prefilled and nothing saved; the next step (or
    closing the loop there) saves its blocks and ends the registration."""
    model = models["float32"]
    rt, cache, saves = model.runtime, PrefixCache(1 << 20), []
    real = rt.save_prefix
    monkeypatch.setattr(rt, "save_prefix", lambda c, *a: saves.append(len(c)) or real(c, *a))
    ids = model.encode_prompt(SYSTEM + "Count to five.")
    loop = decode_steps(rt, ids, SamplingConfig(), torch.Generator(), max_new_tokens=8, prefix_cache=cache)
    first = next(loop)
    assert first.verdict.tokens and saves == [] and len(cache) == 0 and cache._prefilling
    if close_after_first:
        loop.close()
    else:
        next(loop)
    assert saves[0] == 0 and len(cache) >= len(ids) // B and not cache._prefilling
    assert cache.cached(ids) == len(ids) // B * B
    loop.close()


def test_many_distinct_prefixes_keep_the_bound(models: dict[str, Any]) -> None:
    model, eng_model = models["bfloat16"], models["bfloat16-engine"]
    prompts = [model.encode_prompt(f"Topic {i}: tell me about the number {i * 7}. " * 4) for i in range(10)]
    cache = PrefixCache(16 * B * 384)  # 16 blocks of the tiny model in bfloat16
    eng = Engine(eng_model, max_batch=3, context=256, prefill_chunk=16)
    bounds: list[int] = []
    got = eng.generate_all(prompts, max_new_tokens=12, prefix_cache=cache,
                           progress=lambda done: bounds.append(cache.bytes))
    assert max(bounds) <= cache.max_bytes and cache.evictions > 0
    assert 0 < cache.reserved_bytes <= cache.max_bytes  # one pool, its places reused after evictions
    assert [r.token_ids for r in got] == [generate(model, p, max_new_tokens=12).token_ids for p in prompts]
    cache.clear()
    assert len(cache) == 0 and cache.reserved_bytes == 0


def test_the_hugging_face_runtime_leaves_the_cache_off(tiny_chat_folder: Any, one_thread: None) -> None:
    hf = load_model(str(tiny_chat_folder), runtime="hf")
    cache = PrefixCache(1 << 20)
    ids = hf.encode_prompt(SYSTEM)
    for _ in range(2):
        assert generate(hf, ids, max_new_tokens=4, prefix_cache=cache).cached_tokens == 0
    assert len(cache) == 0 and cache.queries == 0


@pytest.mark.parametrize("draft", [None, "lookup"])
def test_a_conversation_keeps_its_kv_between_turns(models: dict[str, Any], draft: str | None) -> None:
    model = models["float32"]
    chat = Conversation(model, draft=draft, cache_mb=1)
    turns = ["Name three colours.", "Now count to five.", "And say hello to the sea."]
    answers: list[str] = []
    for i, turn in enumerate(turns):
        ids = encode_conversation(model.tokenizer, [*turns[: i + 1]], answers)
        want = generate(model, ids, max_new_tokens=16)
        got = chat.say(turn, max_new_tokens=16)
        assert got.token_ids == want.token_ids and got.text == want.text
        if i:  # the earlier turns' prompt and answer, less where the answer's text re-encodes otherwise
            assert got.cached_tokens >= len(encode_conversation(model.tokenizer, turns[:i], answers[: i - 1]))
        answers.append(want.text)
    assert chat.turns == turns and chat.answers == answers
    with pytest.raises(ConfigError, match="sets prefix_cache"):
        chat.say("again", prefix_cache=None)
    with pytest.raises(ConfigError, match="non-empty"):
        chat.say("")


def test_the_benchmark_summarises_with_and_without_the_cache() -> None:
    """``benchmarks/prefix_cache.py``'s summary on made-up records (the benchmark itself is not run)."""
    from .benchmark_scripts import load_benchmark

    bench = load_benchmark("prefix_cache")

    def server(mb: int, ttft: float, wall: float, rss: float, answer: int = 0) -> dict[str, Any]:
        label = f"{mb}"
        recs = [{"workload": "shared_system", "index": i, "error": None, "ttft_s": 2.0 if i == 0 else ttft * i,
                 "cached_tokens": 0 if i == 0 or not mb else 1500, "prompt_tokens": 1510, "token_ids": [i] * 8,
                 "server": label, **({"batch_wall_s": wall} if i else {})} for i in range(4)]
        recs += [{"workload": "multi_turn", "conversation": 0, "turn": t, "error": None, "ttft_s": ttft * t,
                  "cached_tokens": 100 * t if mb else 0, "prompt_tokens": 120 * t, "token_ids": [t + answer],
                  "server": label} for t in (1, 2)]
        recs += [{"workload": "distinct", "index": 0, "error": None, "ttft_s": 1.0, "cached_tokens": 0,
                  "prompt_tokens": 800, "token_ids": [9], "rss_mib": 100 + rss, "server": label,
                  "cache_bytes": (mb << 19) if mb else float("nan")}]
        return {"cache_mb": mb, "records": recs, "rss_base_mib": 100.0, "rss_peak_mib": 100 + rss,
                "hits": 3200.0 if mb else float("nan"), "queries": 6400.0 if mb else float("nan")}

    summary = bench.summarize([server(0, 2.0, 6.0, 10.0), server(8, 0.5, 2.0, 14.0)], 8)
    assert summary["equal"] and (summary["equal_answers"], summary["compared_answers"]) == (7, 7)
    assert summary["on"]["shared_cached"] == 1500 and summary["off"]["shared_ttft_p50_s"] == 4.0
    goals = summary["goals"]
    assert goals["shared_system_ttft_lower"] == 4.0 and goals["shared_system_throughput"] == 3.0
    assert goals["later_turn_ttft_lower"] == 4.0 and goals["cache_bytes_under_bound"]
    assert goals["rss_allowed_mib"] == 110 + 8 + 11.0 and goals["rss_within"]
    assert summary["on"]["hit_rate"] == 0.5
    config = {"prefix_cache_mb": 8, "model": "m", "dtype": "float32", "max_batch": 16, "draft": "none", "rounds": 1,
              "date": "today", "cpus": 2, "clients": 3, "distinct": 1, "command": "python benchmarks/prefix_cache.py"}
    text = bench.render(summary, config)
    assert "4.00x" in text and "bound 8 MiB: kept" in text and "**7/7**" in text and "within" in text
    worse = bench.summarize([server(0, 2.0, 6.0, 10.0), server(8, 0.5, 2.0, 140.0, answer=1)], 8)
    assert not worse["equal"] and worse["equal_answers"] == 5 and not worse["goals"]["rss_within"]


def test_the_size_replay_reuses_earlier_turns_only_while_the_bound_holds_them(models: dict[str, Any]) -> None:
    """``benchmarks/prefix_cache_size.py``: a second turn finds its first turn's prompt and answer;
    with no room, nothing; two users interleave their conversations."""
    from .benchmark_scripts import load_benchmark

    bench = load_benchmark("prefix_cache_size")
    tok = models["float32"].tokenizer
    convs = [[("user", SYSTEM + "Name three colours."), ("assistant", "Red, green and blue."),
              ("user", "Now in French."), ("assistant", "Rouge, vert et bleu.")],
             [("user", "What is 2 + 2?"), ("assistant", "4.")]]
    reqs = bench.requests(tok, convs, 1, 4096)
    assert len(reqs) == 3 and reqs[1][0][: len(reqs[0][0])] == reqs[0][0]  # turn 2 starts with turn 1's prompt
    roomy, none = bench.replay(reqs, 64, 1000), bench.replay(reqs, 0, 1000)
    assert none["hits"] == 0 and none["queries"] == roomy["queries"] == sum(len(p) for p, _ in reqs)
    assert roomy["hits"] >= len(reqs[0][0]) // B * B and roomy["peak_mib"] <= 64
    two = bench.requests(tok, convs, 2, 4096)  # round 1: each user's first turn; round 2: the second's turn 2
    assert [p for p, _ in two] == [reqs[0][0], reqs[2][0], reqs[1][0]]
    assert bench.requests(tok, convs, 1, 10) == []  # nothing fits 10 positions
