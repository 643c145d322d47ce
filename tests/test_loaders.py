"""Loading: errors that name the path and the fix, the GGUF conversion cache, the HF fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftwise import ConfigError, ModelLoadError, UnsupportedArchitectureError, load_model
from draftwise.runtime.loaders import cache_dir, clean_stale_conversions, gguf_to_folder
from draftwise.runtime.models import BUILTIN_MODELS


def test_missing_model_names_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_model(str(missing))


def test_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=r"weights\.gguf.*not a GGUF"):
        load_model(str(bad))


@pytest.mark.real_model
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


@pytest.mark.real_model
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


@pytest.mark.real_model
def test_unsupported_architecture_native_says_use_hf(gpt2_folder):
    with pytest.raises(UnsupportedArchitectureError, match="runtime='hf'"):
        load_model(str(gpt2_folder), runtime="native")


@pytest.mark.real_model
def test_auto_falls_back_to_the_hf_adapter(gpt2_folder):
    from draftwise import generate
    from draftwise.runtime.hf import HFRuntime

    model = load_model(str(gpt2_folder), runtime="auto")
    assert isinstance(model.runtime, HFRuntime)
    assert generate(model, [10, 11, 12], max_new_tokens=3, draft="none").new_tokens <= 3


@pytest.mark.real_model
def test_default_model_loads_natively(default_model):
    from draftwise.runtime.native import NativeRuntime

    assert isinstance(default_model.runtime, NativeRuntime)
    assert 2 in default_model.eos_token_ids  # <|im_end|>


# -- the cache: ~ expanded, unwritable found first, a killed conversion's leftovers cleaned --------


def test_cache_dir_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DRAFTWISE_CACHE", "~/x")
    assert cache_dir() == tmp_path / "x"


def _fake_gguf(folder):
    path = folder / "fake.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 60)
    return path


def test_unwritable_cache_is_one_clear_line_before_converting(tmp_path, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("conversion started before the cache was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # root can write anywhere chmod allows; under a file, nobody can
    monkeypatch.setenv("DRAFTWISE_CACHE", str(blocker / "cache"))
    with pytest.raises(ConfigError, match=r"cannot write to the draftwise cache folder .*DRAFTWISE_CACHE") as info:
        gguf_to_folder(_fake_gguf(tmp_path))
    assert "\n" not in str(info.value)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_conversion_folders_are_cleaned(tmp_path):
    import os
    import time

    converted = tmp_path / "converted"
    dead = converted / f".convert-{_dead_pid()}-model-abc"
    live = converted / f".convert-{os.getpid()}-model-def"
    old_live = converted / f".convert-{os.getpid()}-model-ghi"
    old_style = converted / ".tmp-xyz"
    done = converted / "model-0123456789abcdef"
    for folder in (dead, live, old_live, old_style, done):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
    hours_ago = time.time() - 2 * 3600
    for folder in (old_live, old_style, done):
        os.utime(folder, (hours_ago, hours_ago))
    removed = clean_stale_conversions(converted)
    assert sorted(p.name for p in removed) == sorted([dead.name, old_live.name, old_style.name])
    assert sorted(p.name for p in converted.iterdir()) == sorted([live.name, done.name])


class _FakeSaver:
    """Stands in for a transformers model or tokenizer: writes a file, or fails, on save."""

    def __init__(self, name, fail=None):
        self.name, self.fail = name, fail
        self.config = type("Config", (), {})()

    def save_pretrained(self, folder, **kwargs):
        if self.fail:
            raise self.fail
        (Path(folder) / self.name).write_text("{}")


def test_conversion_cleans_a_killed_ones_folder_and_writes_in_place(tmp_path, monkeypatch):
    import json
    import os

    import transformers

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    killed = tmp_path / "cache" / "converted" / f".convert-{_dead_pid()}-fake-x1"
    killed.mkdir(parents=True)  # what a SIGKILLed conversion leaves
    model = _FakeSaver("config.json", fail=KeyboardInterrupt())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _FakeSaver("tokenizer.json"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    with pytest.raises(KeyboardInterrupt):  # interrupted mid-save: nothing half-written stays
        gguf_to_folder(gguf)
    assert os.listdir(tmp_path / "cache" / "converted") == []  # the killed one's folder went too
    model.fail = None
    folder = gguf_to_folder(gguf)
    assert folder.parent == tmp_path / "cache" / "converted" and folder.name.startswith("fake-")
    assert sorted(os.listdir(folder)) == ["config.json", "draftwise_source.json", "tokenizer.json"]
    assert json.loads((folder / "draftwise_source.json").read_text())["size"] == 64
    assert os.listdir(folder.parent) == [folder.name]
