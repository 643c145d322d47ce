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

A head folder holds ``eagle_head.safetensors`` (fp32 or bf16 tensors, plus ``draft_tokens``)
and ``draftwise_head.json`` (shape, the target's fingerprint, how it was trained).

>>> cfg = HeadConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
...                  intermediate_size=16, rms_norm_eps=1e-5, rope_theta=10000.0)
>>> head = EagleHead(cfg)
>>> x = head(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), torch.arange(3)[None])
>>> tuple(x.shape)
(1, 3, 8)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

HEAD_FORMAT = "draftwise-eagle-head-1"
HEAD_WEIGHTS = "eagle_head.safetensors"
HEAD_META = "draftwise_head.json"


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

    @classmethod
    def from_target(cls, config: Any, *, feature_norm: bool = False) -> HeadConfig:
        """The shape of one decoder layer of the target (a transformers config)."""
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            intermediate_size=int(config.intermediate_size),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(config)),
            feature_norm=feature_norm,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        try:
            return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data or f.name != "feature_norm"})
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"the head's config lacks or mistypes a field ({exc})") from None


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
    """The head's own KV cache for one sequence: exact, free rollback (a length)."""

    def __init__(self, cfg: HeadConfig, max_context: int, dtype: torch.dtype = torch.float32) -> None:
        shape = (1, cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)
        self.length = 0
        self.max_context = max_context

    def rollback(self, length: int) -> None:
        self.length = max(0, min(length, self.length))


class EagleHead(nn.Module):
    """fc + one decoder layer. ``forward`` takes embeddings and features ``[B, n, d]`` (and
    positions ``[B, n]``) and returns the predicted next features ``[B, n, d]`` (pre-norm).

    Without a cache the rows attend causally to each other (training). With a
    :class:`HeadCache` (B = 1) the rows are appended at ``cache.length`` and attend to the
    cache and causally to each other (drafting), or as ``attn_mask`` (``[n, length + n]``
    bool) says: a tree's rows see the real rows and their own ancestors only."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.feature_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps) if cfg.feature_norm else None
        self.input_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, d, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def init_from_layer(self, layer_weights: dict[str, torch.Tensor]) -> None:
        """Start the decoder layer from one of the target's (``self_attn.q_proj.weight``, ...
        names as in a transformers state dict, without the ``model.layers.i.`` prefix)."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name == "fc.weight" or name.startswith("feature_norm"):
                    continue
                source = name if "layernorm" in name else _hf_name(name)
                if source in layer_weights:
                    param.copy_(layer_weights[source].to(param.dtype))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq  # [B, n, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, n, hd]
        return emb.cos(), emb.sin()

    def forward(
        self,
        embeds: torch.Tensor,
        feats: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadCache | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cfg = self.cfg
        B, n, _ = embeds.shape
        H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if self.feature_norm is not None:
            feats = self.feature_norm(feats)
        x = self.fc(torch.cat([embeds, feats], dim=-1))  # [B, n, d]
        h = self.input_layernorm(x)
        cos, sin = self._rope(positions)
        q = rotate(self.q_proj(h).view(B, n, H, hd).transpose(1, 2), cos, sin)  # [B, H, n, hd]
        k = rotate(self.k_proj(h).view(B, n, KV, hd).transpose(1, 2), cos, sin)  # [B, KV, n, hd]
        v = self.v_proj(h).view(B, n, KV, hd).transpose(1, 2)
        if cache is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, enable_gqa=H != KV)
        else:
            start, end = cache.length, cache.length + n
            if end > cache.max_context:
                raise ConfigError(f"the draft head's cache holds {cache.max_context} positions; {end} asked")
            cache.k[:, :, start:end] = k
            cache.v[:, :, start:end] = v
            cache.length = end
            mask = attn_mask  # [n, end] bool: a tree's rows see the cache and their ancestors
            if mask is None and n > 1:
                pos = torch.arange(end)
                mask = pos[None, :] <= pos[start:, None]  # [n, end]
            att = F.scaled_dot_product_attention(
                q, cache.k[:, :, :end], cache.v[:, :, :end], attn_mask=mask, enable_gqa=H != KV
            )
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, n, H * hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def _hf_name(name: str) -> str:
    """``q_proj.weight`` -> ``self_attn.q_proj.weight``; ``gate_proj.weight`` -> ``mlp.gate_proj.weight``."""
    part = name.split(".")[0]
    if part in ("q_proj", "k_proj", "v_proj", "o_proj"):
        return "self_attn." + name
    if part in ("gate_proj", "up_proj", "down_proj"):
        return "mlp." + name
    return name


