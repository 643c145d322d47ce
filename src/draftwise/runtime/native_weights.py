"""Loading the native runtime (:mod:`.native`): its context length, its quantization modes, and
a state dict turned into on-device tensors and fused matmuls.

Load-time only: nothing here runs on the forward path. The fused matmuls it builds are the
callables of :mod:`.quant`, so the decoder does not know which weight format it runs.
"""

from __future__ import annotations

from typing import Any

import torch

from draftwise.errors import ConfigError, ModelLoadError
from draftwise.runtime.llama import DEFAULT_MAX_CONTEXT
from draftwise.runtime.quant import (
    Int4Linear,
    Int8Linear,
    Linear,
    Q4Weight,
    kernel_works,
    parse_quant,
    quantize_q4,
)


def context_length(config: Any, max_context: int | None) -> int:
    """The cache length to allocate: ``max_context``, or the model's own limit capped at
    ``DEFAULT_MAX_CONTEXT``; a ``max_context`` over the model's limit is refused."""
    limit = int(getattr(config, "max_position_embeddings", DEFAULT_MAX_CONTEXT))
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", window is not None) and window:
        # a context no longer than the window needs no sliding mask
        limit = min(limit, int(window))
    if max_context is None:
        return min(limit, DEFAULT_MAX_CONTEXT)
    if max_context > limit:
        raise ConfigError(
            f"max_context={max_context} exceeds what this model supports ({limit}); pass max_context <= {limit}"
        )
    return int(max_context)


def quant_modes(quant: str, head_quant: str | None, device: torch.device) -> tuple[str, str]:
    """``(quant, head_quant)`` checked: both known, and their kernels available on ``device``.

    The head (in GGUFs usually Q6_K/Q8_0, a tied embedding) defaults to int8 under q4: measured
    faster than float32 and far closer to the file than re-quantizing it to 4 bits."""
    quant = parse_quant(quant)
    head_quant = {"q4": "int8"}.get(quant, quant) if head_quant is None else parse_quant(head_quant)
    for mode, kernel in (("q4", "int4"), ("int8", "int8")):
        if mode not in (quant, head_quant):
            continue
        if device.type != "cpu":
            raise ConfigError(f"quant {mode} runs on torch's CPU kernels, not on {device}; use quant='none'")
        if not kernel_works(kernel):
            raise ConfigError(f"this torch build has no working {kernel} kernel on this CPU; use quant='none'")
    return quant, head_quant


class WeightLoader:
    """A state dict's tensors on ``device`` in ``dtype``, and fused matmuls built from them.

    ``blocks`` are a GGUF's own 4-bit weights by tensor name (``block_sources`` says where each
    came from); a q4 matmul takes them as they are and quantizes the rest."""

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device,
        pack: bool,
        blocks: dict[str, Q4Weight] | None,
        block_sources: dict[str, str] | None,
    ) -> None:
        self.state, self.dtype, self.device, self.pack = state, dtype, device, pack
        self.blocks = blocks or {}
        self.block_sources = block_sources or {}
        #: where each quantized tensor came from: "file" (the GGUF's own 4-bit blocks),
        #: "quantized" (quantized at load) or "dense" (kept in `dtype`: the kernel cannot take it)
        self.sources: dict[str, str] = {}

    def get(self, name: str) -> torch.Tensor:
        """Tensor ``name``; a missing one is a :class:`ModelLoadError`."""
        try:
            return self.state[name].to(device=self.device, dtype=self.dtype)
        except KeyError:
            raise ModelLoadError(f"weights lack tensor {name!r}") from None

    def maybe(self, name: str) -> torch.Tensor | None:
        """Tensor ``name``, or None where the weights have none (an optional bias)."""
        return self.state[name].to(device=self.device, dtype=self.dtype) if name in self.state else None

    def linear(self, names: list[str], bias: torch.Tensor | None, mode: str) -> Any:
        """One matmul over the weights ``names`` stacked along the output axis, in ``mode``
        (a q4 weight whose input width is not a multiple of 32 stays dense)."""
        state, blocks = self.state, self.blocks
        if mode == "q4" and not any(int(state[n].shape[1]) % 32 for n in names if n in state):
            parts = []
            for n in names:
                self.sources[n] = self.block_sources.get(n, "file") if n in blocks else "quantized"
                parts.append(blocks[n] if n in blocks else quantize_q4(state[n].float()))
            try:
                return Int4Linear(Q4Weight.cat(parts), bias)
            except ConfigError:
                pass
        weight = torch.cat([self.get(n) for n in names]).contiguous()
        if mode == "int8":
            self.sources.update(dict.fromkeys(names, "quantized"))
            return Int8Linear(weight.float(), bias)
        if mode != "none":
            self.sources.update(dict.fromkeys(names, "dense"))
        return Linear(weight, bias, pack=self.pack)
