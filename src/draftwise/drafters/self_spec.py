"""Self-speculation: the target's own network with layers left out.

Two shapes: an *early exit* after layer L (layers 0..L-1, then the final norm and the shared
head), or a *skip set* (every layer except some). The draft shares the target's weights and
cache: its partial passes write only their own layers at the proposed positions, and it rolls
the cache back before verification, whose full-depth pass rewrites every layer there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ConfigError
from ..sampling import SamplingConfig
from .base import Draft, draft_autoregressive


def parse_layers(text: str, num_layers: int) -> list[int]:
    """``"0-3,7"`` -> ``[0, 1, 2, 3, 7]``."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ConfigError(f"cannot read layer list {text!r}; write it like '0-3,7'") from None
    bad = sorted(i for i in out if not 0 <= i < num_layers)
    if bad:
        raise ConfigError(f"layers {bad} do not exist: the model has layers 0..{num_layers - 1}")
    return sorted(out)


def format_layers(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3,7"`` (the inverse of :func:`parse_layers`).

    >>> format_layers([0, 1, 2, 3, 7, 9, 10])
    '0-3,7,9-10'
    """
    parts: list[str] = []
    for i in sorted(layers):
        if parts and i == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ",".join(parts)


class SelfSpecDrafter:
    """Drafts with a subset of the target's layers (native runtime only)."""

    name = "self"

    def __init__(self, runtime: object, layers: Sequence[int]) -> None:
        from ..runtime.native import NativeRuntime

        if not isinstance(runtime, NativeRuntime):
            raise ConfigError(
                "self-speculation runs a subset of the target's layers, which needs the native "
                "runtime; this model runs on the Hugging Face adapter (use --draft lookup instead)"
            )
        n = runtime.num_layers
        chosen = sorted(set(int(i) for i in layers))
        if not chosen:
            raise ConfigError("the self-speculation layer set is empty; give at least one layer")
        if len(chosen) == n:
            raise ConfigError(
                f"the self-speculation layer set is the whole model ({n} layers): it would cost "
                "as much as the target; leave some layers out"
            )
        if chosen[0] < 0 or chosen[-1] >= n:
            raise ConfigError(f"self-speculation layers must be in 0..{n - 1}, got {chosen}")
        self.rt = runtime
        self.layers = chosen
        self.name = f"self[{len(chosen)}/{n}]"
        self._sampling = SamplingConfig()
        self._generator = torch.Generator()

    @classmethod
    def early_exit(cls, runtime: object, exit_layer: int) -> SelfSpecDrafter:
        return cls(runtime, range(exit_layer))

    @property
    def description(self) -> str:
        n = self.rt.num_layers
        if self.layers == list(range(len(self.layers))):
            return f"early exit after layer {len(self.layers)} of {n}"
        skipped = sorted(set(range(n)) - set(self.layers))
        return f"{len(self.layers)} of {n} layers, skips {format_layers(skipped)}"

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self._sampling, self._generator = sampling, generator

    def propose(self, context: Sequence[int], k: int) -> Draft:
        base = self.rt.length  # == len(context) - 1: the last token is not in the cache yet
        if base + k > self.rt.max_context:
            return Draft([])
        logits = self.rt.forward([context[-1]], layers=self.layers)[-1]
        draft = draft_autoregressive(
            logits,
            lambda token: self.rt.forward([token], layers=self.layers)[-1],
            k,
            self._sampling,
            self._generator,
        )
        self.rt.rollback(base)  # verification rewrites all layers from here
        return draft

    def observe(self, num_accepted: int) -> None:
        pass
