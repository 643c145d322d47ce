"""Shared fixtures: tiny random models for fast correctness tests, real models for equality."""

from __future__ import annotations

import os
from pathlib import Path

import draftwise  # noqa: F401  first: it sets the OpenMP defaults before torch loads (docs/runtime.md)
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest-xdist, -n auto). Each worker keeps
    # its share of the cores: with torch's default of every core in each worker, the workers'
    # OpenMP threads spin on each other's cores and tests ran 3-4x slower than alone.
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, torch.get_num_threads() // _workers))


def _test_cache() -> None:
    """Point DRAFTWISE_CACHE at a cache of this test run's own that shares the real one's
    converted weights (symlinks: no test converts the default model twice) but not its
    profiles: a profile a test measures, beside another worker on a busy machine, must never
    become the costs a user's later ``--k auto`` reads. Both xdist workers share it."""
    import tempfile

    from draftwise.runtime.loaders import cache_dir

    real = cache_dir()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    mine = Path(tempfile.gettempdir()) / f"draftwise-test-cache-{run}"
    mine.mkdir(parents=True, exist_ok=True)
    for sub in ("converted", "quant", "drafts"):
        try:
            (real / sub).mkdir(parents=True, exist_ok=True)
            (mine / sub).symlink_to(real / sub, target_is_directory=True)
        except OSError:  # the other worker linked it, or no usable real cache (this run converts into its own)
            pass
    os.environ["DRAFTWISE_CACHE"] = str(mine)


_test_cache()


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def random_hf_model(config, seed: int = 0):
    """A transformers model with random weights (large enough that outputs are not flat)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # also randomises norm weights, so a wrong norm shows up
    return model


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls gain nothing from a second intra-op thread, and on a shared 2-core machine
    the OpenMP hand-off makes them up to ~50x slower; restore the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def default_folder() -> Path:
    """The converted HF folder of the embedded default model (converted once, then cached)."""
    from draftwise.runtime.loaders import gguf_to_folder
    from draftwise.runtime.models import BUILTIN_MODELS

    builtin = BUILTIN_MODELS["default"]
    if not builtin.installed():
        pytest.fail("the default model is not installed: run `make test`, which installs it")
    return gguf_to_folder(builtin.gguf_path())


@pytest.fixture(scope="session")
def default_model(default_folder):
    from draftwise import load_model

    return load_model("default", dtype="float32")


@pytest.fixture
def cli_shares_default_model(monkeypatch, default_model) -> list[str]:
    """``draftwise`` commands run in-process (CliRunner) that load ``default`` as the session did
    (float32, runtime auto, CPU, no quant) get the session's ``default_model`` instead of a
    second copy; any other load goes through. Returns the specs it served, so a test can check
    that it did."""
    import draftwise.cli.common as common

    real = common.load_model
    served: list[str] = []

    def load(spec, **options):
        plain = dict(dtype="float32", runtime="auto", max_context=None, device="cpu", quant="none", compile=False)
        if spec == "default" and all(options.get(k, v) == v for k, v in plain.items()):
            served.append(spec)
            return default_model
        return real(spec, **options)

    monkeypatch.setattr(common, "load_model", load)
    return served


@pytest.fixture(scope="session")
def tiny_chat_folder(tmp_path_factory) -> Path:
    """A tiny random Llama with a tiny chat tokenizer (tests/tiny.py): SmolLM2's special tokens,
    ids and chat template over a 2048-token byte-level BPE; nothing of the real model is read."""
    from .tiny import make_chat_folder

    return make_chat_folder(tmp_path_factory.mktemp("tiny-chat"), seed=1)


@pytest.fixture(scope="module")
def tiny(tiny_chat_folder, one_thread):
    """The tiny random chat model, loaded once per test module (one intra-op thread)."""
    from draftwise import load_model

    return load_model(str(tiny_chat_folder))
