"""The `real_model` guard of tests/conftest.py: a test that loads a real model without the marker
fails, whether it loads it itself, through a fixture, or through a fixture an earlier marked test
set up (and cached); a marked one passes; a test without a real model is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwise.runtime.models import BUILTIN_MODELS

from .conftest import RealModelUnmarked, real_model_file

ROOT = Path(__file__).resolve().parents[1]


def test_resolving_a_built_in_model_fails_an_unmarked_test(request: pytest.FixtureRequest, _real_model_guard) -> None:
    """The guard is on in this very run: this unmarked test's load fails it (the failure is then
    taken back, so that this test passes)."""
    for name in ("default", "gemma3-270m"):
        with pytest.raises(RealModelUnmarked, match=rf"{request.node.nodeid} loads a real model .*'{name}'.* real_model"):
            BUILTIN_MODELS[name].gguf_path()
    from draftwise import load_model

    with pytest.raises(RealModelUnmarked, match="mark.real_model"):
        load_model("default")  # before any conversion
    assert _real_model_guard.violations.pop(request.node.nodeid)


def test_what_is_a_real_model_file(tmp_path: Path, tiny_chat_folder: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(60))
    assert not real_model_file(fake) and not real_model_file(tiny_chat_folder)
    assert not real_model_file(tmp_path / "missing.gguf")
    converted = tmp_path / "converted"  # a folder converted from a GGUF of a real model's size
    converted.mkdir()
    (converted / "draftwise_source.json").write_text('{"gguf": "/x/SmolLM2.gguf", "size": 98362432}')
    assert real_model_file(converted) and real_model_file(converted / "config.json")
    (converted / "draftwise_source.json").write_text(f'{{"gguf": "{fake}", "size": 64}}')
    assert not real_model_file(converted)


INNER = '''
import pytest
from draftwise.errors import ModelLoadError
from draftwise.runtime.models import BUILTIN_MODELS


def resolve(name):
    try:
        return BUILTIN_MODELS[name].gguf_path()
    except ModelLoadError:  # not installed here: resolved all the same
        return None


@pytest.fixture(scope="session")
def real():
    return resolve("default")


@pytest.fixture(scope="session")
def later():
    return resolve("default")


@pytest.fixture(scope="module")
def uses_real(real):
    return real


@pytest.mark.real_model
def test_marked(real):
    pass


def test_unmarked_through_the_cached_fixture(real):
    pass


def test_unmarked_through_a_fixture_of_the_cached_one(uses_real):
    pass


def test_unmarked_loads_itself():
    resolve("gemma3-270m")


def test_unmarked_swallows_the_failure():
    try:
        resolve("default")
    except BaseException:
        pass


def test_unmarked_first_user_of_a_fixture(later):
    pass


@pytest.mark.real_model
def test_marked_after_an_unmarked_user(later):
    pass


def test_no_real_model(tmp_path):
    pass
'''


def test_the_guard_fails_each_unmarked_test_of_a_run(tmp_path: Path) -> None:
    """A pytest run of its own (the conftest as its plugin) over tests that resolve a built-in
    model (no model is loaded): each unmarked one fails, naming the marker; the marked ones pass,
    including one whose fixture an unmarked test tried first."""
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    real_model: a real model\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "1000"  # the summary lines whole
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-rA", "-q", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    lines = proc.stdout.splitlines()
    outcome = {line.split()[1].split("::")[1]: line.split()[0] for line in lines
               if line.split()[:1] in (["PASSED"], ["FAILED"], ["ERROR"]) and "::" in line}
    assert outcome == {
        "test_marked": "PASSED",
        "test_unmarked_through_the_cached_fixture": "ERROR",  # at setup, by the fixture check
        "test_unmarked_through_a_fixture_of_the_cached_one": "ERROR",
        "test_unmarked_loads_itself": "FAILED",
        "test_unmarked_swallows_the_failure": "FAILED",  # its report is turned into a failure
        "test_unmarked_first_user_of_a_fixture": "ERROR",
        "test_marked_after_an_unmarked_user": "PASSED",  # the failure was not cached for it
        "test_no_real_model": "PASSED",
    }, proc.stdout[-4000:] + proc.stderr[-2000:]
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    assert all("not marked real_model" in line for line in failures), failures
    assert "fixture 'real'" in proc.stdout and "'gemma3-270m'" in proc.stdout
    assert proc.returncode == 1
