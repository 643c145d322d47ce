"""Loading: errors that name the path and the fix, the GGUF conversion cache, the HF fallback."""

from __future__ import annotations

import pytest

from draftwise import ModelLoadError, UnsupportedArchitectureError, load_model
from draftwise.loaders import cache_dir, gguf_to_folder
from draftwise.models import BUILTIN_MODELS


def test_missing_model_names_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_model(str(missing))


def test_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=r"weights\.gguf.*not a GGUF"):
        load_model(str(bad))


def test_truncated_gguf_names_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    source = BUILTIN_MODELS["default"].gguf_path()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(source.read_bytes()[:4096])
    with pytest.raises(ModelLoadError, match="truncated.gguf"):
        load_model(str(bad))
    assert not list((tmp_path / "cache" / "converted").glob("truncated*"))  # nothing half-written


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path))


def test_cache_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


def test_second_load_reuses_the_converted_folder(default_folder, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert gguf_to_folder(BUILTIN_MODELS["default"].gguf_path()) == default_folder


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, default_folder):
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(vocab_size=49152, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(folder)
    for f in default_folder.glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    return folder


def test_unsupported_architecture_native_says_use_hf(gpt2_folder):
    with pytest.raises(UnsupportedArchitectureError, match="runtime='hf'"):
        load_model(str(gpt2_folder), runtime="native")


def test_auto_falls_back_to_the_hf_adapter(gpt2_folder):
    from draftwise import generate
    from draftwise.runtime.hf import HFRuntime

    model = load_model(str(gpt2_folder), runtime="auto")
    assert isinstance(model.runtime, HFRuntime)
    assert generate(model, [10, 11, 12], max_new_tokens=3).new_tokens <= 3


def test_default_model_loads_natively(default_model):
    from draftwise.runtime.native import NativeRuntime

    assert isinstance(default_model.runtime, NativeRuntime)
    assert 2 in default_model.eos_token_ids  # <|im_end|>
