"""The layout of one batched pass of the native runtime: where each row goes, and what it sees.

``NativeRuntime.forward_batch`` takes several sequences' new rows (:class:`~.base.Rows`). The
decoder runs them as one ``[R, d]`` tensor; attention (:mod:`.attention`) needs them per slot,
padded: ``[B, KV, M, hd]`` with each KV head's group of G query heads folded into the row axis
(row j, query head g of the group: index ``j * G + g``) and M padded to a multiple of
:data:`.attention.ROWS`. A :class:`Plan`, built once per pass, holds the indices and the mask
every layer reuses, and the padded query buffer the layers fill in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError, ContextLengthError
from .attention import padded_keys, padded_rows, visible_keys
from .base import Rows, ancestor_mask, check_parents


@dataclass(frozen=True)
class Plan:
    """One pass's layout (see the module docstring)."""

    starts: list[int]  # each sequence's slot length before the pass
    slot_of: torch.Tensor  # [R] the slot of each row
    at: torch.Tensor  # [R] the cache position each row is written at
    positions: torch.Tensor  # [R] the rotary position (a tree row: start + its depth)
    place: torch.Tensor | None  # [R] the row's index in [batch * rows]; None when that is 0..R-1
    first_slot: int
    batch: int  # slots first_slot .. first_slot + batch - 1
    rows: int  # the most rows any slot brings
    keys: int  # keys attended, padded (attention.padded_keys)
    bias: torch.Tensor  # [batch, 1, M, keys]: 0 where a row sees a key, -inf where not
    queries: torch.Tensor  # [batch, KV, M, hd] float32, zero padding; layers write rows * G of M
    group: int  # query heads per KV head

    @property
    def single(self) -> bool:
        """One sequence, so each row's K/V go to one slot's consecutive positions."""
        return self.batch == 1 and self.place is None


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
    lo, hi = min(seen_slots), max(seen_slots) + 1
    rows = max(len(p.ids) for p in passes)
    # the pass covers slots lo..hi-1; a slot with no rows in it gets none (all padding)
    by_slot = {p.slot: (start, len(p.ids), tree) for p, start, tree in zip(passes, starts, trees)}
    cover = [by_slot.get(s, (0, 0, None)) for s in range(lo, hi)]
    keys = padded_keys(max(st + n for st, n, _ in cover))
    seen = visible_keys([c[0] for c in cover], [c[1] for c in cover], [c[2] for c in cover], rows, keys)
    seen = seen.repeat_interleave(group, dim=1)  # [B, rows * G, keys]: the folded layout
    m = padded_rows(rows * group)
    seen = F.pad(seen, (0, 0, 0, m - rows * group))
    seen[:, rows * group :, 0] = True  # padding rows see slot 0: a finite softmax
    bias = torch.zeros(seen.shape, dtype=torch.float32).masked_fill_(~seen, float("-inf"))[:, None]
    place = [(p.slot - lo) * rows + j for p in passes for j in range(len(p.ids))]
    identity = place == list(range((hi - lo) * rows))
    return Plan(
        starts=starts,
        slot_of=torch.tensor(slot_of, device=device),
        at=torch.tensor(at, device=device),
        positions=torch.tensor(positions, device=device),
        place=None if identity else torch.tensor(place, device=device),
        first_slot=lo,
        batch=hi - lo,
        rows=rows,
        keys=keys,
        bias=bias.to(device),
        queries=torch.zeros(hi - lo, kv_heads, m, head_dim, dtype=torch.float32, device=device),
        group=group,
    )


def fill_queries(plan: Plan, q: torch.Tensor, scale: float) -> torch.Tensor:
    """Write the pass's query rows ``q`` (``[R, H, hd]``), times ``scale``, into the plan's padded
    layout and return it (``[B, KV, M, hd]`` float32)."""
    B, rows, KV, hd = plan.batch, plan.rows, plan.queries.shape[1], plan.queries.shape[3]
    G = q.shape[1] // KV
    if plan.place is not None:  # rows of several slots: spread them out first
        q = q.new_zeros(B * rows, q.shape[1], hd).index_copy_(0, plan.place, q)
    src = q.view(B, rows, KV, G, hd).permute(0, 2, 1, 3, 4)  # [B, KV, rows, G, hd]
    torch.mul(src, scale, out=plan.queries[:, :, : rows * G].view(B, KV, rows, G, hd))
    return plan.queries


def gather_output(plan: Plan, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Attention's ``[B, KV, M, hd]`` back to the pass's rows: ``[R, H * hd]`` in ``dtype``."""
    B, KV, _, hd = out.shape
    rows, G = plan.rows, plan.group
    flat = out[:, :, : rows * G].view(B, KV, rows, G, hd).permute(0, 2, 1, 3, 4)  # [B, rows, KV, G, hd]
    res = torch.empty(B * rows, KV * G * hd, dtype=dtype, device=out.device)
    res.view(B, rows, KV, G, hd).copy_(flat)
    return res if plan.place is None else res.index_select(0, plan.place)
