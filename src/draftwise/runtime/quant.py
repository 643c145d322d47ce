"""Weight formats of the native runtime: packed float32, packed bfloat16, int8 and 4-bit.

Every class here is a callable ``y = x W^T + b`` on a 2-D ``x`` (``[n, K]`` -> ``[n, N]``), so
the decoder in :mod:`draftwise.runtime.native` does not know which one it runs.

- :class:`Linear`: float32 and bfloat16 weights re-laid out for oneDNN once at load
  (``F.linear`` packs again on every call), which lets a pass over 1-16 rows cost little more
  than one row; MKL's packed float32 format where oneDNN cannot take the weight.
- :class:`Int8Linear`: per-output-channel symmetric int8 (``torch._weight_int8pack_mm``).
- :class:`Int4Linear`: 4-bit weights in groups of 32 along K, ``w = d * q + m`` with
  ``q`` in 0..15 and one ``(d, m)`` per group: exactly GGUF's Q4_1 block (Q4_0 is ``m = -8 d``).
  torch's CPU kernel (``torch._weight_int4pack_mm_for_cpu``) computes ``(q - 8) * scale + zero``,
  so ``scale = d`` and ``zero = m + 8 d``. Its fast path takes bfloat16 activations and
  bfloat16 scales: ``d`` and ``m`` are rounded to bfloat16 (8 significant bits, where the file's
  float16 has 11), and the activations entering the matmul are rounded to bfloat16. The
  integers ``q`` are the file's own. The result returns in the caller's dtype.

Both quantized kernels are CPU kernels; the runtime refuses ``quant`` on other devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from draftwise.errors import ConfigError

QuantName = Literal["none", "q4", "int8"]
QUANTS: tuple[str, ...] = ("none", "q4", "int8")
GROUP = 32  # weights per 4-bit group (GGUF's QK4_0 / QK4_1)
PACK_BATCH = 16  # the batch MKL/oneDNN pack for; passes of 1-16 tokens all use the packed layout


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def parse_quant(name: str) -> str:
    """``name`` checked against :data:`QUANTS` (one clear line otherwise)."""
    if name not in QUANTS:
        raise ConfigError(f"quant {name!r} is not one of {', '.join(QUANTS)}")
    return name


def _check(packed_fn, reference_fn) -> bool:  # type: ignore[no-untyped-def]
    try:
        got, want = packed_fn().float(), reference_fn().float()
        # bfloat16 activations: about 3 significant digits, so compare against the output's scale
        return bool((got - want).abs().max() <= 0.02 * want.abs().max())
    except (RuntimeError, AttributeError, TypeError):
        return False


_WORKS: dict[str, bool] = {}


def kernel_works(kind: str) -> bool:
    """Whether this torch build runs ``kind`` (mkldnn_fp32, mkl, mkldnn_bf16, int8, int4),
    checked once on a small random matrix against ``F.linear``."""
    if kind in _WORKS:
        return _WORKS[kind]
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(64, 64, generator=gen), torch.randn(3, 64, generator=gen)
    ok = False
    if kind == "mkl":
        mkl = getattr(torch.ops, "mkl", None)
        if torch.backends.mkl.is_available() and hasattr(mkl, "_mkl_reorder_linear_weight"):
            ok = _check(
                lambda: torch.ops.mkl._mkl_linear(x, torch.ops.mkl._mkl_reorder_linear_weight(w, 3), w, None, 3),
                lambda: F.linear(x, w),
            )
    elif kind in ("mkldnn_fp32", "mkldnn_bf16"):
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            dt = torch.float32 if kind == "mkldnn_fp32" else torch.bfloat16
            wd, xd = w.to(dt), x.to(dt)
            ok = _check(
                lambda: torch.ops.mkldnn._linear_pointwise(
                    xd, torch.ops.mkldnn._reorder_linear_weight(wd, 3), None, "none", [], ""
                ).float(),
                lambda: F.linear(xd.float(), wd.float()),
            )
    elif kind == "int8":
        ok = _check(lambda: Int8Linear(w)(x), lambda: F.linear(x, w))
    elif kind == "int4":
        q4 = quantize_q4(w)
        ok = _check(lambda: Int4Linear(q4)(x), lambda: F.linear(x, q4.dequantize()))
    else:
        raise ValueError(kind)
    _WORKS[kind] = ok
    return ok


class Linear:
    """``y = x W^T + b``, with the weight pre-packed where this CPU and dtype allow.

    ``F.linear`` packs the weight again on every call, which is cheap next to one token's
    matrix-vector product but makes a pass over 4 tokens cost about twice a pass over 1 (and 8
    tokens three times): exactly the verification pass speculative decoding needs to be cheap.
    The weight is pre-packed once at load for oneDNN (float32 and bfloat16), else for MKL
    (float32). The packed copy takes 2-3x the weight's memory.

    oneDNN comes first for float32 for two measured reasons:

    - speed on AMD CPUs: MKL's small-batch path there is slow, so a pass over a few tokens
      costs far more than one token's with MKL and little more with oneDNN, and a pass over
      a few tokens is what verification runs (docs/benchmarks.md, "What a wide pass costs:
      float32 kernels");
    - batch invariance: with oneDNN a row's result is bit-identical whatever the number of
      rows beside it, once the few row counts where its kernel changes order are run padded or
      in blocks (:func:`_row_behaviour`; ``tests/test_quant.py`` checks it); MKL's packed kernel
      changes its summation order with more rows (seen at 4, 16 and 17). (The whole pass still differs
      from one-token passes in the last bits: torch's attention kernel is not invariant to the
      number of queries. Greedy equality with plain decoding stays a measured property, tested
      on the real models.)
    """

    __slots__ = ("weight", "bias", "packed", "kind", "pad_one", "max_rows")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pack: bool = True) -> None:
        self.weight, self.bias = weight, bias
        self.packed: torch.Tensor | None = None
        self.kind = "dense"
        self.pad_one = False  # run one row as two: see _row_behaviour
        self.max_rows: int | None = None  # run more rows in blocks of this many: see _row_behaviour
        if not pack or weight.device.type != "cpu":
            return
        if weight.dtype == torch.float32 and kernel_works("mkldnn_fp32"):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH)
            self.kind = "mkldnn"
        elif weight.dtype == torch.float32 and kernel_works("mkl"):
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_BATCH)
            self.kind = "mkl"
        elif weight.dtype == torch.bfloat16 and kernel_works("mkldnn_bf16"):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH)
            self.kind = "mkldnn"
        if self.kind != "dense":
            self.pad_one, self.max_rows = _row_behaviour(self, weight)

    @property
    def nbytes(self) -> int:
        """Bytes of weight (and bias) one call reads."""
        return _nbytes(self.weight) + _nbytes(self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.max_rows is not None and x.shape[0] > self.max_rows:
            return torch.cat([self._rows(x[i : i + self.max_rows]) for i in range(0, x.shape[0], self.max_rows)])
        return self._rows(x)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad_one and x.shape[0] == 1:
            return self._run(x.expand(2, -1))[:1]
        return self._run(x)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.kind == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, x.shape[0])
        return F.linear(x, self.weight, self.bias)


# Row counts a packed kernel is tried at: powers of two, where kernels change their blocking,
# and one more than each, the first count of the next block
_PROBE_ROWS = (3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65)
_ROW_BEHAVIOUR: dict[tuple[object, ...], tuple[bool, int | None]] = {}


def _row_behaviour(linear: Linear, weight: torch.Tensor) -> tuple[bool, int | None]:
    """``(pad_one, max_rows)``: how ``linear`` must be called for a row's result not to depend
    on the rows beside it (DESIGN.md section 11).

    A packed kernel may reduce over K in one order for some row counts and in another for
    others: oneDNN's one-row path may reduce over K > 1024 in another order than its path for
    2 or more rows, and a bfloat16 kernel on AMX may agree up to some row count and switch to
    another order above it (docs/runtime.md, "Row invariance", lists what each machine showed).
    The behaviour depends on the CPU and cannot be known in advance, so each kernel is tried
    once per weight shape, dtype and thread count, on random rows, against the same rows run
    two at a time:

    - ``pad_one``: one row alone differs, so a one-row call runs as two identical rows (about
      10% more for that matmul). K > 1024 always pads: in bfloat16 the output's rounding
      hides most order differences from a random check (the default model's down projections
      differed on real activations and passed it).
    - ``max_rows``: the first row count found to differ is above some power of two; calls of
      more rows than that power run in blocks of it (``None``: no count up to 65 differs).
      Blocks cost time where the kernel for more rows is faster (AMX in bfloat16, for one);
      the runtime pays it rather than let a row's tokens depend
      on the batch it shares."""
    key = (linear.kind, weight.dtype, tuple(weight.shape), linear.bias is None, torch.get_num_threads())
    if key in _ROW_BEHAVIOUR:
        return _ROW_BEHAVIOUR[key]
    gen = torch.Generator().manual_seed(0)
    n = _PROBE_ROWS[-1] + 1
    x = torch.randn(n, weight.shape[1], generator=gen).to(weight.dtype)
    with torch.inference_mode():
        pairs = torch.cat([linear._run(x[i : i + 2]) for i in range(0, n, 2)])
        # every row: in bfloat16 the output's rounding hides most order differences, so few rows show one
        pad_one = weight.shape[1] > 1024 or not all(
            torch.equal(linear._run(x[i : i + 1]), pairs[i : i + 1]) for i in range(32)
        )
        max_rows = None
        for m in _PROBE_ROWS:
            if not torch.equal(linear._run(x[:m]), pairs[:m]):
                max_rows = 1 << ((m - 1).bit_length() - 1)  # the largest power of two below m
                break
    _ROW_BEHAVIOUR[key] = (pad_one, max_rows)
    return pad_one, max_rows


class Int8Linear:
    """Per-output-channel symmetric int8: ``w = s * q``, ``q`` in -127..127 (weight-only;
    activations enter the kernel in bfloat16, its fast path on this CPU)."""

    __slots__ = ("q", "scale", "bias")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [N]
        self.q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.bfloat16()
        self.bias = bias

    @property
    def nbytes(self) -> int:
        return _nbytes(self.q) + _nbytes(self.scale) + _nbytes(self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale).to(x.dtype)
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class Q4Weight:
    """A ``[N, K]`` weight in 4-bit groups of 32 along K: ``w[n, g*32 + j] = d[n, g] * q[n, g*32 + j] + m[n, g]``."""

    q: torch.Tensor  # uint8 [N, K], values 0..15
    d: torch.Tensor  # float32 [N, K // 32]
    m: torch.Tensor  # float32 [N, K // 32]

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        groups = self.q.view(n, k // GROUP, GROUP).float()
        return (groups * self.d[..., None] + self.m[..., None]).view(n, k)

    def rows(self, index: torch.Tensor) -> Q4Weight:
        return Q4Weight(self.q[index], self.d[index], self.m[index])

    @staticmethod
    def cat(parts: list[Q4Weight]) -> Q4Weight:
        return Q4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d", "m")))


def quantize_q4(weight: torch.Tensor) -> Q4Weight:
    """Round-to-nearest asymmetric 4-bit quantization with groups of 32 (as GGUF's Q4_1)."""
    n, k = weight.shape
    if k % GROUP:
        raise ConfigError(f"4-bit groups need K divisible by {GROUP}; this weight has K={k}")
    g = weight.float().view(n, k // GROUP, GROUP)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    d = ((hi - lo) / 15.0).half().float()  # stored as float16, as Q4_1 stores them
    m = lo.half().float()
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.round((g - m[..., None]) / safe[..., None]).clamp_(0, 15).to(torch.uint8)
    return Q4Weight(q.view(n, k).contiguous(), d, m)


class Int4Linear:
    """4-bit group-wise weights on torch's CPU int4 kernel (see the module docstring)."""

    __slots__ = ("packed", "scales_zeros", "bias", "n_out")

    def __init__(self, weight: Q4Weight, bias: torch.Tensor | None = None) -> None:
        n, k = weight.shape
        if k % GROUP or n % 2:
            raise ConfigError(f"the int4 kernel cannot take a [{n}, {k}] weight")
        self.packed = torch._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
        zero = weight.m + 8.0 * weight.d
        self.scales_zeros = torch.stack([weight.d.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.bias = bias
        self.n_out = n

    @property
    def nbytes(self) -> int:
        return _nbytes(self.packed) + _nbytes(self.scales_zeros) + _nbytes(self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias
