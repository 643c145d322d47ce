"""Row-invariant attention for a ragged batch of sequences (DESIGN.md section 11).

A row's attention output must not depend on how many other rows share its pass (1 for a plain
step, k + 1 for a verification pass, a whole batch of sequences), or speculative decoding in
reduced precision, and any batching at all, stops reproducing plain decoding bit for bit.
``F.scaled_dot_product_attention`` is not invariant on this CPU: its summation order changes with
the number of queries and of keys (measured: docs/runtime.md, "Row invariance"). Neither are plain
matmuls: MKL picks another kernel below 8 rows and another reduction over fewer than ~320 keys.

So every reduction here has a shape that does not depend on the rest of the batch:

- query rows are padded to a multiple of :data:`ROWS` (at least :data:`ROWS`), where the matmul
  kernel no longer changes with the row count;
- keys are padded to a multiple of :data:`CHUNK`; masked keys get ``-inf`` (weight exactly 0),
  and torch's softmax over a multiple of 64 entries is unchanged by trailing ``-inf`` entries;
- the weighted sum of values runs per block of :data:`CHUNK` keys (a matmul with a fixed inner
  size), then sums the blocks with one ``sum`` over the block axis (torch's cascade: its grouping
  is fixed from the first block, so trailing all-zero blocks add exactly 0).

The blocks' products come one of two ways, to the same bits (``tests/test_batch_plan.py`` checks
one against the other): a small group copies its values into blocks and runs one batched matmul;
a group of :data:`LOOP_BATCH` sequences or more runs a matmul per block on the cache's own view
(no copy of the values, which at long contexts cost more than the calls).

Shapes: one call covers ``B`` sequences (a group of :mod:`.batch_plan`); ``q`` is ``[B, KV, M, hd]``
(each KV head's group of query heads folded into M), keys and values ``[B, KV, L, hd]`` from the cache,
``bias`` ``[B, 1, M, L]`` with 0 where a row sees a key and ``-inf`` where it does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ROWS = 8  # query rows per (slot, KV head) are padded to a multiple of this
CHUNK = 64  # keys per block of the value reduction; key lengths are padded to a multiple
LOOP_BATCH = 8  # groups of at least this many sequences take the values block by block (no copy)


def padded_rows(m: int) -> int:
    """``m`` query rows padded to a multiple of :data:`ROWS` (at least one block)."""
    return max(ROWS, -(-m // ROWS) * ROWS)


def padded_keys(n: int) -> int:
    """``n`` keys padded to a multiple of :data:`CHUNK`."""
    return max(CHUNK, -(-n // CHUNK) * CHUNK)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T + bias) v`` with a fixed summation order per row (see the module
    docstring). ``q`` ``[B, KV, M, hd]`` float32, already scaled; ``k``, ``v`` ``[B, KV, L, hd]``
    with ``L`` a multiple of :data:`CHUNK` and finite everywhere; returns ``[B, KV, M, hd]``."""
    B, KV, M, hd = q.shape
    L = k.shape[2]
    p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)).add_(bias), dim=-1)  # [B, KV, M, L]
    blocks = L // CHUNK
    if B < LOOP_BATCH:  # the values copied into blocks (folding B, KV and the blocks), one matmul
        pc = p.view(B, KV, M, blocks, CHUNK).transpose(2, 3)  # [B, KV, blocks, M, CHUNK]
        vc = v.reshape(B, KV, blocks, CHUNK, hd)
        return torch.matmul(pc, vc).sum(2)  # [B, KV, M, hd]
    n = B * KV
    pf = p.view(n, M, L)
    products = q.new_empty(blocks, n, M, hd)
    for b in range(blocks):  # B and KV fold on the cache's view: nothing is copied
        keys = slice(b * CHUNK, (b + 1) * CHUNK)
        torch.bmm(pf[:, :, keys], v[:, :, keys].reshape(n, CHUNK, hd), out=products[b])
    return products.sum(0).view(B, KV, M, hd)


def visible_keys(starts: Sequence[int], counts: Sequence[int], rows: int, keys: int) -> torch.Tensor:
    """``[B, rows, keys]`` bool: which keys each row of each chain sees.

    Sequence b's row j (``j < counts[b]``) sits at slot ``starts[b] + j`` and sees every slot up
    to its own. Padding rows see slot 0 only (any one finite key keeps their softmax finite; their
    output is thrown away). A token tree's rows read their keys gathered as chains
    (``batch_plan._tree_group``)."""
    j = torch.arange(rows)
    start = torch.tensor(list(starts))[:, None]
    count = torch.tensor(list(counts))[:, None]
    last = torch.where(j[None, :] < count, start + j[None, :], torch.zeros_like(start))  # [B, rows]
    return torch.arange(keys)[None, None, :] <= last[..., None]  # [B, rows, keys]
