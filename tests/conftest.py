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


# -- the real_model guard ---------------------------------------------------------------------
# A test that loads a real model (a built-in one installed from PyPI: SmolLM2-135M, Gemma 3 270M,
# or a folder converted from one) must be marked `real_model`, so that `-m "not real_model"` runs
# without any. `_real_model_guard` (autouse, session) wraps the loading path; a load during an
# unmarked test fails it at once, naming the marker. A model a session or module fixture loaded
# for a marked test stays cached, so `_real_model_check` (autouse) also fails an unmarked test
# whose fixtures include one that loaded a real model. Tiny random models are not real models.

#: a GGUF file at least this large is a real model's (the smallest built-in one is 94 MiB; the
#: GGUF files tests write are a few KiB)
REAL_GGUF_BYTES = 32 << 20


class RealModelUnmarked(pytest.fail.Exception):
    """The failure of a test that loads a real model without the ``real_model`` marker."""


class RealModelGuard:
    """Which test runs, which fixtures are being set up, and which of them loaded a real model."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None  # the test running now (pytest_runtest_protocol)
        self.setting_up: list[tuple[str, str]] = []  # (argname, baseid) of the fixtures being set up
        self.real_fixtures: set[tuple[str, str]] = set()  # fixtures whose setup loaded a real model
        self.violations: dict[str, str] = {}  # nodeid -> the failure, for a test that swallowed it

    @staticmethod
    def message(nodeid: str, what: str) -> str:
        return (
            f"{nodeid} loads a real model ({what}) but is not marked real_model: add "
            "@pytest.mark.real_model, or use a tiny random model (tests/tiny.py, tests/conftest.py)"
        )

    def loaded(self, what: str) -> None:
        """A real model is being loaded: fail the running test unless it is marked ``real_model``."""
        item = self.item
        if item is None:  # collection, or outside any test: nothing to attribute it to
            return
        if item.get_closest_marker("real_model") is not None:
            self.real_fixtures.update(self.setting_up)  # cached for later tests: they must be marked too
            return
        msg = self.message(item.nodeid, what)
        self.violations.setdefault(item.nodeid, msg)
        raise RealModelUnmarked(msg, pytrace=False)

    def check_fixtures(self, item: pytest.Item, fixturenames: list[str]) -> None:
        """Fail unmarked ``item`` if one of its fixtures (directly or through others) loaded a
        real model for an earlier, marked test: that cached model would not pass the load check."""
        if item.get_closest_marker("real_model") is not None:
            return
        nodeid = item.nodeid
        for name, baseid in sorted(self.real_fixtures):
            visible = baseid == "" or nodeid.startswith((baseid + "/", baseid + "::"))
            if name in fixturenames and visible:
                raise RealModelUnmarked(self.message(nodeid, f"through the fixture {name!r}"), pytrace=False)


_GUARD = RealModelGuard()


def real_model_file(path: object) -> bool:
    """Whether ``path`` is a built-in model's weights: a file in a built-in model's package, a
    GGUF file of a real model's size, or a folder converted from one (its draftwise_source.json)."""
    import importlib.util
    import json

    from draftwise.runtime.models import BUILTIN_MODELS

    try:
        p = Path(str(path)).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    for builtin in BUILTIN_MODELS.values():
        spec = importlib.util.find_spec(builtin.package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if p.is_relative_to(Path(folder).resolve()):
                return True
    try:
        if p.is_file() and p.suffix == ".gguf" and p.stat().st_size >= REAL_GGUF_BYTES:
            return True
        source = (p if p.is_dir() else p.parent) / "draftwise_source.json"
        if source.is_file():
            recorded = json.loads(source.read_text())
            return int(recorded.get("size", 0)) >= REAL_GGUF_BYTES or real_model_file(recorded.get("gguf", ""))
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _GUARD.item = item  # before its fixtures are set up: the check covers their loads
    try:
        return (yield)
    finally:
        _GUARD.item = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    _GUARD.setting_up.append((fixturedef.argname, fixturedef.baseid))
    try:
        return (yield)
    except RealModelUnmarked:
        # not cached: a later (marked) test that asks for this fixture sets it up itself, instead
        # of getting this test's failure (pytest keeps a session fixture's exception for the session)
        fixturedef.finish(request)
        raise
    finally:
        _GUARD.setting_up.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that caught the guard's failure (``except BaseException``, a thread) still fails."""
    report = yield
    msg = _GUARD.violations.get(item.nodeid)
    if msg and report.when == "call" and report.passed:
        report.outcome = "failed"
        report.longrepr = msg
    return report


@pytest.fixture(scope="session", autouse=True)
def _real_model_guard():
    """Wrap the ways a real model is loaded (a built-in name resolved to its GGUF, a GGUF read or
    converted, a model folder read) so that an unmarked test doing so fails (:class:`RealModelGuard`)."""
    from draftwise.runtime import gguf_blocks, loaders
    from draftwise.runtime.models import BuiltinModel

    real_gguf_path = BuiltinModel.gguf_path
    check_gguf, read_folder, read_q4_blocks = loaders._check_gguf, loaders._read_folder, gguf_blocks.read_q4_blocks

    def gguf_path(self: BuiltinModel) -> Path:
        _GUARD.loaded(f"the built-in model {self.name!r}")
        return real_gguf_path(self)

    def checked(read, what):
        def wrapper(path, *args, **kwargs):
            if real_model_file(path):
                _GUARD.loaded(f"{what} {path}")
            return read(path, *args, **kwargs)

        return wrapper

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BuiltinModel, "gguf_path", gguf_path)
        mp.setattr(loaders, "_check_gguf", checked(check_gguf, "the GGUF file"))
        mp.setattr(loaders, "_read_folder", checked(read_folder, "the model folder"))
        mp.setattr(gguf_blocks, "read_q4_blocks", checked(read_q4_blocks, "the GGUF file"))
        yield _GUARD


@pytest.fixture(autouse=True)
def _real_model_check(request: pytest.FixtureRequest, _real_model_guard: RealModelGuard) -> None:
    """Fail an unmarked test that uses a fixture which loaded a real model for an earlier test."""
    _real_model_guard.check_fixtures(request.node, request.fixturenames)


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
