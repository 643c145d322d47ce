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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError, ContextLengthError, ModelLoadError, UnsupportedArchitectureError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
DEFAULT_MAX_CONTEXT = 8192


def _mkl_packing_works() -> bool:
    """Whether this torch build can pre-pack float32 weights for MKL (checked once, on a
    small random matrix against ``F.linear``)."""
    mkl = getattr(torch.ops, "mkl", None)
    if not torch.backends.mkl.is_available() or not hasattr(mkl, "_mkl_reorder_linear_weight"):
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 16, generator=gen), torch.randn(3, 16, generator=gen)
        packed = mkl._mkl_reorder_linear_weight(w, PACK_BATCH)
        y = mkl._mkl_linear(x, packed, w, None, 3)
        return bool(torch.allclose(y, F.linear(x, w), atol=1e-4))
    except (RuntimeError, AttributeError):
        return False


PACK_BATCH = 16  # the batch MKL packs for; passes of 1-16 tokens all use the packed layout
_PACKING: bool | None = None


class Linear:
    """``y = x W^T + b`` on a 2-D ``x``.

    On a CPU in float32 the weight is re-laid out for MKL once, at load. ``F.linear`` packs
    it again on every call, which is cheap next to one token's matrix-vector product but makes
    a pass over 4 tokens cost about twice a pass over 1 (and 8 tokens three times): exactly the
    verification pass speculative decoding needs to be cheap. Pre-packed, 2-8 tokens cost
    about what 1 does. The packed copy takes 2-3x the weight's memory.
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pack: bool = True) -> None:
        global _PACKING
        self.weight, self.bias = weight, bias
        self.packed: torch.Tensor | None = None
        if pack and weight.dtype == torch.float32 and weight.device.type == "cpu":
            if _PACKING is None:
                _PACKING = _mkl_packing_works()
            if _PACKING:
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_BATCH)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, x.shape[0])


def check_supported(config: Any) -> str | None:
    """Why the native runtime cannot run ``config``, or None when it can."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"the native runtime does not implement model_type {model_type!r} "
            f"(it covers {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"the native runtime implements SwiGLU (hidden_act='silu'), not {act!r}"
    if getattr(config, "mlp_bias", False):
        return "the native runtime does not implement MLP biases (mlp_bias=True)"
    return None


