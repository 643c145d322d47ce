"""The compiled work between a layer's matmuls (runtime/kernels/layer.c): each function computes
what the torch path computes, to float32's last bits or bfloat16's rounding; each row alike
whatever else its call holds (alone, among many, split over threads); and a model runs them where
attention runs the kernel. Whole-model bit invariance: tests/test_row_invariance.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftwise.runtime import kernels
from draftwise.runtime.llama import rope
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config

needs_kernel = pytest.mark.skipif(kernels.library() is None, reason=f"no kernel here: {kernels.why_not()}")
DTYPES = [torch.float32, torch.bfloat16]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None) -> None:
    """Within a few units in the last place of ``dtype``, relative to the values' size (or to
    ``scale``: the size of the terms of a sum that may cancel)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    ulp = 2.0 ** -23 if dtype == torch.float32 else 2.0 ** -7
    scale = (want.float().abs() if scale is None else scale.float()).clamp_min(1e-3)
    err = ((got.float() - want.float()).abs() / scale).max().item()
    assert err <= 4 * ulp, f"relative error {err} is above 4 ulp of {dtype}"


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [576, 40, 19])  # 16-lane groups, a half group, a tail that is not 8-wide
def test_add_norm_is_the_residual_add_and_rms_norm(dtype: torch.dtype, d: int) -> None:
    gen = torch.Generator().manual_seed(d)
    x, y = torch.randn(5, d, generator=gen).to(dtype), torch.randn(5, d, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    want_x = x + y
    want = F.rms_norm(want_x.float(), (d,), None, 1e-5).to(dtype) * w
    got_x = x.clone()
    got = kernels.add_norm(got_x, y, w, 1e-5, 2)
    assert torch.equal(got_x, want_x)  # one rounding, as torch's add
    assert got is not None
    close(got, want, dtype)
    only_norm = kernels.add_norm(want_x.clone(), None, w, 1e-5, 2)
    assert only_norm is not None and torch.equal(only_norm, got)  # the add and the norm apart: the same bits
    only_add = x.clone()
    assert kernels.add_norm(only_add, y, None, 1e-5, 2) is None and torch.equal(only_add, want_x)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_swiglu(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    gu = (4 * torch.randn(7, 2 * 100, generator=gen)).to(dtype)  # f = 100: a tail after 8-wide steps
    gu[0, :4] = torch.tensor([-100.0, -87.5, 0.0, 100.0])  # exp's edge: exactly 0 below -87
    gate, up = gu.chunk(2, dim=-1)
    want = F.silu(gate) * up
    close(kernels.silu_mul(gu, 2), want, dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_store_rotates_and_writes_each_row_where_it_goes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    H, KV, hd, slots, ctx = 4, 2, 32, 3, 64
    R = 5
    qkv = torch.randn(R, (H + 2 * KV) * hd, generator=gen).to(dtype)
    cos, sin = torch.randn(ctx, hd, generator=gen).to(dtype), torch.randn(ctx, hd, generator=gen).to(dtype)
    positions = torch.tensor([3, 4, 4, 10, 0])  # a tree's two rows at one depth
    slot_of, at = torch.tensor([0, 0, 0, 2, 1]), torch.tensor([3, 4, 5, 10, 0])
    k_cache = torch.zeros(slots, KV, ctx, hd, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    q = kernels.rope_store(qkv, cos, sin, positions, slot_of, at, k_cache, v_cache, H, 2)
    x = qkv[:, : (H + KV) * hd].view(R, H + KV, hd)
    c, s = cos[positions, None, :], sin[positions, None, :]
    qk = rope(x, c, s)
    terms = (x.float() * c.float()).abs() + (torch.roll(x, hd // 2, dims=-1).float() * s.float()).abs()
    close(q, qk[:, :H].float(), dtype, terms[:, :H])
    for r in range(R):
        close(k_cache[slot_of[r], :, at[r]], qk[r, H:], dtype, terms[r, H:])
        assert torch.equal(v_cache[slot_of[r], :, at[r]], qkv[r, (H + KV) * hd :].view(KV, hd))
    written = torch.zeros(slots, ctx, dtype=torch.bool)
    written[slot_of, at] = True
    assert not k_cache.transpose(1, 2)[~written].any() and not v_cache.transpose(1, 2)[~written].any()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_gets_the_same_bits_alone_and_among_many(dtype: torch.dtype) -> None:
    """Many rows take the threaded branch (rows * d above the cut); one row runs alone."""
    gen = torch.Generator().manual_seed(2)
    d, f, rows = 576, 1536, 300
    x, y = torch.randn(rows, d, generator=gen).to(dtype), torch.randn(rows, d, generator=gen).to(dtype)
    w = torch.randn(d, generator=gen).to(dtype)
    gu = torch.randn(rows, 2 * f, generator=gen).to(dtype)
    many_x = x.clone()
    many = kernels.add_norm(many_x, y, w, 1e-6, 2)
    swiglu = kernels.silu_mul(gu, 2)
    assert many is not None
    for r in (0, 137, rows - 1):
        one_x = x[r : r + 1].clone()
        one = kernels.add_norm(one_x, y[r : r + 1], w, 1e-6, 1)
        assert one is not None and torch.equal(one, many[r : r + 1]) and torch.equal(one_x, many_x[r : r + 1])
        assert torch.equal(kernels.silu_mul(gu[r : r + 1], 1), swiglu[r : r + 1])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_runs_the_layer_kernels_and_computes_the_model(dtype: torch.dtype,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Where attention runs the kernel, the work between the matmuls does too (every call
    counted), and the logits are the model's: transformers' to 1e-4 in float32; in bfloat16 as
    close to the torch path's bfloat16 as that is to float32."""
    config = tiny_llama_config()
    hf = random_hf_model(config, seed=0)
    state = {k: t.detach().clone() for k, t in hf.state_dict().items()}
    ids = [1, 7, 3, 42, 5, 88, 13, 21, 9]
    rt = NativeRuntime(config, state, dtype=dtype)
    assert rt.kernel_attention
    calls = dict.fromkeys(("add_norm", "silu_mul", "rope_store"), 0)
    for name in calls:
        monkeypatch.setattr(kernels, name, _counting(getattr(kernels, name), name, calls))
    fused = rt.prefill(ids)
    layers = config.num_hidden_layers
    assert calls == {"add_norm": 2 * layers + 2, "silu_mul": layers, "rope_store": layers}  # + the first and last norm
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1].float()
    if dtype == torch.float32:
        assert (fused - want).abs().max().item() <= 1e-4
    else:
        torch_path = NativeRuntime(config, state, dtype=dtype)
        torch_path.kernel_attention = False
        glue = torch_path.prefill(ids)
        assert (fused - want).abs().max().item() <= 1.5 * (glue - want).abs().max().item() + 1e-3


def _counting(real, name: str, calls: dict[str, int]):  # type: ignore[no-untyped-def]
    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[name] += 1
        return real(*args, **kwargs)

    return counted
