"""A smaller model with the same tokenizer, in its own runtime and KV cache.

Each step it catches up on the tokens committed since its last proposal (one multi-token pass),
then proposes k tokens one by one. In sampling mode it samples each token from q, the very
distribution that rejection sampling uses in p/q; in greedy mode it proposes its argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftwise.core.draft import Capabilities, Draft, draft_autoregressive
from draftwise.core.sampling import SamplingConfig
from draftwise.errors import ConfigError
from draftwise.runtime.base import Runtime


def check_same_tokenizer(target_tok: Any, draft_tok: Any) -> None:
    """Raise unless the two tokenizers map the same strings to the same ids."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if t_vocab == d_vocab:
        return
    t_by_id = {i: s for s, i in t_vocab.items()}
    d_by_id = {i: s for s, i in d_vocab.items()}
    for i in range(max(len(t_by_id), len(d_by_id))):
        if t_by_id.get(i) != d_by_id.get(i):
            raise ConfigError(
                f"the draft's tokenizer differs from the target's: vocabularies of {len(d_vocab)} "
                f"and {len(t_vocab)} tokens; first difference at id {i}: draft "
                f"{d_by_id.get(i)!r}, target {t_by_id.get(i)!r}. A model draft must share the "
                "target's tokenizer (use a model of the same family, or --draft lookup / self)"
            )


class ModelDrafter:
    """Drafts with a separate, smaller runtime.

    ``vocab_size`` is the target's head width: the draft's logits are cut or padded (with -inf)
    to it, so that vocabularies differing only by padding rows line up token for token.
    """

    name = "model"
    capabilities = Capabilities(replay="hits", cost="model")

    def __init__(self, runtime: Runtime, *, vocab_size: int, label: str = "model") -> None:
        self.rt = runtime
        self.vocab_size = vocab_size
        self.name = label
        self._sampling = SamplingConfig()
        self._generator = torch.Generator()
        self._cached = 0  # leading context tokens whose K/V the draft cache holds
        self._context_len = 0
        self._k = 0

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self._sampling, self._generator = sampling, generator
        self._cached = 0
        self.rt.rollback(0)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        width = logits.shape[-1]
        if width == self.vocab_size:
            return logits
        if width > self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - width), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if len(context) + k - 1 > self.rt.max_context:
            self._k = 0
            return Draft([])  # the draft's context is full: let the target decode alone
        self.rt.rollback(self._cached)
        logits = self._fit(self.rt.forward(list(context[self._cached :]))[-1])  # [vocab]
        draft = draft_autoregressive(
            logits,
            lambda token: self._fit(self.rt.forward([token])[-1]),
            k,
            self._sampling,
            self._generator,
        )
        self._context_len, self._k = len(context), k
        return draft

    def observe(self, num_accepted: int) -> None:
        if self._k == 0:
            return
        # the cache holds context + tokens[:k-1]; the accepted ones stay valid
        self._cached = self._context_len + min(num_accepted, self._k - 1)
        self.rt.rollback(self._cached)

    def end(self, output: Sequence[int] | None) -> None:
        pass  # the draft's cache is rolled back at the next start
