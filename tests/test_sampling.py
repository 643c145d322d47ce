"""Sampling transforms against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from draftwise.errors import ConfigError
from draftwise.sampling import SamplingConfig, greedy, logits_to_probs, next_token, sample

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
    assert greedy(torch.tensor([1.0, 3.0, 3.0, 2.0])).item() == 1
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
