"""The 4-bit blocks of a GGUF file, read as they are (no de-quantization).

A Q4_1 block holds 32 weights in 20 bytes: ``d`` and ``m`` (float16), then 16 bytes of nibbles,
the low nibble of byte j being weight j and the high nibble weight j + 16; ``w = d * q + m``.
Q4_0 (18 bytes) has no ``m``: ``w = d * (q - 8)``, i.e. ``m = -8 d``.

llama.cpp's converter permutes the rows of the query and key projections of ``llama``-architecture
files (its rotary layout differs from Hugging Face's); :func:`read_q4_blocks` undoes it exactly as
``transformers`` does when it de-quantizes, so the rows line up with the converted folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.errors import ModelLoadError
from draftwise.runtime.quant import GROUP, Q4Weight, quantize_q4

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")


def _unpack(raw: np.ndarray, kind: str) -> Q4Weight:
    rows = raw.shape[0]
    size = 20 if kind == "Q4_1" else 18
    blocks = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)).view(rows, -1, size)  # uint8
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    if kind == "Q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
        nibbles = blocks[..., 4:]
    else:
        m = -8.0 * d
        nibbles = blocks[..., 2:]
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # [rows, groups, 32]
    return Q4Weight(q.reshape(rows, -1).contiguous(), d, m)


def _unpermute(w: Q4Weight, n_head: int) -> Q4Weight:
    rows = w.shape[0]
    index = torch.arange(rows).view(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(rows)
    return w.rows(index)


def read_q4_blocks(path: str | Path, config: Any) -> dict[str, Q4Weight]:
    """The Q4_0/Q4_1 decoder-layer weights of the GGUF file at ``path``, under their Hugging
    Face names (``model.layers.{i}.self_attn.q_proj.weight``, ...). Tensors stored another way
    (F32 norms, a Q8_0 embedding, K-quants) are not returned."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf comes with transformers' GGUF support
        raise ModelLoadError("reading GGUF blocks needs the gguf package: pip install gguf") from exc
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"could not read GGUF file {path}: {exc}") from exc
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
    n_head = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_head)
    out: dict[str, Q4Weight] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        match = _BLOCK.match(t.name)
        if kind not in ("Q4_0", "Q4_1") or not match or match.group(2) not in _LAYER_NAMES:
            continue
        w = _unpack(np.asarray(t.data), kind)
        if arch == "llama" and match.group(2) in ("attn_q", "attn_k"):
            w = _unpermute(w, n_head if match.group(2) == "attn_q" else n_kv)
        out[f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"] = w
    return out


def save_q4(weights: dict[str, Q4Weight], sources: dict[str, str], path: Path) -> None:
    """Write ``weights`` (and where each came from) as one safetensors file, nibbles packed
    two per byte, atomically."""
    from safetensors.torch import save_file

    from draftwise.fsutil import atomic_path

    flat: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        flat[name + ".q"] = (w.q[:, 0::2] | (w.q[:, 1::2] << 4)).contiguous()
        flat[name + ".d"], flat[name + ".m"] = w.d.contiguous(), w.m.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(flat, str(tmp), metadata={"sources": json.dumps(sources)})


def load_q4(path: Path) -> tuple[dict[str, Q4Weight], dict[str, str]]:
    """What :func:`save_q4` wrote (a ModelLoadError names the file if it is unreadable)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), "pt") as f:
            sources = json.loads((f.metadata() or {})["sources"])
        flat = load_file(str(path))
        out: dict[str, Q4Weight] = {}
        for key in flat:
            if key.endswith(".q"):
                name, packed = key[:-2], flat[key]
                q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).view(packed.shape[0], -1)
                out[name] = Q4Weight(q.contiguous(), flat[name + ".d"], flat[name + ".m"])
        return out, sources
    except Exception as exc:
        raise ModelLoadError(f"the cached 4-bit weights {path} are unreadable ({exc}); delete the file") from exc


_LAYER_WEIGHT = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def q4_weights(
    state: dict[str, torch.Tensor], config: Any, gguf: str | Path | None = None
) -> tuple[dict[str, Q4Weight], dict[str, str]]:
    """4-bit weights for every decoder-layer matmul: the GGUF file's own Q4_0/Q4_1 blocks where
    it has them ("file"), else quantized at load from ``state`` ("quantized"). Weights whose K is
    not a multiple of 32 are left out: the runtime keeps them dense."""
    blocks = read_q4_blocks(gguf, config) if gguf is not None else {}
    sources = dict.fromkeys(blocks, "file")
    for name, tensor in state.items():
        if name not in blocks and _LAYER_WEIGHT.match(name) and tensor.shape[1] % GROUP == 0:
            blocks[name], sources[name] = quantize_q4(tensor), "quantized"
    return blocks, sources
