"""The layout of one batched pass of the native runtime: where each row goes, and what it sees.

``NativeRuntime.forward_batch`` takes several sequences' new rows (:class:`~.base.Rows`). The
decoder runs them as one ``[R, d]`` tensor; attention (:mod:`.attention`) needs them per slot,
padded: ``[B, KV, M, hd]`` with each KV head's group of G query heads folded into the row axis
(row j, query head g of the group: index ``j * G + g``) and M padded to a multiple of
:data:`.attention.ROWS`. A :class:`Plan`, built once per pass, holds the indices and the mask
every layer reuses, and the padded query buffer the layers fill in place.

Keys are padded per *group*: sequences whose contexts round up to the same power-of-two number
of 64-key blocks attend together, so a short sequence never attends over a long one's padding
(at most 2x its own keys), in at most a handful of calls per layer. A row's result does not
depend on its group or its padding (that is what :mod:`.attention` guarantees).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError, ContextLengthError
from .attention import CHUNK, attend, padded_keys, padded_rows, visible_keys
from .base import Rows, ancestor_mask, check_parents


@dataclass(frozen=True)
class Group:
    """Sequences of a pass that attend in one call, their keys padded to one length."""

    lo: int  # the first slot
    index: torch.Tensor | None  # [B] their slots; None: the consecutive slots lo .. lo + B - 1
    batch: int
    rows_of: torch.Tensor | None  # [Rg] the pass's rows in this group, in order; None: all of them
    place: torch.Tensor | None  # [Rg] each row's index in [batch * rows]; None: 0 .. Rg - 1
    rows: int  # the most rows any of its sequences brings
    keys: int  # keys attended, padded (attention.padded_keys)
    bias: torch.Tensor  # [batch, 1, M, keys]: 0 where a row sees a key, -inf where not
    queries: torch.Tensor  # [batch, KV, M, hd] float32, zero padding; layers write rows * G of M
    group: int  # query heads per KV head

    def cached(self, cache: torch.Tensor) -> torch.Tensor:
        """The group's keys or values from a layer's ``[slots, KV, ctx, hd]`` cache: ``[B, KV, keys, hd]``."""
        if self.index is None:
            return cache[self.lo : self.lo + self.batch, :, : self.keys]  # a view
        return cache[:, :, : self.keys].index_select(0, self.index)


@dataclass(frozen=True)
class Plan:
    """One pass's layout (see the module docstring)."""

    starts: list[int]  # each sequence's slot length before the pass
    slot_of: torch.Tensor  # [R] the slot of each row
    at: torch.Tensor  # [R] the cache position each row is written at
    positions: torch.Tensor  # [R] the rotary position (a tree row: start + its depth)
    single: bool  # one sequence: its rows go to one slot's consecutive positions
    first_slot: int
    groups: list[Group]


