"""Exporting a draftwise choice to vLLM, SGLang and Hugging Face ``generate`` options."""

from __future__ import annotations

import json
import shlex
import warnings

import pytest

from draftwise.planner.export import export_config, export_dict
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError

# vLLM SpeculativeConfig fields draftwise writes (vllm/config/speculative.py; docs
# features/speculative_decoding: n_gram, draft_model)
VLLM_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
VLLM_METHODS = {"ngram", "draft_model"}
# SGLang ServerArgs flags (python/sglang/srt/server_args.py; docs advanced_features/speculative_decoding)
SGLANG_FLAGS = {
    "--model-path",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-min-match-window-size",
    "--speculative-ngram-max-match-window-size",
    "--speculative-ngram-max-bfs-breadth",
}
SGLANG_ALGORITHMS = {"NGRAM", "STANDALONE"}

SPECS = ["lookup", "lookup:max=4,min=2", "self:exit=12", "self:layers=0-9", "model:Qwen/Qwen3-0.6B"]


def _code(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("spec", ["lookup", "lookup:max=4,min=2", "model:Qwen/Qwen3-0.6B"])
def test_vllm_json_has_exactly_real_keys(spec):
    text = export_config(spec, 5, "vllm", model="Qwen/Qwen3-8B")
    (line,) = _code(text)
    argv = shlex.split(line)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert argv[3] == "--speculative-config"
    cfg = json.loads(argv[4])
    assert set(cfg) <= VLLM_KEYS
    assert cfg["method"] in VLLM_METHODS
    assert cfg["num_speculative_tokens"] == 5
    assert cfg == export_dict(spec, 5, "vllm")["options"]


def test_vllm_lookup_values():
    cfg = export_dict("lookup:max=4,min=2", 3, "vllm")["options"]
    assert cfg == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert export_dict("model:/m/draft", 3, "vllm")["options"] == {
        "method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 3}


@pytest.mark.parametrize("spec", ["lookup", "lookup:max=4,min=2", "model:Qwen/Qwen3-0.6B"])
def test_sglang_flags_are_real(spec):
    text = export_config(spec, 4, "sglang", model="Qwen/Qwen3-8B")
    argv = shlex.split(_code(text)[0])
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    flags = argv[3:]
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert len(pairs) * 2 == len(flags)
    assert set(pairs) <= SGLANG_FLAGS
    assert pairs["--speculative-algorithm"] in SGLANG_ALGORITHMS
    assert pairs["--speculative-num-draft-tokens"] == "5"  # k + 1: the tree's root counts


def test_sglang_without_model_is_a_fragment():
    argv = shlex.split(_code(export_config("lookup", 4, "sglang"))[0])
    assert argv[0] == "--speculative-algorithm"


@pytest.mark.parametrize("spec", SPECS)
def test_hf_kwargs_are_generation_config_fields(spec):
    from transformers import GenerationConfig

    d = export_dict(spec, 4, "hf")
    assert d["supported"]
    kwargs = {key: value for key, value in d["options"].items() if key != "assistant_model"}
    for group in (kwargs, d.get("assistant_generation_config", {})):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config = GenerationConfig(**group)
            config.validate(strict=True)
        for key, value in group.items():
            assert hasattr(GenerationConfig(), key), key
            assert getattr(config, key) == value


def test_hf_text_is_python(tmp_path):
    for spec in SPECS:
        text = export_config(spec, 4, "hf", model="Qwen/Qwen3-8B")
        compile(text, "<export>", "exec")
    assert eval(export_config("lookup", 4, "hf")) == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3}


def test_hf_assistant_draft_length_goes_on_its_generation_config():
    d = export_dict("model:/m/draft", 6, "hf")
    assert d["options"] == {"assistant_model": "/m/draft"}
    assert d["assistant_generation_config"]["num_assistant_tokens"] == 6
    text = export_config("model:/m/draft", 6, "hf")
    assert "assistant.generation_config.num_assistant_tokens = 6" in text
    assert export_dict("self:exit=12", 3, "hf")["options"] == {"assistant_early_exit": 12}


def test_self_has_no_layer_skip_in_servers():
    for engine in ("vllm", "sglang"):
        d = export_dict("self:exit=8", 4, engine)
        assert not d["supported"] and d["options"] == {}
        assert "no layer-skip" in d["note"] and "EAGLE" in d["note"]
        assert all(line.startswith("#") for line in export_config("self", 4, engine).splitlines())


def test_self_in_hf_needs_a_prefix_of_layers():
    assert not export_dict("self:skip=10-19", 4, "hf", num_layers=24)["supported"]
    assert export_dict("self:skip=12-23", 4, "hf", num_layers=24)["options"] == {"assistant_early_exit": 12}
    assert not export_dict("self", 4, "hf")["supported"]
    assert export_dict("self", 4, "hf", num_layers=24)["options"] == {"assistant_early_exit": 12}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf"])
def test_none_says_speculation_does_not_pay(engine):
    d = export_dict("none", 4, engine)
    assert d["options"] == {} and "does not pay" in d["note"]
    assert "does not pay" in export_config("none", 4, engine)


@pytest.mark.parametrize(
    "draft, k, engine, needle",
    [
        ("lookup", 4, "tgi", "unknown engine"),
        ("tree", 4, "vllm", "unknown draft spec"),
        ("lookup:max=x", 4, "vllm", "whole number"),
        ("lookup:n=3", 4, "vllm", "unknown lookup draft option"),
        ("lookup:max=1,min=3", 4, "vllm", "min <= max"),
        ("self:exit=0", 4, "hf", "self:exit="),
        ("self:exit=4,skip=1", 4, "hf", "not several"),
        ("self:layers=a-b", 4, "hf", "layer list"),
        ("model:", 4, "vllm", "model: needs a path"),
        ("lookup", 0, "vllm", "k=0"),
        ("self:layers=0-30", 4, "hf", "does not exist"),  # checked against num_layers below
    ],
)
def test_bad_input(draft, k, engine, needle):
    with pytest.raises(ConfigError, match=needle):
        export_config(draft, k, engine, num_layers=24)


@pytest.mark.parametrize("spec", SPECS + ["self:skip=12-23", "none"])
def test_a_draft_spec_object_exports_like_its_string(spec):
    parsed = DraftSpec.parse(spec)
    for engine in ("vllm", "sglang", "hf"):
        assert export_dict(parsed, 4, engine, num_layers=24) == export_dict(spec, 4, engine, num_layers=24)
    assert export_dict(spec, 4, "vllm")["draft"] == str(parsed)


def test_equivalent_specs_export_alike():
    # lookup's defaults are max=3, min=1: spelled out or not, the engines get the same options
    for engine in ("vllm", "sglang", "hf"):
        assert export_dict("lookup:min=1,max=3", 4, engine) == export_dict("lookup", 4, engine)
    assert export_dict("self:layers=0-11", 4, "hf")["options"] == {"assistant_early_exit": 12}


def test_an_eagle_head_exports_to_vllm_as_eagle3_with_how_to_write_the_head():
    out = export_dict("eagle:default", 3, "vllm")
    assert out["supported"] and out["options"] == {"method": "eagle3", "model": "<HEAD_DIR>", "num_speculative_tokens": 3}
    assert "draftwise export-head default --out HEAD_DIR" in out["note"]
    assert not export_dict("eagle:default", 3, "sglang")["options"].get("method")  # vLLM's form only
