"""The compiled attention kernel (runtime/kernels): it computes what the torch path computes (to
the last bits), every row alike whatever shares its pass, and the runtime falls back to the torch
path where it cannot be built. Bit-level invariance on whole models: tests/test_row_invariance.py."""

from __future__ import annotations

import random

import pytest
import torch

from draftwise.errors import ConfigError
from draftwise.runtime import kernels
from draftwise.runtime.base import Rows
from draftwise.runtime.batch_plan import attend_groups, make_plan
from draftwise.runtime.native import NativeRuntime

from .conftest import tiny_llama_config

needs_kernel = pytest.mark.skipif(kernels.library() is None, reason=f"no attention kernel here: {kernels.why_not()}")


def ragged_pass(seed: int, slots: int, ctx: int) -> tuple[list[Rows], list[int]]:
    """Sequences of a pass as the engine mixes them: single steps, chains, trees and prompt chunks."""
    rng = random.Random(seed)
    lengths = [rng.randrange(0, ctx - 80) for _ in range(slots)]
    passes = []
    for s in rng.sample(range(slots), rng.randrange(1, slots + 1)):
        n = rng.choice([1, 1, 5, 9, 64])
        tree = [-1] + [rng.randrange(j) for j in range(1, n)] if 2 < n < 64 and rng.random() < 0.5 else None
        passes.append(Rows(s, list(range(n)), tree))
    return passes, lengths


def attention(passes: list[Rows], lengths: list[int], k: torch.Tensor, v: torch.Tensor, q: torch.Tensor,
              compiled: bool) -> torch.Tensor:
    slots, kv, ctx, hd = k.shape
    plan = make_plan(passes, lengths, ctx, kv_heads=kv, group=q.shape[1] // kv, head_dim=hd,
                     device=torch.device("cpu"), compiled=compiled)
    return attend_groups(plan, q, k, v, hd ** -0.5, torch.float32)


