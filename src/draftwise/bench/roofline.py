"""The memory-bandwidth roofline of plain decoding: how fast it could go if each token cost only
reading every weight once.

- bytes per token (:func:`weight_bytes_per_token`): every weight tensor a single-token forward
  reads (all layer weights and biases, the final norm, the head; a tied head is the embedding
  matrix, counted once), plus the one embedding row the lookup reads. The KV cache is reported
  apart (:func:`kv_bytes_per_token`: it grows with the context; at short lengths it is a few
  percent).
- copy bandwidth (:func:`measure_bandwidth`): ``dst.copy_(src)`` over a buffer, counting read +
  write bytes (2 x the buffer per copy); read bandwidth: ``src.sum()`` over the same buffer,
  counting the bytes read. Medians of several repeats, with torch's current thread count.
- roofline tokens/s = bandwidth / bytes per token.

>>> import torch
>>> _nbytes(torch.zeros(3, 4, dtype=torch.bfloat16)), _nbytes(None)
(24, 0)
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from typing import Any

import torch

from draftwise.cost.profile import cpu_flags, cpu_model

MIB = 1 << 20


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def weight_bytes_per_token(runtime: Any) -> dict[str, int]:
    """Bytes of weights a :class:`~draftwise.runtime.native.NativeRuntime` reads per decoded token.

    Every layer tensor (fused q/k/v with its bias, o, fused gate/up, down, both norms), the
    final norm and the head; a tied head (the embedding matrix) is counted once, as the head;
    the embedding lookup reads one row. Sizes are those of the runtime's own tensors, so the
    dtype and weight format (``quant``) it was loaded in are the ones counted: a 4-bit matmul
    counts its packed nibbles and its scales.
    """
    layers = 0
    for i in range(runtime.num_layers):
        layers += sum(m.nbytes for m in runtime.matmuls(i))
        layers += _nbytes(runtime.ln_attn[i]) + _nbytes(runtime.ln_mlp[i])
    embed_row = runtime.embed.shape[1] * runtime.embed.element_size()
    out = {
        "layers": layers,
        "final_norm": _nbytes(runtime.final_norm),
        "head": runtime.head_matmul.nbytes,
        "embedding_row": embed_row,
        "tied_head": int(runtime.head is runtime.embed),
    }
    out["total"] = out["layers"] + out["final_norm"] + out["head"] + out["embedding_row"]
    return out


def kv_bytes_per_token(runtime: Any, context: int) -> int:
    """Bytes of K and V cache one single-token forward reads at a context of ``context``."""
    per_position = 2 * runtime.n_kv * runtime.head_dim * runtime.k_cache[0].element_size()
    return runtime.num_layers * per_position * int(context)


def _seconds(fn: Any, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure_bandwidth(size_bytes: int = 512 * MIB, *, repeats: int = 9, warmup: int = 2) -> dict[str, float]:
    """Memory bandwidth in GB/s (1e9 bytes/s), medians of ``repeats`` timed runs.

    ``copy_gbps``: ``dst.copy_(src)`` counting read + write (2 x ``size_bytes`` per copy);
    ``read_gbps``: ``src.sum()`` counting the ``size_bytes`` read. ``*_best_gbps``: the
    fastest repeat (the least disturbed, on a shared machine).
    """
    n = max(1, int(size_bytes) // 4)
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = n * 4
    with torch.inference_mode():
        copy_s = _seconds(lambda: dst.copy_(src), repeats, warmup)
        read_s = _seconds(lambda: src.sum(), repeats, warmup)
    del src, dst
    return {
        "buffer_bytes": float(nbytes),
        "copy_gbps": 2 * nbytes / statistics.median(copy_s) / 1e9,
        "read_gbps": nbytes / statistics.median(read_s) / 1e9,
        "copy_best_gbps": 2 * nbytes / min(copy_s) / 1e9,
        "read_best_gbps": nbytes / min(read_s) / 1e9,
    }


# -- machine ---------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What a reader of a benchmark needs to know about the machine and the libraries."""
    import transformers

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(AttributeError, RuntimeError):
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info
