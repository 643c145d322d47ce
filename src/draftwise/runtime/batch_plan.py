"""The layout of one batched pass of the native runtime: where each row goes, and what it sees.

``NativeRuntime.forward_batch`` takes several sequences' new rows (:class:`~.base.Rows`). The
decoder runs them as one ``[R, d]`` tensor; attention (:mod:`.attention`) needs them per slot,
padded: ``[B, KV, M, hd]`` with each KV head's group of G query heads folded into the row axis
(row j, query head g of the group: index ``j * G + g``) and M padded to a multiple of
:data:`.attention.ROWS`. A :class:`Plan`, built once per pass, holds the indices and the mask
every layer reuses, and the padded query buffer the layers fill in place.

Sequences attend in *groups*, each a run of consecutive slots whose keys and values are read
straight from the cache (a view: never a copy), every entry padded to the run's longest context and
its most rows; a slot of the run that has no rows in this pass joins as an empty entry. Which runs:
:func:`segments` cuts the pass's slots, in slot order, where the padding a run would cost exceeds the
fixed cost of one more call (:data:`CALL_COST`). A row's result does not depend on its group or its
padding (that is what :mod:`.attention` guarantees), so the cut changes only the time a pass takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftwise.errors import ConfigError, ContextLengthError
from draftwise.runtime import kernels
from draftwise.runtime.attention import attend, padded_keys, padded_rows, visible_keys
from draftwise.runtime.base import Rows, ancestor_mask, check_parents


@dataclass(frozen=True)
class Group:
    """Sequences of a pass that attend in one call, their keys padded to one length."""

    lo: int  # the first slot: the group's entries are the consecutive slots lo .. lo + batch - 1
    batch: int
    rows_of: torch.Tensor | None  # [Rg] the pass's rows in this group, in order; None: all of them
    place: torch.Tensor | None  # [Rg] each row's index in [batch * rows]; None: 0 .. Rg - 1
    rows: int  # the most rows any of its sequences brings
    keys: int  # keys attended, padded (attention.padded_keys)
    bias: torch.Tensor  # [batch, 1, M, keys]: 0 where a row sees a key, -inf where not
    queries: torch.Tensor  # [batch, KV, M, hd] float32, zero padding; layers write rows * G of M
    group: int  # query heads per KV head
    #: a tree's rows (see :func:`_tree_group`): ``[batch, keys]``, the cache positions of slot ``lo``
    #: each row reads, in order; None: the entries are slots and read their keys in place
    index: torch.Tensor | None = None

    def cached(self, cache: torch.Tensor) -> torch.Tensor:
        """The group's keys or values from a layer's ``[slots, KV, ctx, hd]`` cache: ``[B, KV, keys, hd]``
        (a view, or a tree's rows' gathered copy)."""
        if self.index is not None:
            return cache[self.lo][:, self.index].transpose(0, 1).contiguous()
        return cache[self.lo : self.lo + self.batch, :, : self.keys]


@dataclass(frozen=True)
class Plan:
    """One pass's layout (see the module docstring)."""

    starts: list[int]  # each sequence's slot length before the pass
    slot_of: torch.Tensor  # [R] the slot of each row
    at: torch.Tensor  # [R] the cache position each row is written at
    positions: torch.Tensor  # [R] the rotary position (a tree row: start + its depth)
    single: bool  # one sequence: its rows go to one slot's consecutive positions
    first_slot: int
    groups: list[Group]  # the torch path's attention calls (empty where the compiled kernel runs)
    #: the compiled kernel's layout (:mod:`.kernels`; None: the torch path): per sequence its slot,
    #: start, rows, first row and the offset of its ancestor mask in ``trees`` (-1: a chain)
    seq: torch.Tensor | None = None
    trees: torch.Tensor | None = None  # uint8: the tree passes' [n, n] ancestor masks, flattened
    threads: int = 1