def _rope_tables(config: Any, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[positions, head_dim]`` in float32, computed exactly as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scale = 1.0
    elif rope_type in ("linear", "llama3", "yarn", "longrope"):
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    else:
        raise UnsupportedArchitectureError(
            f"the native runtime does not implement rope_type {rope_type!r}; "
            "load the model with runtime='hf' (the Hugging Face adapter)"
        )
    freqs = torch.arange(positions, dtype=torch.float)[:, None] * inv_freq[None, :].float()
    emb = torch.cat((freqs, freqs), dim=-1)  # [positions, head_dim]
    return emb.cos() * scale, emb.sin() * scale


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face folder's safetensors files (sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as exc:
            raise ModelLoadError(f"could not read weights file {f}: {exc}") from exc
    return state


class NativeRuntime:
    """A Llama-family decoder with a position-indexed KV cache (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        state: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
        pack: bool = True,
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
        limit = int(getattr(config, "max_position_embeddings", DEFAULT_MAX_CONTEXT))
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", window is not None) and window:
            # a context no longer than the window needs no sliding mask
            limit = min(limit, int(window))
        if max_context is None:
            max_context = min(limit, DEFAULT_MAX_CONTEXT)
        elif max_context > limit:
            raise ConfigError(
                f"max_context={max_context} exceeds what this model supports ({limit}); "
                f"pass max_context <= {limit}"
            )
        self._max_context = int(max_context)

        def get(name: str) -> torch.Tensor:
            try:
                return state[name].to(dtype)
            except KeyError:
                raise ModelLoadError(f"weights lack tensor {name!r}") from None

        def maybe(name: str) -> torch.Tensor | None:
            return state[name].to(dtype) if name in state else None

        self.embed = get("model.embed_tokens.weight")  # [vocab, d]
        head = maybe("lm_head.weight")
        tied = getattr(config, "tie_word_embeddings", head is None)
        self.head = self.embed if (tied or head is None) else head  # [vocab, d]
        self.final_norm = get("model.norm.weight")
        self.wqkv: list[torch.Tensor] = []  # [(H + 2 KV) * hd, d]
        self.bqkv: list[torch.Tensor | None] = []
        self.wo: list[torch.Tensor] = []  # [d, H * hd]
        self.bo: list[torch.Tensor | None] = []  # Llama with attention_bias=True has one
        self.w_gate_up: list[torch.Tensor] = []  # [2 * ffn, d]
        self.w_down: list[torch.Tensor] = []  # [d, ffn]
        self.ln_attn: list[torch.Tensor] = []
        self.ln_mlp: list[torch.Tensor] = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            self.wqkv.append(
                torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"], dim=0).contiguous()
            )
            biases = [maybe(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
            self.bqkv.append(torch.cat(biases) if all(b is not None for b in biases) else None)  # type: ignore[misc]
            self.wo.append(get(p + "self_attn.o_proj.weight"))
            self.bo.append(maybe(p + "self_attn.o_proj.bias"))
            self.w_gate_up.append(
                torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]).contiguous()
            )
            self.w_down.append(get(p + "mlp.down_proj.weight"))
            self.ln_attn.append(get(p + "input_layernorm.weight"))
            self.ln_mlp.append(get(p + "post_attention_layernorm.weight"))
        self._qkv = [Linear(w, b, pack=pack) for w, b in zip(self.wqkv, self.bqkv)]
        self._o = [Linear(w, b, pack=pack) for w, b in zip(self.wo, self.bo)]
        self._gate_up = [Linear(w, pack=pack) for w in self.w_gate_up]
        self._down = [Linear(w, pack=pack) for w in self.w_down]
        self._head = Linear(self.head, pack=pack)
        cos, sin = _rope_tables(config, self._max_context)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)  # [max_context, hd]
        # the KV cache: one [kv_heads, max_context, head_dim] buffer per layer for K and for V;
        # empty, not zeros: attention only ever reads positions below `length`, all written
        shape = (self.n_kv, self._max_context, self.head_dim)
        self.k_cache = [torch.empty(shape, dtype=dtype) for _ in range(self.num_layers)]
        self.v_cache = [torch.empty(shape, dtype=dtype) for _ in range(self.num_layers)]
        self._length = 0
        self._all_layers = tuple(range(self.num_layers))
        self.head_rows: torch.Tensor | None = None  # see restrict_head
        self._head_sub: torch.Tensor | None = None

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        config: Any | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
    ) -> NativeRuntime:
        if config is None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(folder))
        return cls(config, load_state_dict(Path(folder)), dtype=dtype, max_context=max_context)

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

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ConfigError(f"cannot roll back to {length}: the cache holds {self._length} positions")
        self._length = length

    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        self._length = 0
        return self._run(ids, self._all_layers, last_only=True)[0]

    def forward(self, ids: Sequence[int], *, layers: Sequence[int] | None = None) -> torch.Tensor:
        if layers is None:
            return self._run(ids, self._all_layers, last_only=False)
        chosen = tuple(layers)
        if not chosen or any(not 0 <= i < self.num_layers for i in chosen):
            raise ConfigError(
                f"layers={list(chosen)} must be a non-empty list of indices in [0, {self.num_layers})"
            )
        return self._run(ids, chosen, last_only=False)

    def restrict_head(self, rows: Sequence[int] | torch.Tensor | None) -> None:
        """Score only the token ids ``rows`` (a reduced-vocabulary draft head, as in FR-Spec);
        every other id gets logit -inf, so q = 0 there. ``None`` restores the full head.

        The head's cost shrinks to ``len(rows) / vocab`` of itself; the logits keep their
        ``[n, vocab]`` shape, so a drafter and the verifier need not know.
        """
        if rows is None:
            self.head_rows, self._head_sub = None, None
            return
        index = torch.as_tensor(rows, dtype=torch.long).flatten()
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

    @torch.inference_mode()
    def _run(self, ids: Sequence[int], layers: Sequence[int], *, last_only: bool) -> torch.Tensor:
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
        H, KV, G, hd = self.n_heads, self.n_kv, self.group, self.head_dim
        tokens = torch.as_tensor(ids, dtype=torch.long)
        x = F.embedding(tokens, self.embed)  # [n, d]
        cos = self.cos[start:end, None, :]  # [n, 1, hd]
        sin = self.sin[start:end, None, :]
        mask = None
        if n > 1:  # query i (at position start+i) sees keys 0..start+i
            mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]  # [n, end]
            mask = mask.repeat(G, 1)  # [G * n, end], matching the folded query layout
        for i in layers:
            h = self._norm(x, self.ln_attn[i])
            qkv = self._qkv[i](h)  # [n, (H + 2 KV) * hd]
            q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
            q = q.view(n, H, hd)
            k = k.view(n, KV, hd)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k_cache[i][:, start:end] = k.transpose(0, 1)  # [KV, n, hd]
            self.v_cache[i][:, start:end] = v.view(n, KV, hd).transpose(0, 1)
            # fold each group's query heads into the sequence axis: [KV, G * n, hd]
            qg = q.view(n, KV, G, hd).permute(1, 2, 0, 3).reshape(KV, G * n, hd)
            att = F.scaled_dot_product_attention(
                qg[None], self.k_cache[i][None, :, :end], self.v_cache[i][None, :, :end], attn_mask=mask
            )  # [1, KV, G * n, hd]
            att = att[0].view(KV, G, n, hd).permute(2, 0, 1, 3).reshape(n, H * hd)
            x = x + self._o[i](att)
            h = self._norm(x, self.ln_mlp[i])
            gate, up = self._gate_up[i](h).chunk(2, dim=-1)  # [n, ffn] each
            x = x + self._down[i](F.silu(gate) * up)
        self._length = end
        if last_only:
            x = x[-1:]
        x = self._norm(x, self.final_norm)
        if self.head_rows is None:
            return self._head(x).float()  # [n or 1, vocab]
        assert self._head_sub is not None
        out = torch.full((x.shape[0], self.vocab_size), float("-inf"))  # [n or 1, vocab]
        return out.index_copy_(1, self.head_rows, F.linear(x, self._head_sub).float())

