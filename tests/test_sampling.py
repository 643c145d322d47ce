"""Sampling transforms against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from draftwise.errors import ConfigError
from draftwise.core.sampling import SamplingConfig, argmax_ids, logits_to_probs, next_token, sample

# logits whose softmax at temperature 1 is exactly [1, 2, 4] / 7
LOGITS = torch.tensor([0.0, math.log(2), math.log(4)])


def probs(**kw) -> list[float]:
    return logits_to_probs(LOGITS, SamplingConfig(**kw)).tolist()


def test_temperature():
    assert probs(temperature=1.0) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    # T = 0.5 squares the odds: [1, 4, 16] / 21
    assert probs(temperature=0.5) == pytest.approx([1 / 21, 4 / 21, 16 / 21])


def test_top_k():
    assert probs(temperature=1.0, top_k=2) == pytest.approx([0, 1 / 3, 2 / 3])
    assert probs(temperature=1.0, top_k=1) == pytest.approx([0, 0, 1])
    assert probs(temperature=1.0, top_k=3) == pytest.approx([1 / 7, 2 / 7, 4 / 7])


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert probs(temperature=1.0, top_p=0.5) == pytest.approx([0, 0, 1])  # 4/7 >= 0.5
    assert probs(temperature=1.0, top_p=0.6) == pytest.approx([0, 1 / 3, 2 / 3])  # 4/7 < 0.6
    assert probs(temperature=1.0, top_p=0.9) == pytest.approx([1 / 7, 2 / 7, 4 / 7])


def test_top_k_applies_before_top_p():
    # after top-k=2: [0, 1/3, 2/3]; 2/3 >= 0.6, so top-p keeps one token
    assert probs(temperature=1.0, top_k=2, top_p=0.6) == pytest.approx([0, 0, 1])


def test_batched_rows_are_transformed_independently():
    rows = torch.stack([LOGITS, LOGITS.flip(0)])  # [2, 3]
    out = logits_to_probs(rows, SamplingConfig(temperature=1.0, top_k=2))
    assert out[0].tolist() == pytest.approx([0, 1 / 3, 2 / 3])
    assert out[1].tolist() == pytest.approx([2 / 3, 1 / 3, 0])


def test_greedy_is_argmax_with_lowest_id_on_ties():
    assert argmax_ids(torch.tensor([1.0, 3.0, 3.0, 2.0])) == [1]
    assert next_token(LOGITS, SamplingConfig(), torch.Generator()) == 2
    with pytest.raises(ConfigError, match="greedy"):
        logits_to_probs(LOGITS, SamplingConfig(temperature=0))


def test_seeded_sampling_is_reproducible_and_follows_probs():
    cfg = SamplingConfig(temperature=1.0, seed=123)
    p = logits_to_probs(LOGITS, cfg)
    gen_a, gen_b = cfg.generator(), cfg.generator()
    draws_a = [sample(p, gen_a) for _ in range(4000)]
    draws_b = [sample(p, gen_b) for _ in range(4000)]
    assert draws_a == draws_b
    freq = torch.bincount(torch.tensor(draws_a), minlength=3).float() / 4000
    assert (freq - p).abs().max() < 0.03  # ~4 standard errors at n=4000


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_values_name_the_fix(kw, match):
    with pytest.raises(ConfigError, match=match):
        SamplingConfig(**kw)


def test_a_tiny_temperature_gives_the_argmax_limit_not_nan():
    ties = torch.tensor([1.0, 3.0, 3.0, float("-inf")])
    # 1e-30 is divided by; 1e-40 and 5e-324 are below float32's range and use the limit directly
    for t in (1e-30, 1e-40, 5e-324):
        assert probs(temperature=t) == pytest.approx([0, 0, 1])
        assert logits_to_probs(ties, SamplingConfig(temperature=t)).tolist() == pytest.approx([0, 0.5, 0.5, 0])
    cfg = SamplingConfig(temperature=1e-40, seed=0)
    assert next_token(LOGITS, cfg, cfg.generator()) == 2


def test_seeds_cover_torchs_range_and_no_more():
    top = SamplingConfig(temperature=1.0, seed=2**64 - 1)
    assert top.generator().initial_seed() == 2**64 - 1
    for bad in (2**64, -1, True, 1.5):
        with pytest.raises(ConfigError, match=r"seed=.* from 0 to 2\*\*64 - 1"):
            SamplingConfig(seed=bad)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=float("nan")), "temperature=nan must be a number"),
        (dict(temperature=float("inf")), "finite"),
        (dict(temperature="0.7"), "must be a number"),
        (dict(top_p=float("nan")), "top_p=nan must be a number"),
        (dict(top_p=float("inf")), "top_p=inf"),
        (dict(top_k=float("nan")), "top_k=nan must be a whole number"),
        (dict(top_k=float("inf")), "top_k=inf must be a whole number"),
        (dict(top_k=2.0), "top_k=2.0 must be a whole number"),
    ],
)
def test_non_numbers_are_not_called_negative(kw, match):
    with pytest.raises(ConfigError, match=match) as info:
        SamplingConfig(**kw)
    assert "negative" not in str(info.value)


@pytest.mark.parametrize("case", ["rows", "one row", "all -inf", "ties", "nan", "strided", "transposed", "bfloat16"])
def test_argmax_ids_gives_torchs_argmax(case: str) -> None:
    """The numpy path picks what torch.argmax picks: the lowest id among ties, a NaN as the
    largest, whatever the strides; other dtypes go through torch."""
    gen = torch.Generator().manual_seed(0)
    logits = {
        "rows": lambda: torch.randn(5, 49152, generator=gen),
        "one row": lambda: torch.randn(49152, generator=gen),
        "all -inf": lambda: torch.full((3, 10), float("-inf")),
        "ties": lambda: torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]]),
        "nan": lambda: torch.tensor([[1.0, float("nan"), 3.0, float("nan")]]),
        "strided": lambda: torch.randn(8, 100, generator=gen)[:, ::2],
        "transposed": lambda: torch.randn(4, 7, generator=gen).t(),
        "bfloat16": lambda: torch.randn(3, 50, generator=gen).bfloat16(),
    }[case]()
    got = argmax_ids(logits)
    assert got == logits.reshape(-1, logits.shape[-1]).argmax(dim=-1).tolist()
    assert all(type(i) is int for i in got)
    with torch.inference_mode():
        assert argmax_ids(logits.clone()) == got