#: The cost model :func:`segments` cuts a pass by, in nanoseconds per layer, rough figures timed on
#: the default model (they decide only how fast a pass runs, never what it computes):
#: one group's fixed cost (about ten tensor operations) ...
CALL_COST = 60_000.0
#: ... and, per entry and per padded key, reading that key's K and V (and copying V into blocks) ...
KEY_COST = 75.0
#: ... plus the arithmetic for each padded query row against it.
ROW_KEY_COST = 5.5


def segments(slots: Sequence[int], rows: Sequence[int], ends: Sequence[int], group: int) -> list[list[int]]:
    """Cut a pass into groups: indices into its sequences, in runs of increasing slot.

    Sequence i sits in slot ``slots[i]`` (distinct), brings ``rows[i]`` rows and ends at key
    ``ends[i]``. A run costs :data:`CALL_COST` plus, for each slot from its first to its last
    (empty entries too), its padded keys times ``KEY_COST + ROW_KEY_COST * padded query rows``;
    the cut minimises the sum (dynamic programming over the slot order, quadratic in the
    sequences of the pass).

    >>> segments([0, 1, 2, 3], [1, 1, 1, 1], [300, 310, 290, 305], group=3)  # alike: one call
    [[0, 1, 2, 3]]
    >>> segments([0, 1, 2, 3], [1, 1, 1, 1], [100, 100, 4000, 4000], group=3)  # short and long apart
    [[0, 1], [2, 3]]
    """
    order = sorted(range(len(slots)), key=lambda i: slots[i])
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        most_rows = last_key = 0
        for i in range(j - 1, -1, -1):  # the run order[i:j]
            m = order[i]
            most_rows, last_key = max(most_rows, rows[m]), max(last_key, ends[m])
            width = slots[order[j - 1]] - slots[m] + 1
            cost = best[i] + CALL_COST + width * padded_keys(last_key) * (
                KEY_COST + ROW_KEY_COST * padded_rows(most_rows * group))
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(order)
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def make_plan(passes: Sequence[Rows], lengths: Sequence[int], context: int, *, kv_heads: int, group: int,
              head_dim: int, device: torch.device, compiled: bool = False) -> Plan:
    """The :class:`Plan` of a pass over ``passes``, given each slot's length before it; laid out
    for the compiled kernel (``compiled``) or for the torch path's groups."""
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
    seq = masks = None
    groups: list[Group] = []
    if compiled:
        seq, masks = _compiled_layout(passes, starts, first_row, trees)
    else:
        dims = dict(kv_heads=kv_heads, group=group, head_dim=head_dim, device=device)
        chains = [i for i, p in enumerate(passes) if p.tree is None]
        runs = segments([passes[i].slot for i in chains], [len(passes[i].ids) for i in chains],
                        [starts[i] + len(passes[i].ids) for i in chains], group)
        groups = [_group([chains[i] for i in run], passes, starts, first_row, row, **dims) for run in runs]
        groups += [_tree_group(passes[i], starts[i], first_row[i], tree, **dims) for i, tree in enumerate(trees)
                   if tree is not None]
    return Plan(
        starts=starts,
        slot_of=torch.tensor(slot_of, device=device),
        at=torch.tensor(at, device=device),
        positions=torch.tensor(positions, device=device),
        single=len(passes) == 1,
        first_slot=min(seen_slots),
        groups=groups,
        seq=seq,
        trees=masks,
        threads=torch.get_num_threads(),
    )


