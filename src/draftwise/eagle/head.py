"""The feature-level draft head (EAGLE, Li et al., ICML 2024): its shape, weights and files.

One decoder layer of the target's own shape reads, at position t, the target's feature f_t
(the last decoder layer's output, before the final norm) and the embedding of the token
x_{t+1} that followed it::

    h_t = fc(concat(embed(x_{t+1}), f_t))          # [2d] -> [d]
    f'_{t+1} = DecoderLayer(h_t)                     # attends to the head's own KV cache
    q(x_{t+2}) = softmax(lm_head(final_norm(f'_{t+1})))   # the target's norm and head

Drafting goes on from f' (the head's guess of the target's next feature). The embedding, the
final norm and the LM head are the target's and are not stored; a reduced-vocabulary head
(FR-Spec) is a list of the target's head rows (``draft_tokens``).

``arch="eagle3"`` is the EAGLE-3 layer (Li et al., 2025), as ``speculators`` and vLLM define it:
the feature is three of the target's layers side by side, fused once by ``fc`` (``[3d] -> [d]``;
:meth:`EagleHead.lift`), and the layer attends over ``concat(input_layernorm(embed),
hidden_norm(g))`` (``2d`` wide) while its residual carries ``g`` alone::

    g_t = fc(concat(f^low_t, f^mid_t, f^high_t))       # the target's rows only
    f'_{t+1} = g_t + Attn(concat(norm(embed(x_{t+1})), hidden_norm(g_t))) ... + MLP(...)

Drafted rows feed ``f'`` back as ``g`` (no ``fc``). :meth:`EagleHead.lift` is the identity for
EAGLE-1, so callers lift the target's features and treat both alike.

A head folder holds ``eagle_head.safetensors`` (fp32 or bf16 tensors, plus ``draft_tokens``)
and ``draftwise_head.json`` (shape, the target's fingerprint, how it was trained); reading and
writing them is :mod:`.head_files`.

>>> cfg = HeadConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
...                  intermediate_size=16, rms_norm_eps=1e-5, rope_theta=10000.0)
>>> head = EagleHead(cfg)
>>> x = head(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), torch.arange(3)[None])
>>> tuple(x.shape)
(1, 3, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.errors import ConfigError


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape. A head copies the target's layer shape (``from_target``)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    #: RMS-normalise the feature before ``fc`` (as EAGLE-3's ``hidden_norm``): the target's
    #: pre-norm hidden states carry a few massive dimensions (SmolLM2-135M: up to ~4400 where
    #: the median is ~15), which otherwise swamp the rest of the feature
    feature_norm: bool = False
    #: "eagle1" (fc mixes embedding and feature) or "eagle3" (fc fuses ``aux_layers``)
    arch: str = "eagle1"
    #: EAGLE-3: the target's decoder layers whose outputs are fused (0-based: output of layer i)
    aux_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"the head's arch {self.arch!r} is not one of {', '.join(ARCHS)}")
        if self.arch == "eagle3" and not self.aux_layers:
            raise ConfigError("an eagle3 head needs aux_layers: the target layers whose outputs it fuses")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """What the runtime records for this head: ``capture_features(layers=...)``."""
        return self.aux_layers if self.arch == "eagle3" else None

    @classmethod
    def from_target(
        cls, config: Any, *, feature_norm: bool = False, arch: str = "eagle1", aux_layers: Sequence[int] | None = None
    ) -> HeadConfig:
        """The shape of one decoder layer of the target (a transformers config). An eagle3 head
        fuses ``aux_layers`` (default :func:`default_aux_layers`)."""
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        if arch == "eagle3" and aux_layers is None:
            aux_layers = default_aux_layers(int(config.num_hidden_layers))
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            intermediate_size=int(config.intermediate_size),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(config)),
            feature_norm=feature_norm,
            arch=arch,
            aux_layers=None if aux_layers is None else tuple(aux_layers),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        try:
            return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data or f.name not in OPTIONAL})
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"the head's config lacks or mistypes a field ({exc})") from None


ARCHS = ("eagle1", "eagle3")
OPTIONAL = ("feature_norm", "arch", "aux_layers")  # fields older head files may lack


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high features for a target of ``num_layers`` layers, as outputs of
    layers (0-based). vLLM and ``speculators`` number the same states ``2, L // 2, L - 3`` as the
    *input* of a layer, so ours are one less.

    >>> default_aux_layers(30)
    (1, 14, 26)
    """
    ids = (2, num_layers // 2, num_layers - 3)  # vLLM's, clamped for tiny test models
    low, mid, high = (min(max(i - 1, 0), num_layers - 1) for i in ids)
    return (low, mid, high)


def _rope_theta(config: Any) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # transformers 5 keeps it in rope_parameters
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta or 10000.0)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (transformers' ``rotate_half`` convention); x: [..., n, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class HeadCache:
    """The head's own KV cache for one sequence: exact, free rollback (a length). Rows from
    ``first`` on are attended to: a sequence whose prompt began with a prefix copied from a prefix
    cache has no target features there, so its head starts at the copy's end (``first``)."""

    def __init__(self, cfg: HeadConfig, max_context: int, dtype: torch.dtype = torch.float32) -> None:
        shape = (1, cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)
        self.length = 0
        self.first = 0
        self.max_context = max_context

    def rollback(self, length: int) -> None:
        self.length = max(0, min(length, self.length))


class EagleHead(nn.Module):
    """fc + one decoder layer. ``forward`` takes embeddings ``[B, n, d]``, hidden inputs ``[B, n,
    d]`` (the target's lifted features, or the head's own earlier outputs) and positions ``[B,
    n]``, and returns the predicted next features ``[B, n, d]`` (pre-norm).

    Without a cache the rows attend causally to each other (training). With a
    :class:`HeadCache` (B = 1) the rows are appended at ``cache.length`` and attend to the
    cache and causally to each other (drafting), or as ``attn_mask`` (``[n, length + n]``
    bool) says: a tree's rows see the real rows and their own ancestors only.
    :meth:`rollout` runs EAGLE-3's training-time test."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        eagle3 = cfg.arch == "eagle3"
        self.fc = nn.Linear(len(cfg.aux_layers or ()) * d if eagle3 else 2 * d, d, bias=False)
        self.feature_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps) if cfg.feature_norm and not eagle3 else None
        self.hidden_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps) if eagle3 else None
        self.input_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        attn_in = 2 * d if eagle3 else d
        self.q_proj = nn.Linear(attn_in, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(attn_in, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(attn_in, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, d, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def lift(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's recorded features -> the layer's hidden input: ``fc`` fuses EAGLE-3's
        three layers (``[..., 3d] -> [..., d]``); EAGLE-1's feature is used as it is."""
        return self.fc(feats) if self.hidden_norm is not None else feats

    def init_from_layer(self, layer_weights: dict[str, torch.Tensor]) -> None:
        """Start the decoder layer from one of the target's (``self_attn.q_proj.weight``, ...
        names as in a transformers state dict, without the ``model.layers.i.`` prefix). An eagle3
        head's attention reads ``[embedding | hidden]``: the layer's weights go to the hidden
        half, zeros to the embedding half, and its input norm becomes ``hidden_norm``."""
        eagle3 = self.hidden_norm is not None
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name == "fc.weight" or name.startswith("feature_norm"):
                    continue
                if eagle3 and name.startswith(("hidden_norm", "input_layernorm")):
                    if name.startswith("hidden_norm") and "input_layernorm.weight" in layer_weights:
                        param.copy_(layer_weights["input_layernorm.weight"].to(param.dtype))
                    continue
                source = name if "layernorm" in name else _hf_name(name)
                if source not in layer_weights:
                    continue
                weight = layer_weights[source].to(param.dtype)
                if weight.shape != param.shape and eagle3 and param.shape[1] == 2 * weight.shape[1]:
                    param.zero_()
                    param[:, weight.shape[1] :] = weight
                else:
                    param.copy_(weight)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq  # [B, n, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, n, hd]
        return emb.cos(), emb.sin()

    def _qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q ``[B, H, n, hd]``, k, v ``[B, KV, n, hd]``, the residual ``[B, n, d]``)."""
        cfg = self.cfg
        B, n, _ = embeds.shape
        H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if self.hidden_norm is None:  # EAGLE-1: fc mixes, the layer runs on the mix
            if self.feature_norm is not None:
                hidden = self.feature_norm(hidden)
            residual = self.fc(torch.cat([embeds, hidden], dim=-1))
            h = self.input_layernorm(residual)
        else:  # EAGLE-3: attend over [norm(embedding) | norm(hidden)], keep the hidden input
            residual = hidden
            h = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        cos, sin = self._rope(positions)
        q = rotate(self.q_proj(h).view(B, n, H, hd).transpose(1, 2), cos, sin)
        k = rotate(self.k_proj(h).view(B, n, KV, hd).transpose(1, 2), cos, sin)
        v = self.v_proj(h).view(B, n, KV, hd).transpose(1, 2)
        return q, k, v, residual

    def _finish(self, att: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        B, _, n, _ = att.shape
        x = residual + self.o_proj(att.transpose(1, 2).reshape(B, n, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def forward(
        self,
        embeds: torch.Tensor,
        feats: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadCache | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cfg = self.cfg
        n = embeds.shape[1]
        gqa = cfg.num_attention_heads != cfg.num_key_value_heads
        q, k, v, residual = self._qkv(embeds, feats, positions)
        if cache is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, enable_gqa=gqa)
        else:
            att = self._attend_cached(q, k, v, cache, attn_mask)
        return self._finish(att, residual)

    def _attend_cached(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: HeadCache,
                       attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One sequence's new rows (``q`` ``[1, H, n, hd]``, ``k``/``v`` ``[1, KV, n, hd]``) appended
        to its cache, attending to it and causally to each other, or as ``attn_mask`` says."""
        n = q.shape[2]
        start, end = cache.length, cache.length + n
        if end > cache.max_context:
            raise ConfigError(f"the draft head's cache holds {cache.max_context} positions; {end} asked")
        cache.k[:, :, start:end] = k
        cache.v[:, :, start:end] = v
        cache.length = end
        first = min(cache.first, start)  # rows before it hold nothing (see HeadCache)
        mask = attn_mask  # [n, end] bool: a tree's rows see the cache and their ancestors
        if mask is None and n > 1:
            pos = torch.arange(end)
            mask = pos[None, :] <= pos[start:, None]  # [n, end]
        if mask is not None and first:
            mask = mask[:, first:]
        gqa = self.cfg.num_attention_heads != self.cfg.num_key_value_heads
        return F.scaled_dot_product_attention(q, cache.k[:, :, first:end], cache.v[:, :, first:end], attn_mask=mask,
                                              enable_gqa=gqa)

    def forward_many(self, embeds: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
                     lengths: Sequence[int], caches: Sequence[HeadCache]) -> torch.Tensor:
        """Several sequences' rows in one call: ``embeds``, ``feats`` ``[R, d]`` and ``positions``
        ``[R]``, sequence i's ``lengths[i]`` rows after sequence i - 1's, each appended to its own
        ``caches[i]`` as :meth:`forward` appends one sequence's. The matmuls run once over all
        rows (the weights are read once); only attention runs per sequence. Returns ``[R, d]``."""
        q, k, v, residual = self._qkv(embeds[None], feats[None], positions[None])
        parts, lo = [], 0
        for n, cache in zip(lengths, caches):
            parts.append(self._attend_cached(q[:, :, lo : lo + n], k[:, :, lo : lo + n], v[:, :, lo : lo + n], cache))
            lo += n
        return self._finish(torch.cat(parts, dim=2), residual)[0]

    def rollout(self, embeds: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """EAGLE-3's training-time test: ``steps`` outputs ``[B, n, d]``, computed as drafting
        would. Step 0 is :meth:`forward` on the lifted target features. At step j, row t is the
        j-th drafted row of a chain whose last real row is t - j: its hidden input is step j-1's
        output at row t - 1, its token the real x_{t+1} (teacher forcing), and it attends to step
        0's rows up to t - j and to its chain's rows of steps 1..j (at rows t - j + 1 .. t). Rows
        t < j have no real start; leave them out of the loss."""
        cfg = self.cfg
        n = embeds.shape[1]
        gqa = cfg.num_attention_heads != cfg.num_key_value_heads
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        hidden = feats
        for j in range(steps):
            if j:
                hidden = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            q, k, v, residual = self._qkv(embeds, hidden, positions)
            keys.append(k)
            values.append(v)
            if j == 0:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, enable_gqa=gqa)
            else:
                att = F.scaled_dot_product_attention(
                    q, torch.cat(keys, dim=2), torch.cat(values, dim=2), attn_mask=rollout_mask(n, j, q.device),
                    enable_gqa=gqa,
                )
            outs.append(self._finish(att, residual))
        return outs


def rollout_mask(n: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[n, (step + 1) n]`` bool: what row t of training-time-test step ``step`` sees (see
    :meth:`EagleHead.rollout`): step 0's rows ``<= t - step``, and step i's row ``t - step + i``.

    >>> rollout_mask(3, 1).int().tolist()
    [[0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1]]
    """
    t = torch.arange(n, device=device)
    blocks = [t[None, :] <= (t[:, None] - step)]
    for i in range(1, step + 1):
        blocks.append(t[None, :] == (t[:, None] - step + i))
    return torch.cat(blocks, dim=1)


def _hf_name(name: str) -> str:
    """``q_proj.weight`` -> ``self_attn.q_proj.weight``; ``gate_proj.weight`` -> ``mlp.gate_proj.weight``."""
    part = name.split(".")[0]
    if part in ("q_proj", "k_proj", "v_proj", "o_proj"):
        return "self_attn." + name
    if part in ("gate_proj", "up_proj", "down_proj"):
        return "mlp." + name
    return name
