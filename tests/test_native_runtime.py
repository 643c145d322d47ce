"""The native runtime against transformers on the same weights, rollback and layer subsets."""

from __future__ import annotations

import pytest
import torch

from draftwise.errors import ConfigError, ContextLengthError, UnsupportedArchitectureError
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config

TOL = 1e-4


def native_from(hf_model, dtype=torch.float32, max_context=None) -> NativeRuntime:
    return NativeRuntime(hf_model.config, hf_model.state_dict(), dtype=dtype, max_context=max_context)


def hf_logits(hf_model, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()  # [n, vocab]


CONFIGS = {
    "gqa-untied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "mha-tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "mqa": dict(num_attention_heads=4, num_key_value_heads=1),
    "attention-bias": dict(attention_bias=True),
    "rope-theta": dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama3-rope": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tiny_llama_matches_transformers(name):
    hf = random_hf_model(tiny_llama_config(**CONFIGS[name]), seed=3)
    rt = native_from(hf)
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = hf_logits(hf, ids)
    last = rt.prefill(ids[:30])
    assert (last - ref[29]).abs().max() <= TOL
    rows = rt.forward(ids[30:31])  # one-token decode
    assert (rows - ref[30:31]).abs().max() <= TOL
    rows = rt.forward(ids[31:])  # a multi-token (verification-shaped) pass
    assert rows.shape == (9, 96)
    assert (rows - ref[31:]).abs().max() <= TOL


def test_qwen2_biases_match_transformers():
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    hf = random_hf_model(config, seed=4)
    assert any(k.endswith("q_proj.bias") for k in hf.state_dict())
    rt = native_from(hf)
    ids = list(range(5, 25))
    ref = hf_logits(hf, ids)
    rt.prefill(ids[:10])
    assert (rt.forward(ids[10:]) - ref[10:]).abs().max() <= TOL


def test_rollback_gives_the_same_logits():
    hf = random_hf_model(tiny_llama_config(), seed=5)
    rt = native_from(hf)
    prompt, a, b = list(range(3, 23)), [40, 41, 42, 43], [50, 51, 52]
    rt.prefill(prompt)
    rt.forward(a)  # speculative tokens that get rejected
    rt.rollback(len(prompt) + 1)  # keep only a[0]
    assert rt.length == len(prompt) + 1
    got = rt.forward(b)
    ref = hf_logits(hf, prompt + a[:1] + b)[-len(b):]
    assert (got - ref).abs().max() <= TOL
    # decode -> roll back -> decode the same tokens again: identical logits
    rt.rollback(len(prompt))
    again = rt.forward(a[:1] + b)[1:]
    assert torch.equal(again, got)


def test_layer_subset_is_an_early_exit_and_keeps_full_cache_correct():
    hf = random_hf_model(tiny_llama_config(num_hidden_layers=4), seed=6)
    rt = native_from(hf)
    prompt = list(range(10, 30))
    rt.prefill(prompt)
    early = rt.forward([60, 61], layers=[0, 1])  # a two-layer draft pass
    # the same early exit computed by transformers: a copy truncated to two layers
    truncated = random_hf_model(tiny_llama_config(num_hidden_layers=2), seed=0)
    state = {k: v for k, v in hf.state_dict().items() if not k.startswith(("model.layers.2", "model.layers.3"))}
    truncated.load_state_dict(state)
    ref_early = hf_logits(truncated, prompt + [60, 61])[-2:]
    assert (early - ref_early).abs().max() <= TOL
    # the full-depth verification pass rewrites every layer at those positions
    rt.rollback(len(prompt))
    full = rt.forward([60, 61, 62])
    assert (full - hf_logits(hf, prompt + [60, 61, 62])[-3:]).abs().max() <= TOL
    with pytest.raises(ConfigError):
        rt.forward([1], layers=[])
    with pytest.raises(ConfigError):
        rt.forward([1], layers=[7])


def test_bfloat16_is_close_to_float32():
    hf = random_hf_model(tiny_llama_config(), seed=7)
    ids = list(range(1, 33))
    ref = native_from(hf).prefill(ids)
    got = native_from(hf, dtype=torch.bfloat16).prefill(ids)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() / ref.abs().max() < 0.05


def test_context_and_rollback_bounds():
    hf = random_hf_model(tiny_llama_config(), seed=8)
    rt = native_from(hf, max_context=16)
    assert rt.max_context == 16
    with pytest.raises(ContextLengthError, match="16"):
        rt.prefill(list(range(17)))
    rt.prefill(list(range(10)))
    with pytest.raises(ConfigError):
        rt.rollback(11)
    with pytest.raises(ConfigError, match="max_context"):
        native_from(hf, max_context=10_000)


def test_unsupported_architecture_names_the_fallback():
    from transformers import GPT2Config

    with pytest.raises(UnsupportedArchitectureError, match="runtime='hf'"):
        NativeRuntime(GPT2Config(), {})


@pytest.mark.real_model
def test_smollm2_matches_transformers_on_a_real_prompt(default_folder, default_model):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(default_folder, dtype=torch.float32).eval()
    ids = default_model.tokenizer("Speculative decoding makes a cheap draft propose tokens that the target verifies")[
        "input_ids"
    ]
    ref = hf_logits(hf, ids)
    rt = default_model.runtime  # the session's: load_model("default") built it from default_folder
    assert isinstance(rt, NativeRuntime)
    rt.rollback(0)
    last = rt.prefill(ids[:-4])
    assert (last - ref[-5]).abs().max() <= TOL
    assert (rt.forward(ids[-4:]) - ref[-4:]).abs().max() <= TOL
    assert rt.num_layers == 30 and rt.vocab_size == 49152


def test_rotary_tables_are_float64_cos_and_sin_rounded_once() -> None:
    """The tables every pass reads: transformers' float32 angles, their cos and sin taken in
    float64 and rounded to float32, so within half an ulp of float32 everywhere. torch's float32
    ``cos`` ran, in about 1 process in 8 on a 2-core Xeon, with one OpenMP thread's half of the
    table accurate only to 1.5e-4: that process's logits then differed from every other's."""
    import numpy as np

    from draftwise.runtime.llama import rope_tables

    config = tiny_llama_config(rope_theta=100000.0, max_position_embeddings=4096)
    cos, sin = rope_tables(config, 4096)
    hd = config.hidden_size // config.num_attention_heads
    inv = 1.0 / (100000.0 ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    angles = torch.arange(4096, dtype=torch.float)[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1).double().numpy()
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (4096, hd)
    assert torch.equal(cos, torch.from_numpy(np.cos(angles)).float())
    assert torch.equal(sin, torch.from_numpy(np.sin(angles)).float())
    half_ulp = 2.0 ** -25  # of a float32 in [0.5, 1); below that the bound is tighter still
    assert (cos.double() - torch.from_numpy(np.cos(angles))).abs().max().item() <= half_ulp