def _bucket(keys: int) -> int:
    """Keys rounded up to a power-of-two number of 64-key blocks (the grouping key)."""
    blocks = -(-keys // CHUNK)
    return CHUNK * (1 << max(blocks - 1, 0).bit_length())


def make_plan(passes: Sequence[Rows], lengths: Sequence[int], context: int, *, kv_heads: int, group: int,
              head_dim: int, device: torch.device) -> Plan:
    """The :class:`Plan` of a pass over ``passes``, given each slot's length before it."""
    if not passes:
        raise ConfigError("a pass needs at least one sequence")
    seen_slots: set[int] = set()
    starts, trees, slot_of, at, positions = [], [], [], [], []
    for p in passes:
        if not 0 <= p.slot < len(lengths) or p.slot in seen_slots:
            raise ConfigError(f"slot {p.slot} is not a free slot of this pass (slots 0..{len(lengths) - 1}, once each)")
        seen_slots.add(p.slot)
        n, start = len(p.ids), lengths[p.slot]
        if n == 0:
            raise ConfigError("forward needs at least one token")
        if start + n > context:
            raise ContextLengthError(
                f"{start + n} positions do not fit in the context of {context} tokens; "
                "shorten the prompt, ask for fewer new tokens, or load with a larger max_context"
            )
        depths = list(range(n)) if p.tree is None else (check_parents(p.tree, n) or list(range(n)))
        starts.append(start)
        trees.append(None if p.tree is None else ancestor_mask(p.tree))
        slot_of.extend([p.slot] * n)
        at.extend(range(start, start + n))
        positions.extend(start + d for d in depths)
    first_row, row = [], 0
    for p in passes:
        first_row.append(row)
        row += len(p.ids)
    # sequences attend together when their keys and their query rows round to the same power of
    # two (a prompt chunk's 16 rows would otherwise pad a plain step's one row to 16)
    buckets: dict[tuple[int, int], list[int]] = {}  # (keys, rows) bucket -> indices into passes
    for i, (p, start) in enumerate(zip(passes, starts)):
        rows_bucket = 1 << max(len(p.ids) - 1, 0).bit_length()
        buckets.setdefault((_bucket(start + len(p.ids)), rows_bucket), []).append(i)
    dims = dict(kv_heads=kv_heads, group=group, head_dim=head_dim, device=device)
    groups = [_group(sorted(members, key=lambda i: passes[i].slot), passes, starts, trees, first_row, row, **dims)
              for _, members in sorted(buckets.items())]
    return Plan(
        starts=starts,
        slot_of=torch.tensor(slot_of, device=device),
        at=torch.tensor(at, device=device),
        positions=torch.tensor(positions, device=device),
        single=len(passes) == 1,
        first_slot=min(seen_slots),
        groups=groups,
    )


def _group(members: list[int], passes: Sequence[Rows], starts: list[int], trees: list[torch.Tensor | None],
           first_row: list[int], total_rows: int, *, kv_heads: int, group: int, head_dim: int,
           device: torch.device) -> Group:
    """One :class:`Group` of ``passes[members]`` (in slot order).

    Its keys come straight from the cache (a view) when its slots are consecutive, or nearly:
    a slot in between that is not in the group joins as an empty entry (padding rows only),
    which costs less than copying the members' keys out while no more than half the range is
    such gaps (attention over one more slot reads its keys once; a copy reads and writes each
    member's). Otherwise the members' keys are gathered."""
    slots = [passes[i].slot for i in members]
    lo, hi = slots[0], slots[-1] + 1
    spread = hi - lo <= 2 * len(slots)
    entries = list(range(lo, hi)) if spread else slots  # the layout's sequences, in order
    by_slot = {passes[i].slot: i for i in members}
    counts = [len(passes[by_slot[s]].ids) if s in by_slot else 0 for s in entries]
    rows = max(counts)
    starts_e = [starts[by_slot[s]] if s in by_slot else 0 for s in entries]
    keys = padded_keys(max(st + n for st, n in zip(starts_e, counts)))
    seen = visible_keys(starts_e, counts, [trees[by_slot[s]] if s in by_slot else None for s in entries], rows, keys)
    seen = seen.repeat_interleave(group, dim=1)  # [B, rows * G, keys]: the folded layout
    m = padded_rows(rows * group)
    seen = F.pad(seen, (0, 0, 0, m - rows * group))
    seen[:, rows * group :, 0] = True  # padding rows see slot 0: a finite softmax
    bias = torch.zeros(seen.shape, dtype=torch.float32).masked_fill_(~seen, float("-inf"))[:, None]
    rows_of = [first_row[by_slot[s]] + j for s, n in zip(entries, counts) for j in range(n)]
    place = [b * rows + j for b, n in enumerate(counts) for j in range(n)]
    return Group(
        lo=lo,
        index=None if spread else torch.tensor(slots, device=device),
        batch=len(entries),
        rows_of=None if rows_of == list(range(total_rows)) else torch.tensor(rows_of, device=device),
        place=None if place == list(range(len(entries) * rows)) else torch.tensor(place, device=device),
        rows=rows,
        keys=keys,
        bias=bias.to(device),
        queries=torch.zeros(len(entries), kv_heads, m, head_dim, dtype=torch.float32, device=device),
        group=group,
    )


def fill_queries(g: Group, q: torch.Tensor, scale: float) -> torch.Tensor:
    """Write the group's query rows ``q`` (``[Rg, H, hd]``), times ``scale``, into its padded
    layout and return it (``[B, KV, M, hd]`` float32)."""
    B, rows, KV, hd = g.batch, g.rows, g.queries.shape[1], g.queries.shape[3]
    G = q.shape[1] // KV
    if g.place is not None:  # sequences of different lengths: spread their rows out first
        q = q.new_zeros(B * rows, q.shape[1], hd).index_copy_(0, g.place, q)
    src = q.view(B, rows, KV, G, hd).permute(0, 2, 1, 3, 4)  # [B, KV, rows, G, hd]
    torch.mul(src, scale, out=g.queries[:, :, : rows * G].view(B, KV, rows, G, hd))
    return g.queries


def gather_output(g: Group, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Attention's ``[B, KV, M, hd]`` back to the group's rows: ``[Rg, H * hd]`` in ``dtype``."""
    B, KV, _, hd = out.shape
    rows, G = g.rows, g.group
    flat = out[:, :, : rows * G].view(B, KV, rows, G, hd).permute(0, 2, 1, 3, 4)  # [B, rows, KV, G, hd]
    res = torch.empty(B * rows, KV * G * hd, dtype=dtype, device=out.device)
    res.view(B, rows, KV, G, hd).copy_(flat)
    return res if g.place is None else res.index_select(0, g.place)


def attend_groups(plan: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Each group's rows of ``q`` (``[R, H, hd]``) attend over their own slots of one layer's
    cache (``[slots, KV, ctx, hd]``): ``[R, H * hd]`` in ``dtype``."""
    att = None
    for g in plan.groups:
        keys, values = g.cached(k_cache), g.cached(v_cache)  # [B, KV, L, hd]
        if keys.dtype != torch.float32:
            keys, values = keys.float(), values.float()
        qg = q if g.rows_of is None else q.index_select(0, g.rows_of)
        out = gather_output(g, attend(fill_queries(g, qg, scale), keys, values, g.bias), dtype)
        if g.rows_of is None:
            return out
        if att is None:
            att = torch.empty(q.shape[0], out.shape[1], dtype=dtype, device=q.device)
        att.index_copy_(0, g.rows_of, out)
    assert att is not None
    return att
