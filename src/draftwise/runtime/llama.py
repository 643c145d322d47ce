"""What the native runtime reads from a Llama-family checkpoint: which configs it covers, the
rotary tables and the safetensors weights (kept apart from :mod:`.native`, the decoder itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.errors import ModelLoadError, UnsupportedArchitectureError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
DEFAULT_MAX_CONTEXT = 8192


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


def rope_tables(config: Any, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[positions, head_dim]`` in float32: transformers' angles (the same float32
    ``position * inv_freq``), their cos and sin from float64 rounded once to float32 (transformers takes
    torch's float32 ``cos``, within an ulp of these where it is accurate)."""
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
    emb = torch.cat((freqs, freqs), dim=-1).double().numpy()  # [positions, head_dim], float32 angles
    # cos and sin in numpy's float64, rounded once to float32, not torch's float32 cos: on a 2-core
    # Xeon, 1 process in about 8 got one OpenMP thread's half of torch's table from a routine
    # accurate only to 1.5e-4 (every other process: 4e-8), so that process's logits differed from
    # every other's (the float32 cache on/off mismatch of issue 72 had this shape). numpy's do not
    # depend on the thread.
    cos = torch.from_numpy(np.cos(emb)).float()
    sin = torch.from_numpy(np.sin(emb)).float()
    return cos * scale, sin * scale


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x cos + rotate_half(x) sin`` in three kernels: ``rotate_half(x)`` is
    ``roll(x, half) * [-1]*half + [1]*half``, and the sign is folded into ``sin_signed``."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin_signed)


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
