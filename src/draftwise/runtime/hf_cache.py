"""The Hugging Face adapter's KV cache: every layer keeps the K/V of all positions, so a rollback
to any earlier length is exact and O(1) (see :mod:`draftwise.runtime.hf` for why transformers'
own ``DynamicCache`` cannot do this for sliding-window layers)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import (
    DummyLayer,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
)

_MIN_CAPACITY = 256


class _KVBuffer:
    """One layer's K/V for every position, in buffers of spare capacity that double when full."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # no need to grow past the runtime's max_context
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``[batch, heads, n, dim]`` new states; return views of all positions."""
        end = self.length + keys.shape[-2]
        if self._keys is None or self._values is None or end > self._keys.shape[-2]:
            self._grow(keys, values, end)
        assert self._keys is not None and self._values is not None
        self._keys[..., self.length : end, :] = keys
        self._values[..., self.length : end, :] = values
        self.length = end
        return self.views()

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._keys is not None and self._values is not None
        return self._keys[..., : self.length, :], self._values[..., : self.length, :]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def move(self, src: torch.Tensor, dst: int) -> None:
        """Copy positions ``src`` (``[r]``, ascending) to ``dst .. dst + r - 1`` (a kept tree path)."""
        for buf in (self._keys, self._values):
            if buf is not None:  # gathered before the write: the two ranges may overlap
                buf[..., dst : dst + src.numel(), :] = buf.index_select(-2, src)

    def _grow(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        capacity = 0 if self._keys is None else self._keys.shape[-2]
        new = max(needed, min(max(2 * capacity, _MIN_CAPACITY), self.limit))
        self._keys = self._enlarge(self._keys, keys, new)
        self._values = self._enlarge(self._values, values, new)

    def _enlarge(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        buf = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
        if old is not None and self.length:
            buf[..., : self.length, :] = old[..., : self.length, :]
        return buf


def _crop_target(length: int, tokens_to_remove: int) -> int:
    """transformers 5.24's ``crop(n)``: ``n <= 0`` drops ``-n`` positions; ``n > 0`` is refused."""
    if tokens_to_remove > 0:
        raise ValueError(f"crop({tokens_to_remove}): pass minus the number of positions to drop")
    return length + tokens_to_remove


class FullLayer(DynamicLayer):
    """A full-attention layer on a :class:`_KVBuffer`."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._kv = _KVBuffer(limit)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self._kv.append(key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._kv.length

    def truncate(self, length: int) -> None:
        if self.is_initialized:
            self._kv.truncate(length)
            self.keys, self.values = self._kv.views()

    def crop(self, tokens_to_remove: int) -> None:
        self.truncate(_crop_target(self._kv.length, tokens_to_remove))

    def move(self, src: torch.Tensor, dst: int) -> None:
        """Copy positions ``src`` to ``dst, dst + 1, ...`` (then ``truncate`` to drop the rest)."""
        if self.is_initialized:
            self._kv.move(src, dst)

    def reset(self) -> None:
        self.truncate(0)  # keep the buffers for the next sequence


class WindowLayer(DynamicSlidingWindowLayer):
    """A sliding-window layer that keeps every position, so that it can roll back past the window.

    ``get_mask_sizes`` is inherited from ``DynamicSlidingWindowLayer`` (it reads
    ``cumulative_length``); ``update`` returns exactly the positions those sizes describe: the
    last ``sliding_window - 1`` cached ones plus the new ones.
    """

    def __init__(self, sliding_window: int, limit: int) -> None:
        super().__init__(sliding_window=sliding_window)
        self._kv = _KVBuffer(limit)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._sliding_window_tensor = self._sliding_window_tensor.to(self.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self._kv.append(key_states, value_states)
        self.cumulative_length = self._kv.length
        self.keys, self.values = keys, values
        visible = self.sliding_window - 1 + key_states.shape[-2]
        return keys[..., -visible:, :], values[..., -visible:, :]

    def get_seq_length(self) -> int:
        return self._kv.length

    def truncate(self, length: int) -> None:
        if self.is_initialized:
            self._kv.truncate(length)
            self.keys, self.values = self._kv.views()
            self.cumulative_length = self._kv.length

    def crop(self, tokens_to_remove: int) -> None:
        self.truncate(_crop_target(self._kv.length, tokens_to_remove))

    def reset(self) -> None:
        self.truncate(0)


LayerSpec = tuple[str, int]  # ("full", 0) | ("window", sliding_window) | ("dummy", 0)


def layer_specs(cache: Any) -> list[LayerSpec] | None:
    """How to rebuild ``cache`` with rollback-exact layers, or None if it holds another kind."""
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return None
    specs: list[LayerSpec] = []
    for layer in cache.layers:
        kind = type(layer)  # exact types: subclasses (model-specific layers) may hold more state
        if kind is DynamicLayer:
            specs.append(("full", 0))
        elif kind is DynamicSlidingWindowLayer and isinstance(layer, DynamicSlidingWindowLayer):
            specs.append(("window", int(layer.sliding_window)))
        elif kind is DummyLayer:
            specs.append(("dummy", 0))
        else:
            return None
    return specs or None
