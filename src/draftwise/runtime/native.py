"""The native runtime: a Llama-family decoder in plain PyTorch with a preallocated KV cache.

Covers Llama 2/3, SmolLM2, Mistral and Qwen2-style models: RMSNorm, rotary embeddings with the
model's theta and scaling, grouped-query attention, SwiGLU, tied or untied head.

Why it is faster than ``transformers`` at batch size 1 on a CPU:

- the KV cache is allocated once at load, ``[layers][kv_heads, max_context, head_dim]``, and
  written at token positions; ``rollback`` only moves ``length`` (no copy, no crop);
- q/k/v and gate/up projections are fused into one matmul each, so a layer is 4 matmuls;
- grouped-query attention folds the query heads of a group into the sequence axis
  (``[kv_heads, group * n, head_dim]``) instead of repeating K and V for every head;
- no ``nn.Module`` machinery, hooks or mask objects on the hot path.

``forward(ids, layers=...)`` runs a chosen subset of the decoder layers, then the final norm and
the shared head: the self-speculation draft. It writes the cache of those layers only; the
target's verification pass later rewrites every layer at those positions.

``forward(ids, parents=...)`` feeds a token tree (:mod:`.base`): row j is written at slot
``length + j`` but rotated to position ``length + depth(j)`` and masked to its ancestors; a chain
(``parents=None``) takes the plain path (sliced tables, causal mask). ``keep(base, rows)`` then
copies the kept path's K/V down to consecutive slots (only the rows not already in place).

``capture_features`` (:mod:`.features`) records hidden states per slot for an EAGLE draft head:
a pass then runs the layers in segments ending at the recorded ones and copies ``x`` after each
(capture off costs one ``None`` check a pass). A ``layers=`` pass records nothing.

Loading (the context length, the quantization modes, a state dict into fused matmuls) lives in
:mod:`.native_weights`; nothing there runs on the forward path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError, ContextLengthError, UnsupportedArchitectureError
from .base import ancestor_mask, check_keep, check_parents
from .features import FeatureCapture
from .llama import DEFAULT_MAX_CONTEXT, SUPPORTED_MODEL_TYPES, check_supported, load_state_dict, rope, rope_tables
from .native_weights import WeightLoader, context_length, quant_modes
from .quant import Q4Weight

__all__ = ["DEFAULT_MAX_CONTEXT", "SUPPORTED_MODEL_TYPES", "NativeRuntime", "check_supported", "load_state_dict"]


class NativeRuntime(FeatureCapture):
    """A Llama-family decoder with a position-indexed KV cache (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        state: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
        pack: bool = True,
        quant: str = "none",
        blocks: dict[str, Q4Weight] | None = None,
        block_sources: dict[str, str] | None = None,
        device: str | torch.device = "cpu",
        head_quant: str | None = None,
    ) -> None:
        problem = check_supported(config)
        if problem:
            raise UnsupportedArchitectureError(
                f"{problem}; load it with runtime='hf' (CLI: --runtime hf), the Hugging Face adapter"
            )
        self.config = config
        self._dtype = dtype
        self.n_heads: int = config.num_attention_heads
        self.n_kv: int = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.group = self.n_heads // self.n_kv
        self.eps: float = config.rms_norm_eps
        self._max_context = context_length(config, max_context)
        self.device = torch.device(device)
        self.quant, head_quant = quant_modes(quant, head_quant, self.device)
        weights = WeightLoader(
            state, dtype=dtype, device=self.device, pack=pack, blocks=blocks, block_sources=block_sources
        )
        self.weight_sources = weights.sources  # see WeightLoader.sources
        self.embed = weights.get("model.embed_tokens.weight")  # [vocab, d]
        self.final_norm = weights.get("model.norm.weight")
        self._load_layers(weights)
        self._load_head(weights, head_quant)
        self._allocate(dtype)
        self._length = 0
        # the last pass: where it started and its parents (None: a chain), for keep()
        self._pass_start = 0
        self._pass_parents: list[int] | None = None
        self._all_layers = tuple(range(self.num_layers))
        self.compiled = False
        self._layers = self._layers_impl
        self.head_rows: torch.Tensor | None = None  # see restrict_head
        self._head_sub: torch.Tensor | None = None
        self._feature_dim = int(self.embed.shape[1])  # see capture_features

    def _load_layers(self, weights: WeightLoader) -> None:
        """Each decoder layer's two norms and four fused matmuls: q/k/v, o, gate/up, down."""
        self.ln_attn: list[torch.Tensor] = []
        self.ln_mlp: list[torch.Tensor] = []
        self._qkv, self._o, self._gate_up, self._down = [], [], [], []  # type: ignore[var-annotated]
        linear, maybe, mode = weights.linear, weights.maybe, self.quant
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            biases = [maybe(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
            bqkv = torch.cat(biases) if all(b is not None for b in biases) else None  # type: ignore[misc]
            self._qkv.append(linear([p + f"self_attn.{x}_proj.weight" for x in "qkv"], bqkv, mode))
            self._o.append(linear([p + "self_attn.o_proj.weight"], maybe(p + "self_attn.o_proj.bias"), mode))
            self._gate_up.append(linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], None, mode))
            self._down.append(linear([p + "mlp.down_proj.weight"], None, mode))
            self.ln_attn.append(weights.get(p + "input_layernorm.weight"))
            self.ln_mlp.append(weights.get(p + "post_attention_layernorm.weight"))

    def _load_head(self, weights: WeightLoader, head_quant: str) -> None:
        """The output head: the embedding when tied (or when the weights have no head of their
        own), kept in ``dtype`` as :attr:`head` and as a matmul in ``head_quant``."""
        head_name = "lm_head.weight"
        state = weights.state
        tied = getattr(self.config, "tie_word_embeddings", head_name not in state) or head_name not in state
        self.head = self.embed if tied else weights.get(head_name)  # [vocab, d], in `dtype`
        self._head = weights.linear(["model.embed_tokens.weight" if tied else head_name], None, head_quant)

    def _allocate(self, dtype: torch.dtype) -> None:
        """The rotary tables and the KV cache, both for all ``max_context`` positions."""
        cos, sin = rope_tables(self.config, self._max_context)
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)])
        self.cos = cos.to(self.device, dtype)  # [max_context, hd]
        self.sin_signed = (sin * sign).to(self.device, dtype)  # sin with rotate_half's sign folded in
        # the KV cache: one [kv_heads, max_context, head_dim] buffer per layer for K and for V;
        # empty, not zeros: attention only ever reads positions below `length`, all written
        shape = (self.n_kv, self._max_context, self.head_dim)
        self.k_cache = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(self.num_layers)]
        self.v_cache = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(self.num_layers)]

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        config: Any | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
        **options: Any,
    ) -> NativeRuntime:
        """Load a Hugging Face folder; ``options`` go to the constructor (quant, blocks, device)."""
        if config is None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(folder))
        return cls(config, load_state_dict(Path(folder)), dtype=dtype, max_context=max_context, **options)

    def matmuls(self, layer: int) -> tuple[Any, Any, Any, Any]:
        """Layer ``layer``'s fused q/k/v, o, fused gate/up and down matmuls (each has ``nbytes``)."""
        return self._qkv[layer], self._o[layer], self._gate_up[layer], self._down[layer]

    @property
    def head_matmul(self) -> Any:
        """The output head's matmul (it has ``nbytes``)."""
        return self._head

    # -- the Runtime protocol -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.head.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def length(self) -> int:
        return self._length

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def supports_trees(self) -> bool:
        return True

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ConfigError(f"cannot roll back to {length}: the cache holds {self._length} positions")
        self._length = length

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        self._length = 0
        return self._run(ids, self._all_layers, last_only=True)[0]

    def forward(
        self, ids: Sequence[int], *, layers: Sequence[int] | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        chosen = self._all_layers
        if layers is not None:
            chosen = tuple(layers)
            if not chosen or any(not 0 <= i < self.num_layers for i in chosen):
                raise ConfigError(
                    f"layers={list(chosen)} must be a non-empty list of indices in [0, {self.num_layers})"
                )
        tree = None
        if parents is not None and check_parents(parents, len(ids)) is not None:
            tree = [int(p) for p in parents]  # a chain (None) takes the plain path
        return self._run(ids, chosen, last_only=False, parents=tree)

    def keep(self, base: int, rows: Sequence[int]) -> None:
        held = self._length - self._pass_start
        kept = check_keep(base, rows, start=self._pass_start, held=held, parents=self._pass_parents)
        # rows[i] >= i; the leading rows with rows[i] == i are in place already
        first = next((i for i, r in enumerate(kept) if r != i), len(kept))
        if first < len(kept):
            src = torch.tensor(kept[first:], device=self.device) + base  # [moved] slots
            dst = slice(base + first, base + len(kept))
            with torch.inference_mode():
                for cache in (*self.k_cache, *self.v_cache):
                    cache[:, dst] = cache.index_select(1, src)  # gathered first: src and dst may overlap
                if self._feats is not None:
                    self._feats.move(src, base + first)
        self._length = base + len(kept)
        self._pass_parents = None  # what stays is a chain

    def restrict_head(self, rows: Sequence[int] | torch.Tensor | None) -> None:
        """Score only the token ids ``rows`` (a reduced-vocabulary draft head, as in FR-Spec);
        every other id gets logit -inf, so q = 0 there. ``None`` restores the full head.

        The head's cost shrinks to ``len(rows) / vocab`` of itself; the logits keep their
        ``[n, vocab]`` shape, so a drafter and the verifier need not know.
        """
        if rows is None:
            self.head_rows, self._head_sub = None, None
            return
        index = torch.as_tensor(rows, dtype=torch.long, device=self.device).flatten()
        if index.numel() == 0 or int(index.min()) < 0 or int(index.max()) >= self.vocab_size:
            raise ConfigError(f"head rows must be a non-empty list of token ids in [0, {self.vocab_size})")
        if index.unique().numel() != index.numel():
            raise ConfigError("head rows must not repeat a token id")
        self.head_rows = index
        self._head_sub = self.head[index].contiguous()  # [rows, d]

    # -- the model ------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # one fused kernel (it accumulates in float32, as transformers' RMSNorm does)
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _layers_impl(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        start: int,
        end: int,
        layers: tuple[int, ...],
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The decoder layers ``layers`` over ``x`` (``[n, d]``, this pass's own tensor: it is
        updated in place), writing their K/V at slots ``start .. end - 1``; the rows sit at
        those positions, or at ``positions`` (``[n]``, a tree's) when given."""
        n = end - start
        H, KV, G, hd = self.n_heads, self.n_kv, self.group, self.head_dim
        if positions is None:
            cos = self.cos[start:end, None, :]  # [n, 1, hd]
            sin = self.sin_signed[start:end, None, :]
        else:
            cos = self.cos[positions, None, :]  # [n, 1, hd]
            sin = self.sin_signed[positions, None, :]
        for i in layers:
            h = self._norm(x, self.ln_attn[i])
            qkv = self._qkv[i](h)  # [n, (H + 2 KV) * hd]
            qk = rope(qkv[:, : (H + KV) * hd].view(n, H + KV, hd), cos, sin)  # q and k at once
            q, k = qk[:, :H], qk[:, H:]
            self.k_cache[i][:, start:end] = k.transpose(0, 1)  # [KV, n, hd]
            self.v_cache[i][:, start:end] = qkv[:, (H + KV) * hd :].view(n, KV, hd).transpose(0, 1)
            # fold each group's query heads into the sequence axis: [KV, G * n, hd]
            qg = q.reshape(n, KV, G, hd).permute(1, 2, 0, 3).reshape(KV, G * n, hd)
            att = F.scaled_dot_product_attention(
                qg[None], self.k_cache[i][None, :, :end], self.v_cache[i][None, :, :end], attn_mask=mask
            )  # [1, KV, G * n, hd]
            att = att[0].view(KV, G, n, hd).permute(2, 0, 1, 3).reshape(n, H * hd)
            x.add_(self._o[i](att))
            h = self._norm(x, self.ln_mlp[i])
            gate, up = self._gate_up[i](h).chunk(2, dim=-1)  # [n, ffn] each
            x.add_(self._down[i](F.silu(gate).mul_(up)))
        return x

    def enable_compile(self) -> str | None:
        """Run the decoder layers through ``torch.compile`` (inductor: it fuses the norms, rope,
        reshapes and SwiGLU between the matmuls). Returns why not, in a few words, where this
        machine cannot (no C++ compiler, a device inductor does not cover), and stays eager."""
        import shutil

        if self.device.type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
            return "no C++ compiler on PATH"
        try:
            compiled = torch.compile(self._layers_impl, dynamic=True)
            self._layers = compiled
            with torch.no_grad():  # warm up the shapes a decode uses: n = 1 and n > 1
                saved = self._length, self._pass_start, self._pass_parents
                self._run([0, 0], self._all_layers, last_only=False)
                self._run([0], self._all_layers, last_only=False)
                self._length, self._pass_start, self._pass_parents = saved
        except Exception as exc:  # inductor raises many kinds; any of them means eager
            self._layers = self._layers_impl
            return f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        self.compiled = True
        return None

    def _run(
        self, ids: Sequence[int], layers: Sequence[int], *, last_only: bool, parents: list[int] | None = None
    ) -> torch.Tensor:
        # inference_mode is faster, but tensors made under it cannot enter a compiled graph
        with torch.no_grad() if self.compiled else torch.inference_mode():
            return self._run_impl(ids, layers, last_only=last_only, parents=parents)

    def _run_impl(
        self, ids: Sequence[int], layers: Sequence[int], *, last_only: bool, parents: list[int] | None
    ) -> torch.Tensor:
        n = len(ids)
        if n == 0:
            raise ConfigError("forward needs at least one token")
        start = self._length
        end = start + n
        if end > self._max_context:
            raise ContextLengthError(
                f"{end} positions do not fit in the context of {self._max_context} tokens; "
                "shorten the prompt, ask for fewer new tokens, or load with a larger max_context"
            )
        tokens = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        x = F.embedding(tokens, self.embed)  # [n, d]
        mask, positions = None, None
        if parents is not None:  # a tree: row j sees the cache and its ancestors-or-self
            depths = check_parents(parents, n) or list(range(n))
            positions = torch.tensor(depths, device=self.device) + start  # [n]
            seen = torch.ones(n, start, dtype=torch.bool, device=self.device)
            mask = torch.cat([seen, ancestor_mask(parents, self.device)], dim=1)  # [n, end]
        elif n > 1:  # query i (at position start+i) sees keys 0..start+i
            pos = torch.arange(end, device=self.device)
            mask = pos[None, :] <= pos[start:, None]  # [n, end]
        mask = None if mask is None else mask.repeat(self.group, 1)  # [G * n, end]: the folded query layout
        if self._feats is not None and tuple(layers) == self._all_layers:  # record (see .features)
            x = self._feats.run_recorded(lambda part, x: self._layers(x, mask, start, end, part, positions), x, start)
        else:
            x = self._layers(x, mask, start, end, tuple(layers), positions)
            if self._feats is not None:
                self._feats.forget(start)  # a draft pass: its slots hold no target features
        self._length = end
        self._pass_start, self._pass_parents = start, parents
        if last_only:
            x = x[-1:]
        x = self._norm(x, self.final_norm)
        if self.head_rows is None:
            return self._head(x).float()  # [n or 1, vocab]
        assert self._head_sub is not None
        out = torch.full((x.shape[0], self.vocab_size), float("-inf"), device=self.device)  # [n or 1, vocab]
        return out.index_copy_(1, self.head_rows, F.linear(x, self._head_sub).float())