def _compiled_layout(passes: Sequence[Rows], starts: list[int], first_row: list[int],
                     trees: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled kernel's ``seq`` (``[n, 5]`` int64: slot, start, rows, first row, offset of the
    ancestor mask or -1) and ``trees`` (uint8, the masks flattened; one 0 where there are none)."""
    layout, flat, offset = [], [], 0
    for p, start, first, tree in zip(passes, starts, first_row, trees):
        layout.append([p.slot, start, len(p.ids), first, -1 if tree is None else offset])
        if tree is not None:
            flat.append(tree.reshape(-1))
            offset += tree.numel()
    masks = torch.cat(flat).to(torch.uint8) if flat else torch.zeros(1, dtype=torch.uint8)
    return torch.tensor(layout, dtype=torch.int64), masks


def _group(members: list[int], passes: Sequence[Rows], starts: list[int], first_row: list[int],
           total_rows: int, *, kv_heads: int, group: int, head_dim: int,
           device: torch.device) -> Group:
    """One :class:`Group` of the chains ``passes[members]`` (in slot order): the consecutive slots from the
    first member's to the last's, a slot in between that is not a member joining as an empty
    entry (padding rows only)."""
    slots = [passes[i].slot for i in members]
    lo, hi = slots[0], slots[-1] + 1
    entries = list(range(lo, hi))  # the layout's sequences, in order
    by_slot = {passes[i].slot: i for i in members}
    counts = [len(passes[by_slot[s]].ids) if s in by_slot else 0 for s in entries]
    rows = max(counts)
    starts_e = [starts[by_slot[s]] if s in by_slot else 0 for s in entries]
    keys = padded_keys(max(st + n for st, n in zip(starts_e, counts)))
    seen = visible_keys(starts_e, counts, rows, keys)
    rows_of = [first_row[by_slot[s]] + j for s, n in zip(entries, counts) for j in range(n)]
    place = [b * rows + j for b, n in enumerate(counts) for j in range(n)]
    return Group(
        lo=lo,
        batch=len(entries),
        rows_of=None if rows_of == list(range(total_rows)) else torch.tensor(rows_of, device=device),
        place=None if place == list(range(len(entries) * rows)) else torch.tensor(place, device=device),
        rows=rows,
        keys=keys,
        bias=_bias(seen, rows, group).to(device),
        queries=torch.zeros(len(entries), kv_heads, padded_rows(rows * group), head_dim, dtype=torch.float32,
                            device=device),
        group=group,
    )


def _bias(seen: torch.Tensor, rows: int, group: int) -> torch.Tensor:
    """``[B, 1, M, keys]`` float32 from ``seen`` (``[B, rows, keys]``): each row's mask for each of
    its G query heads (the folded layout), padded to M rows; 0 where it sees a key, ``-inf`` where not."""
    seen = seen.repeat_interleave(group, dim=1)  # [B, rows * G, keys]
    m = padded_rows(rows * group)
    seen = F.pad(seen, (0, 0, 0, m - rows * group))
    seen[:, rows * group :, 0] = True  # padding rows see slot 0: a finite softmax
    return torch.zeros(seen.shape, dtype=torch.float32).masked_fill_(~seen, float("-inf"))[:, None]


def _tree_group(p: Rows, start: int, first: int, ancestors: torch.Tensor, *, kv_heads: int, group: int,
                head_dim: int, device: torch.device) -> Group:
    """A tree pass's rows as a :class:`Group` of one-row entries, each reading the keys before
    ``start`` and then its ancestors-or-self (``ancestors``, the pass's ``[n, n]`` mask), packed in
    order: the keys its path's chain reads, at the same indices, so that a tree row gets the chain's
    bits (a mask over the tree's own layout would put the keys it sees at other indices, and the
    reductions' grouping follows the index)."""
    n = len(p.ids)
    depth = ancestors.sum(1)  # [n]: each row's path length
    keys = padded_keys(start + int(depth.max()))
    index = torch.zeros(n, keys, dtype=torch.long)
    index[:, :start] = torch.arange(start)
    for j in range(n):
        index[j, start : start + int(depth[j])] = start + ancestors[j].nonzero().flatten()
    seen = visible_keys((start + depth - 1).tolist(), [1] * n, 1, keys)
    return Group(
        lo=p.slot,
        batch=n,
        rows_of=torch.arange(first, first + n, device=device),
        place=None,
        rows=1,
        keys=keys,
        bias=_bias(seen, 1, group).to(device),
        queries=torch.zeros(n, kv_heads, padded_rows(group), head_dim, dtype=torch.float32, device=device),
        group=group,
        index=index.to(device),
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
    if plan.seq is not None:  # the compiled kernel: every sequence in one call
        assert plan.trees is not None
        return kernels.attend(q if q.dtype == torch.float32 else q.float(), k_cache, v_cache, plan.seq, plan.trees,
                              scale, plan.threads, dtype)
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
