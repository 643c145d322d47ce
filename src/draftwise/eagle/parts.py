"""What an EAGLE head borrows from its target and how it drafts in int8: the target's embedding,
final norm and LM head rows (:class:`TargetParts`, for training and drafting), and the head's
int8 copy for drafting (:func:`int8_head`)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from draftwise.eagle.head import EagleHead
from draftwise.errors import ConfigError
from draftwise.runtime.quant import Int8Linear


def hf_model(runtime: Any) -> Any:
    """The transformers model inside a runtime (None for the native runtime)."""
    return getattr(runtime, "model", None) or getattr(runtime, "_model", None)


#: the decoder layer's matmuls :func:`int8_head` runs in int8; ``fc`` stays float32 (it fuses
#: three layers' features and its rows hold outliers ~60x their mean: int8 rounds its output
#: by ~6% where these layers lose 1-4%)
INT8_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Int8Layer(nn.Module):
    """``x W^T + b`` over ``x`` of any leading shape with
    :class:`~draftwise.runtime.quant.Int8Linear` weights (a head's layer or LM head rows), for
    drafting."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.linear = Int8Linear(weight.detach(), None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


def int8_head(head: EagleHead) -> EagleHead:
    """A copy of ``head`` for drafting, its decoder layer's matmuls (:data:`INT8_LAYERS`) in
    per-channel int8; ``head`` itself is left as it is (training keeps float32)."""
    out = copy.deepcopy(head)
    for name in INT8_LAYERS:
        layer = getattr(head, name)
        setattr(out, name, _Int8Layer(layer.weight, layer.bias))
    return out


class TargetParts:
    """The target's embedding, final norm and LM head rows, which a head borrows (float32).

    ``rows``: the head rows a reduced-vocabulary head scores (FR-Spec), or None for all.
    ``int8``: score with the LM head rows in per-channel int8 (drafting only; training's
    targets need float32). Training (``draftwise train-head``) and drafting use the same class."""

    def __init__(
        self, runtime: Any, rows: torch.Tensor | None, device: torch.device | str = "cpu", *, int8: bool = False
    ) -> None:
        self.vocab_size = int(runtime.vocab_size)
        self.device = torch.device(device)
        self.rows = None if rows is None else rows.to(self.device)
        self._embed_module: Any = None
        if hasattr(runtime, "embed") and hasattr(runtime, "final_norm"):  # the native runtime
            self.embed_table: torch.Tensor | None = runtime.embed.float().to(self.device)
            weight, eps = runtime.final_norm.float().to(self.device), float(runtime.eps)
            self._norm = lambda h: F.rms_norm(h, weight.shape, weight, eps)
            head = runtime.head.float()
        else:  # a transformers model: its own modules (Gemma scales its embeddings, norms by 1 + w)
            model = hf_model(runtime)
            if model is None:
                raise ConfigError(f"EAGLE cannot reach the embeddings of a {type(runtime).__name__} runtime")
            self.embed_table, self._embed_module = None, model.get_input_embeddings()
            norm_module = model.get_decoder().norm
            self._norm = lambda h: norm_module(h.to(next(norm_module.parameters()).dtype)).float()
            head = model.get_output_embeddings().weight.float()
        head = head if rows is None else head[rows.to(head.device)]
        self.head = head.to(self.device).contiguous()  # [V', d]
        self._int8 = _Int8Layer(self.head) if int8 else None

    @classmethod
    def of(cls, runtime: Any, draft_tokens: Sequence[int] | None, device: torch.device | str = "cpu",
           *, int8: bool = False) -> TargetParts:
        if draft_tokens is None:
            return cls(runtime, None, device, int8=int8)
        # a tensor as it is: list() of an 8,192-row tensor unbinds it into 0-d tensors (~0.3 s)
        ids = draft_tokens if isinstance(draft_tokens, torch.Tensor) else list(draft_tokens)
        return cls(runtime, torch.as_tensor(ids, dtype=torch.long), device, int8=int8)

    def embed(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``[..., d]`` float32 embeddings of token ids (a list, or a tensor of any shape)."""
        index = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(list(ids), dtype=torch.long)
        if self.embed_table is not None:
            return F.embedding(index.to(self.device), self.embed_table)
        module = self._embed_module
        flat = module(index.reshape(1, -1).to(module.weight.device))[0].float().to(self.device)
        return flat.reshape(*index.shape, -1)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., V']``: the final norm and the head rows on predicted features ``[..., d]``."""
        normed = self._norm(hidden)
        return F.linear(normed, self.head) if self._int8 is None else self._int8(normed)

    def best(self, hidden: torch.Tensor) -> tuple[int, float]:
        """Greedy's next token after one predicted feature ``[1, d]``, and the head's probability
        of it, from its own rows (ties go to the lowest id, as :meth:`logits`' argmax: the rows
        are ascending token ids)."""
        return self.best_many(hidden[:1])[0]

    def best_many(self, hidden: torch.Tensor) -> list[tuple[int, float]]:
        """:meth:`best` for each row of ``hidden`` ``[B, d]``, in one pass over the head rows."""
        scores = self.scores(hidden)  # [B, V']
        j = scores.argmax(-1)
        top = torch.softmax(scores, -1).gather(-1, j[:, None])[:, 0]
        ids = j if self.rows is None else self.rows[j]
        return list(zip(ids.tolist(), top.tolist()))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., vocab]`` scores over the whole vocabulary: -inf outside a reduced one."""
        scores = self.scores(hidden)
        if self.rows is None:
            return scores
        out = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.rows, scores)
