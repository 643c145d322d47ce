"""How a batched pass is cut into attention groups (runtime/batch_plan.py): runs of consecutive
slots read from the cache as views, cut where padding would cost more than another call; and the
cut changes only the time a pass takes, never a logit."""

from __future__ import annotations

import random

import pytest
import torch

from draftwise.runtime import attention, batch_plan
from draftwise.runtime.base import Rows
from draftwise.runtime.batch_plan import make_plan, segments

from .test_row_invariance import runtime, wide_state  # noqa: F401  (a fixture)


def test_alike_sequences_share_one_group():
    assert segments(list(range(8)), [1] * 8, [300 + 5 * i for i in range(8)], group=3) == [list(range(8))]


def test_far_slots_and_far_lengths_part():
    # two sequences 15 slots apart: one group would read 14 empty entries
    assert segments([0, 15], [1, 1], [320, 320], group=3) == [[0], [1]]
    # the order of the pass does not matter, only the slots
    assert segments([15, 0], [1, 1], [320, 320], group=3) == [[1], [0]]
    # a short run and a long run: the short ones are not padded to the long ones' keys
    assert segments([0, 1, 2, 3], [1, 1, 1, 1], [64, 64, 2048, 2048], group=3) == [[0, 1], [2, 3]]


def test_a_prompt_chunk_does_not_pad_decoding_rows():
    runs = segments([0, 1, 2, 3], [1, 1, 128, 1], [300, 300, 300, 300], group=3)
    assert [2] in runs and sum(len(r) for r in runs) == 4


def test_groups_read_the_cache_without_copying():
    plan = make_plan([Rows(s, [1]) for s in (0, 3, 4, 9)], [300, 40, 900, 310, 0, 0, 0, 0, 0, 280], 1024,
                     kv_heads=2, group=4, head_dim=8, device=torch.device("cpu"))
    cache = torch.zeros(10, 2, 1024, 8)
    covered = []
    for g in plan.groups:
        view = g.cached(cache)
        assert view.data_ptr() == cache[g.lo].data_ptr() and view.shape[0] == g.batch
        covered += list(range(g.lo, g.lo + g.batch))
    assert {0, 3, 4, 9} <= set(covered) and len(covered) == len(set(covered))


@pytest.mark.parametrize("cut", ["one group", "one group per sequence"])
def test_the_cut_changes_no_logit(wide_state, monkeypatch, cut):  # noqa: F811
    rng = random.Random(5)
    rt = runtime(wide_state, ("float32", "none"), slots=6, path="torch")  # groups are the torch path's
    for s in range(6):
        prompt = [rng.randrange(3, 512) for _ in range(rng.randrange(20, 500))]
        rt.forward_batch([Rows(s, prompt, logits=False)])
    lengths = [rt.slot_length(s) for s in range(6)]
    passes = [Rows(0, [7]), Rows(2, [8, 9, 10]), Rows(3, [11, 12, 13, 14], tree=[-1, 0, 0, 1]), Rows(5, [15])]
    default = rt.forward_batch(passes)
    for s, n in enumerate(lengths):
        rt.rollback_slot(s, n)
    if cut == "one group":
        monkeypatch.setattr(batch_plan, "CALL_COST", 1e30)
    else:
        monkeypatch.setattr(batch_plan, "KEY_COST", 1e30)
    assert len(make_plan(passes, lengths, 1024, kv_heads=2, group=4, head_dim=32,
                         device=torch.device("cpu")).groups) == (2 if cut == "one group" else 4)  # + the tree's
    other = rt.forward_batch(passes)
    assert all(torch.equal(a, b) for a, b in zip(default, other))


def test_both_ways_of_taking_the_values_give_the_same_bits(monkeypatch):
    """attention.attend copies a small group's values into blocks and runs one matmul; a large
    group's it takes block by block from the cache's view. A row must get the same bits either
    way, alone (a few blocks) or in a group padded to many more (the block sum's cascade)."""
    gen = torch.Generator().manual_seed(3)
    B, KV, M, hd, ctx = 10, 2, 8, 16, 1536
    ends = [int(e) for e in torch.randint(40, 1400, (B,), generator=gen)]
    k, v = torch.randn(B, KV, ctx, hd, generator=gen), torch.randn(B, KV, ctx, hd, generator=gen)
    q = torch.randn(B, KV, M, hd, generator=gen)

    def bias(b: int, keys: int) -> torch.Tensor:
        return torch.zeros(1, 1, M, keys).masked_fill_(torch.arange(keys) >= ends[b], float("-inf"))

    keys = attention.padded_keys(max(ends))
    whole = torch.cat([bias(b, keys) for b in range(B)])
    by_block = attention.attend(q, k[:, :, :keys], v[:, :, :keys], whole)
    monkeypatch.setattr(attention, "LOOP_BATCH", B + 1)
    copied = attention.attend(q, k[:, :, :keys], v[:, :, :keys], whole)
    assert torch.equal(by_block, copied)
    for b in range(B):  # alone: its own keys only, values copied
        own = attention.padded_keys(ends[b])
        alone = attention.attend(q[b : b + 1], k[b : b + 1, :, :own], v[b : b + 1, :, :own], bias(b, own))
        assert torch.equal(alone[0], by_block[b]), b
