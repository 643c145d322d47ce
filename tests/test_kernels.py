"""The compiled attention kernel (runtime/kernels): it computes what the torch path computes (to
the last bits), every row alike whatever shares its pass, and the runtime falls back to the torch
path where it cannot be built. Bit-level invariance on whole models: tests/test_row_invariance.py."""

from __future__ import annotations

import random

import pytest
import torch

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


def test_without_the_kernel_the_runtime_takes_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("DRAFTWISE_KERNELS", "off")
    assert kernels.library() is None and kernels.why_not() == "DRAFTWISE_KERNELS=off"
    config = tiny_llama_config()
    from .conftest import random_hf_model

    state = {k: t.detach().clone() for k, t in random_hf_model(config, seed=0).state_dict().items()}
    rt = NativeRuntime(config, state)
    assert not rt.kernel_attention
    assert torch.isfinite(rt.prefill([1, 2, 3])).all()


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