def target_fingerprint(tokenizer: Any, hidden_size: int, vocab_size: int) -> str:
    """A short hash of what a head depends on: the tokenizer's id -> string map, the hidden
    size and the head width. A head trained for another target has another fingerprint."""
    h = hashlib.sha256()
    for piece, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{piece}\n".encode("utf-8", "surrogatepass"))
    h.update(f"hidden={hidden_size};vocab={vocab_size}".encode())
    return h.hexdigest()[:16]


@dataclass
class LoadedHead:
    head: EagleHead
    draft_tokens: torch.Tensor | None  # [V'] the target's head rows the head scores; None: all
    meta: dict[str, Any]


def save_head(
    folder: str | Path,
    head: EagleHead,
    *,
    draft_tokens: Sequence[int] | torch.Tensor | None,
    target: dict[str, Any],
    extra: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write ``folder/eagle_head.safetensors`` and ``folder/draftwise_head.json``. ``target``
    holds at least ``fingerprint``, ``hidden_size`` and ``vocab_size`` (and the model's name)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    if draft_tokens is not None:
        tensors["draft_tokens"] = torch.as_tensor(draft_tokens, dtype=torch.long).contiguous()
    save_file(tensors, str(folder / HEAD_WEIGHTS))
    meta = {"format": HEAD_FORMAT, "config": asdict(head.cfg), "target": dict(target), **(extra or {})}
    meta["draft_vocab_size"] = int(len(draft_tokens)) if draft_tokens is not None else int(target["vocab_size"])
    (folder / HEAD_META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return folder


def load_head(folder: str | Path, *, fingerprint: str | None = None) -> LoadedHead:
    """Read a head folder, refusing (one line each) a missing or damaged file and a head made
    for another target (``fingerprint``: the target's, from :func:`target_fingerprint`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, weights_path = folder / HEAD_META, folder / HEAD_WEIGHTS
    if not folder.is_dir():
        raise ConfigError(f"no draft head at {folder}: expected a folder with {HEAD_META} and {HEAD_WEIGHTS}")
    for path in (meta_path, weights_path):
        if not path.is_file():
            raise ConfigError(f"the draft head {folder} lacks {path.name}; train one with `draftwise train-head`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != HEAD_FORMAT:
            raise ValueError(f"format is not {HEAD_FORMAT}")
        cfg = HeadConfig.from_dict(meta["config"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the draft head's {meta_path.name} is damaged ({exc})") from None
    theirs = (meta.get("target") or {}).get("fingerprint")
    if fingerprint is not None and theirs != fingerprint:
        name = (meta.get("target") or {}).get("name", "another model")
        raise ConfigError(
            f"the draft head in {folder} was trained for {name} (fingerprint {theirs}), not this target "
            f"({fingerprint}): its tokenizer or hidden size differ; train one with `draftwise train-head`"
        )
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"the draft head's {weights_path.name} is damaged ({str(exc)[:120]})") from None
    draft_tokens = tensors.pop("draft_tokens", None)
    head = EagleHead(cfg)
    try:
        head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"the draft head's weights do not fit its config ({str(exc).splitlines()[0][:160]})") from None
    head.eval().requires_grad_(False)
    if draft_tokens is not None:
        vocab = int((meta.get("target") or {}).get("vocab_size", 0)) or math.inf
        if draft_tokens.ndim != 1 or int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= vocab:
            raise ConfigError("the draft head's draft_tokens are not token ids of its target")
    return LoadedHead(head, draft_tokens, meta)
