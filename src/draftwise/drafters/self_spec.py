"""Self-speculation: the target's own network with layers left out.

Two shapes: an *early exit* after layer L (layers 0..L-1, then the final norm and the shared
head), or a *skip set* (every layer except some). The draft shares the target's weights and
cache: its partial passes write only their own layers at the proposed positions, and it rolls
the cache back before verification, whose full-depth pass rewrites every layer there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftwise.core.draft import Capabilities, Draft, draft_autoregressive
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.spec import format_layers
from draftwise.errors import ConfigError


class SelfSpecDrafter:
    """Drafts with a subset of the target's layers (native runtime only)."""

    name = "self"
    capabilities = Capabilities(shares_target_cache=True, replay="hits", cost="target_layers")

    def __init__(self, runtime: object, layers: Sequence[int]) -> None:
        if not getattr(runtime, "runs_layer_subsets", False):  # declared by the native runtime and its slots
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
            bad = [i for i in chosen if not 0 <= i < n]
            raise ConfigError(
                f"self-speculation layers must be in 0..{n - 1}; {format_layers(bad)} are not"
            )
        self.rt = runtime
        self.layers = chosen
        self.name = f"self[{len(chosen)}/{n}]"
        self._sampling = SamplingConfig()
        self._generator = torch.Generator()

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

    def end(self, output: Sequence[int] | None) -> None:
        pass