@needs_kernel
@pytest.mark.parametrize("hd", kernels.HEAD_DIMS)
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_what_the_torch_path_does(hd: int, cache: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(hd)
    slots, kv, group, ctx = 6, 2, 3, 512
    k = torch.randn(slots, kv, ctx, hd, generator=gen).to(cache)
    v = torch.randn(slots, kv, ctx, hd, generator=gen).to(cache)
    for seed in range(4):
        passes, lengths = ragged_pass(seed, slots, ctx)
        q = torch.randn(sum(len(p.ids) for p in passes), kv * group, hd, generator=gen)
        got = attention(passes, lengths, k, v, q, compiled=True)
        want = attention(passes, lengths, k, v, q, compiled=False)
        assert (got - want).abs().max().item() < 2e-5


@needs_kernel
def test_each_row_is_the_same_alone_as_in_its_pass() -> None:
    gen = torch.Generator().manual_seed(1)
    slots, kv, group, hd, ctx = 8, 2, 4, 32, 768
    k, v = torch.randn(slots, kv, ctx, hd, generator=gen), torch.randn(slots, kv, ctx, hd, generator=gen)
    for seed in range(5):
        passes, lengths = ragged_pass(10 + seed, slots, ctx)
        q = torch.randn(sum(len(p.ids) for p in passes), kv * group, hd, generator=gen)
        together = attention(passes, lengths, k, v, q, compiled=True)
        row = 0
        for p in passes:
            n = len(p.ids)
            alone = attention([p], lengths, k, v, q[row : row + n], compiled=True)
            assert torch.equal(alone, together[row : row + n]), (seed, p.slot)
            row += n


F32 = torch.float32


def _tree16(x: torch.Tensor) -> torch.Tensor:
    """attention.c's sum of 16 lanes (the last axis): lane l + 8, then l + 4, l + 2, l + 1."""
    for half in (8, 4, 2, 1):
        x = x[..., :half] + x[..., half : 2 * half]
    return x[..., 0]


def _exp(x: torch.Tensor) -> torch.Tensor:
    """attention.c's exp for x <= 0, one float32 rounding per operation as written."""
    c = lambda value: torch.tensor(value, dtype=F32)  # noqa: E731
    under = x < c(-87.0)
    x = torch.maximum(x, c(-87.0))
    n = (x * c(1.44269504088896341) + c(12582912.0)) - c(12582912.0)
    r = (x - n * c(0.693359375)) - n * c(-2.12194440e-4)
    p = c(1.9875691500e-4)
    for coeff in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c(coeff)
    p = (p * (r * r) + r) + c(1.0)
    scale = ((n.to(torch.int32) + 127) << 23).view(F32)
    return ((p * scale).view(torch.int32) & ~under.to(torch.int32).neg()).view(F32)


def _row_as_the_header_says(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row over the ``n`` keys it sees, step by step as attention.c's header states."""
    n, hd = keys.shape
    prods = q.view(1, hd // 16, 16) * keys.view(n, hd // 16, 16)  # lane d mod 16, in order over d
    acc = prods[:, 0]
    for c in range(1, hd // 16):
        acc = acc + prods[:, c]
    tiles = -(-n // 16)
    row = torch.full((tiles * 16,), float("-inf"), dtype=F32)
    row[:n] = _tree16(acc) * torch.tensor(scale, dtype=F32)
    e = _exp(row - row.max())
    lanes = torch.zeros(16, dtype=F32)
    for t in range(tiles):  # the denominator: lane j mod 16, tile by tile
        lanes = lanes + e[16 * t : 16 * t + 16]
    out = torch.zeros(hd, dtype=F32)
    for j in range(n):  # the values, key by key from key 0
        out = out + e[j] * values[j]
    return out * (torch.tensor(1.0, dtype=F32) / _tree16(lanes))


@needs_kernel
@pytest.mark.parametrize("hd", [16, 64])
def test_the_kernel_does_the_arithmetic_its_header_states(hd: int) -> None:
    """Bit for bit: the lanes' layout in registers and the blocking of rows are free, the
    arithmetic is not (attention.c holds 16 lanes as two halves, and blocks 4 rows)."""
    gen = torch.Generator().manual_seed(hd)
    kv, group, start, rows = 2, 3, 37, 3
    k = torch.randn(1, kv, 64, hd, generator=gen)
    v = torch.randn(1, kv, 64, hd, generator=gen)
    q = torch.randn(rows, kv * group, hd, generator=gen)
    seq = torch.tensor([[0, start, rows, 0, -1]], dtype=torch.int64)
    scale = hd ** -0.5
    got = kernels.attend(q, k, v, seq, torch.zeros(1, dtype=torch.uint8), scale, 2).view(rows, kv * group, hd)
    for j in range(rows):  # row j sees keys 0 .. start + j
        for head in range(kv * group):
            n, h = start + j + 1, head // group
            want = _row_as_the_header_says(q[j, head], k[0, h, :n], v[0, h, :n], scale)
            assert torch.equal(got[j, head], want), (j, head, (got[j, head] - want).abs().max().item())


def test_without_the_kernel_the_runtime_takes_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """DRAFTWISE_KERNELS=off gives, bit for bit, the logits of the torch path chosen by hand on a
    runtime that was offered the kernel (and they are the model's: transformers' to 1e-4)."""
    from .conftest import random_hf_model

    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("DRAFTWISE_KERNELS", "off")
    assert kernels.library() is None and kernels.why_not() == "DRAFTWISE_KERNELS=off"
    config = tiny_llama_config()
    hf = random_hf_model(config, seed=0)
    state = {k: t.detach().clone() for k, t in hf.state_dict().items()}
    ids = [1, 7, 3, 42, 5, 88, 13, 21, 9]
    rt = NativeRuntime(config, state)
    assert not rt.kernel_attention
    off = rt.prefill(ids)

    monkeypatch.delenv("DRAFTWISE_KERNELS")
    kernels._state.clear()  # this test's own dict: decided again, the kernel where it builds
    by_hand = NativeRuntime(config, state)
    by_hand.kernel_attention = False
    assert torch.equal(off, by_hand.prefill(ids))
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1].float()
    assert (off - want).abs().max().item() <= 1e-4


def test_an_uncovered_head_size_takes_the_torch_path() -> None:
    assert not kernels.available(24)
    assert not kernels.available(64, torch.float16)  # a cache it cannot read


@needs_kernel
def test_attend_refuses_what_it_cannot_read() -> None:
    from draftwise.errors import ConfigError

    seq = torch.tensor([[0, 3, 1, 0, -1]], dtype=torch.int64)
    trees = torch.zeros(1, dtype=torch.uint8)
    q, cache = torch.zeros(1, 2, 64), torch.zeros(1, 1, 16, 64)
    with pytest.raises(ConfigError, match="float32 or bfloat16 cache"):
        kernels.attend(q, cache.half(), cache.half(), seq, trees, 1.0, 1)
    with pytest.raises(ConfigError, match="one layout"):
        kernels.attend(q, cache, torch.zeros(1, 16, 1, 64).transpose(1, 2), seq, trees, 1.0, 1)
    with pytest.raises(ConfigError, match="does not cover heads of 24"):
        kernels.attend(torch.zeros(1, 2, 24), torch.zeros(1, 1, 16, 24), torch.zeros(1, 1, 16, 24), seq, trees, 1.0, 1)
    assert torch.isfinite(kernels.attend(q, cache, cache, seq, trees, 1.0, 1)).all()


def test_a_failed_build_says_why_and_warns(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.delenv("DRAFTWISE_KERNELS", raising=False)
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(kernels, "_compiler", lambda: "false")  # a "compiler" that always fails
    with pytest.warns(RuntimeWarning, match="slower torch path"):
        assert kernels.library() is None
    assert kernels.why_not() is not None


@needs_kernel
def test_the_kernel_writes_bfloat16_as_to_would() -> None:
    """``out_dtype=torch.bfloat16`` rounds in the kernel, to the bits ``.to(torch.bfloat16)`` gives
    the float32 output (the runtime's bfloat16 layers take it without a conversion)."""
    gen = torch.Generator().manual_seed(4)
    slots, kv, group, hd, ctx = 4, 2, 3, 64, 256
    k = torch.randn(slots, kv, ctx, hd, generator=gen).to(torch.bfloat16)
    v = torch.randn(slots, kv, ctx, hd, generator=gen).to(torch.bfloat16)
    passes, lengths = ragged_pass(2, slots, ctx)
    plan = make_plan(passes, lengths, ctx, kv_heads=kv, group=group, head_dim=hd, device=torch.device("cpu"),
                     compiled=True)
    assert plan.seq is not None and plan.trees is not None
    q = torch.randn(sum(len(p.ids) for p in passes), kv * group, hd, generator=gen)
    f32 = kernels.attend(q, k, v, plan.seq, plan.trees, 0.125, 2)
    bf16 = kernels.attend(q, k, v, plan.seq, plan.trees, 0.125, 2, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, f32.to(torch.bfloat16))
    with pytest.raises(ConfigError, match="writes float32 or bfloat16"):
        kernels.attend(q, k, v, plan.seq, plan.trees, 0.125, 2, torch.float16)
