"""The runtime protocol: the only way the rest of draftwise touches a model.

A runtime owns one sequence's KV cache. Its ``length`` is the number of positions the cache
holds. ``forward(ids)`` appends ``len(ids)`` tokens at positions ``length .. length+n-1`` and
returns one row of logits per new token; ``rollback(n)`` forgets every position ``>= n``.
Speculative decoding relies on rollback being exact and cheap: decode, roll back, decode again
gives the same logits.

Token trees (:mod:`draftwise.core.tree`). ``forward(ids, parents=...)`` feeds a tree in one pass:
row j goes to cache *slot* ``base + j`` (``base`` = the length before the pass) but sits at
rotary *position* ``base + depth(j)`` and attends to the cache ``[0, base)`` and to its own
ancestors (and itself) among the new rows only. Row j's logits then score the token after node
j's path. ``keep(base, rows)`` keeps one root-to-node path of that pass: it moves the K/V of
``rows`` to slots ``base, base + 1, ...`` and sets the length to ``base + len(rows)``, after
which the cache is exactly that of having decoded the path as a chain. For a chain,
``keep(base, [0, 1, ..., a])`` is ``rollback(base + a + 1)``, so a decode loop needs one code path.

Features (optional: :class:`FeatureRuntime`, which both built-in runtimes are). An EAGLE draft
head reads the target's hidden states. ``capture_features(layers=None)`` makes every later pass
record, per cache slot, the output of the last decoder layer before the final norm (``d`` wide);
``layers=(a, b, c)`` records the outputs of those layers (0-based; layer i's output is layer
i + 1's input) side by side, ``3 d`` wide (EAGLE-3). ``features(start, end)`` returns them,
``[end - start, feature_width]`` float32, for any positions below ``length``: prefill records
every prompt position, a rollback keeps those below the new length, ``keep`` moves the kept
path's rows as it moves the K/V. A ``forward(layers=...)`` draft pass records nothing (its
positions read as not recorded until a full pass rewrites them). Capture off costs nothing.

>>> ancestor_mask([-1, 0, 0, 1]).int().tolist()   # root; 1 and 2 under it; 3 under 1
[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
>>> check_parents([-1, 0, 0, 1], 4), check_parents([-1, 0, 1], 3)
([0, 1, 1, 2], None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from draftwise.errors import ConfigError


@dataclass(frozen=True)
class Rows:
    """One sequence's new rows in a batched pass (``NativeRuntime.forward_batch``): the cache
    ``slot`` they extend, their token ``ids``, their ``tree`` (``parents`` as ``forward`` takes
    them; None: a chain), and which logits come back: every row's, only the last one's
    (``last_only``: a prompt), or none (``logits=False``: a prompt chunk that is not the last)."""

    slot: int
    ids: list[int]
    tree: list[int] | None = None
    last_only: bool = False
    logits: bool = True


@runtime_checkable
class Runtime(Protocol):
    """A causal LM with a single-sequence KV cache."""

    @property
    def vocab_size(self) -> int:
        """Rows of the output head (may exceed the tokenizer's vocabulary by padding)."""
        ...

    @property
    def num_layers(self) -> int: ...

    @property
    def max_context(self) -> int:
        """Most positions the cache can hold."""
        ...

    @property
    def length(self) -> int:
        """Positions currently held in the cache."""
        ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def supports_trees(self) -> bool:
        """Whether ``forward`` takes ``parents`` other than a chain (see the module docstring).
        When False, a decode loop verifies only a tree's first chain."""
        ...

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """Reset the cache, run the prompt, return the logits of its last position: ``[vocab]``."""
        ...

    def forward(
        self, ids: Sequence[int], *, layers: Sequence[int] | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Append ``n = len(ids)`` tokens and return their logits, ``[n, vocab]`` float32.

        ``layers`` (native runtime only) runs just those decoder layers, in order, then the
        final norm and head: the self-speculation draft. Only the listed layers' cache is written.

        ``parents`` (``supports_trees`` only, else a chain is all it takes) makes the pass a tree:
        ``n`` ints, ``parents[0] = -1`` (row 0, the root) and ``0 <= parents[j] < j``; build it
        from a :class:`~draftwise.core.tree.TokenTree` as ``[-1, *tree.parents]``. None is a chain.
        """
        ...

    def keep(self, base: int, rows: Sequence[int]) -> None:
        """Keep one root-to-node path of the last pass (which started at ``base``): ``rows`` are
        its row indices, root first (e.g. ``[0, 3, 7]``); every other row of the pass is
        forgotten and the length becomes ``base + len(rows)``."""
        ...

    def rollback(self, length: int) -> None:
        """Forget positions ``>= length`` (``0 <= length <= self.length``)."""
        ...


@runtime_checkable
class FeatureRuntime(Runtime, Protocol):
    """A runtime that can record the target's hidden states per cache position (module docstring)."""

    def capture_features(self, layers: Sequence[int] | None = None, *, enabled: bool = True) -> None:
        """From the next pass on, record per cache slot the output of decoder layer ``L - 1``
        (``layers=None``; before the final norm) or of each of ``layers`` (concatenated in that
        order). Asking again for the same layers keeps what is recorded; other layers start an
        empty buffer; ``enabled=False`` turns capture off and frees the buffer. ConfigError for
        an empty list or an index outside ``[0, num_layers)``."""
        ...

    @property
    def feature_width(self) -> int:
        """``len(layers) * d`` (``d`` for ``layers=None``); 0 while capture is off."""
        ...

    def features(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, feature_width]`` float32 (a copy) of positions ``start .. end - 1``;
        ConfigError unless ``0 <= start <= end <= length``, capture is on and those positions
        were recorded (by a prefill or full forward since capture was turned on)."""
        ...


def check_parents(parents: Sequence[int], n: int) -> list[int] | None:
    """The depth of each of the ``n`` rows of a pass with ``parents``, or None for a chain;
    raises ConfigError when ``parents`` is not a tree in topological order."""
    parents = [int(p) for p in parents]
    if len(parents) != n:
        raise ConfigError(f"parents has {len(parents)} entries for {n} tokens; give one per token")
    if n and parents[0] != -1:
        raise ConfigError(f"parents[0] must be -1 (row 0 is the root), not {parents[0]}")
    depths = [0] if n else []
    for j in range(1, n):
        if not 0 <= parents[j] < j:
            raise ConfigError(f"parents[{j}] = {parents[j]} is not an earlier row (need 0 <= parent < {j})")
        depths.append(depths[parents[j]] + 1)
    return None if depths == list(range(n)) else depths


def ancestor_mask(parents: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[n, n]`` bool: ``[j, i]`` is True when row i is row j or one of its ancestors."""
    rows: list[list[bool]] = []
    for j, p in enumerate(parents):
        row = list(rows[p]) if p >= 0 else [False] * len(parents)
        row[j] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool, device=device)


def check_keep(base: int, rows: Sequence[int], *, start: int, held: int, parents: Sequence[int] | None) -> list[int]:
    """Validate ``keep(base, rows)`` against the last pass (it started at ``start`` and ``held``
    of its rows are still cached; ``parents`` as it was fed, None for a chain); return ``rows``."""
    kept = [int(r) for r in rows]
    if base != start:
        raise ConfigError(f"keep(base={base}): the last forward started at {start}; keep takes that pass's base")
    if not kept or kept[0] != 0:
        raise ConfigError(f"keep rows {kept} must start with the root row 0")
    if held < 1:
        raise ConfigError("keep: the last forward's rows are no longer in the cache (rolled back past its start)")
    if kept[-1] >= held:
        raise ConfigError(f"keep rows {kept} must be < {held}, the rows of the last forward still cached")
    for prev, row in zip(kept, kept[1:]):
        parent = row - 1 if parents is None else parents[row]
        if row <= prev or parent != prev:
            raise ConfigError(f"keep rows {kept} are not a root-to-node path: row {row}'s parent is {parent}, not {prev}")
    return kept
