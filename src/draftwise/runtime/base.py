"""The runtime protocol: the only way the rest of draftwise touches a model.

A runtime owns one sequence's KV cache. Its ``length`` is the number of positions the cache
holds. ``forward(ids)`` appends ``len(ids)`` tokens at positions ``length .. length+n-1`` and
returns one row of logits per new token; ``rollback(n)`` forgets every position ``>= n``.
Speculative decoding relies on rollback being exact and cheap: decode, roll back, decode again
gives the same logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


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

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        """Reset the cache, run the prompt, return the logits of its last position: ``[vocab]``."""
        ...

    def forward(self, ids: Sequence[int], *, layers: Sequence[int] | None = None) -> torch.Tensor:
        """Append ``n = len(ids)`` tokens and return their logits, ``[n, vocab]`` float32.

        ``layers`` (native runtime only) runs just those decoder layers, in order, then the
        final norm and head: the self-speculation draft. Only the listed layers' cache is written.
        """
        ...

    def rollback(self, length: int) -> None:
        """Forget positions ``>= length`` (``0 <= length <= self.length``)."""
        ...
