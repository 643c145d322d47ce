"""The attention kernel fails safe (runtime/kernels): whatever stops it from being built or loaded,
the process takes the torch path with exactly one RuntimeWarning and no exception; a cached
library that does not load is rebuilt once; a cache folder that is not the user's own is never
loaded from. Each failure is simulated: a missing or failing compiler, Windows, no ``os.uname``,
a truncated ``.so``, a world-writable or foreign-owned cache folder."""

from __future__ import annotations

import ctypes
import fnmatch
import os
import platform
import stat
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from draftwise.runtime import kernels

needs_cc = pytest.mark.skipif(kernels._compiler() is None or sys.platform == "win32",
                              reason="no C compiler here to build the kernel with")


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A process that has not decided yet, with the kernel allowed and a cache of its own."""
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.delenv("DRAFTWISE_KERNELS", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("DRAFTWISE_CACHE", str(cache))
    return cache


def decide() -> tuple[ctypes.CDLL | None, list[str]]:
    """What the process runs, asked the ways the runtime asks it, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = kernels.library()
        for _ in range(3):
            kernels.why_not(), kernels.signature(), kernels.available(64), kernels.library()
    return lib, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def falls_back(match: str) -> str:
    """The torch path with one warning that says ``match``: that warning."""
    lib, said = decide()
    assert lib is None and kernels.signature() == "torch" and not kernels.available(64)
    assert len(said) == 1, said
    assert "slower torch path" in said[0] and match in said[0], said[0]
    assert match in (kernels.why_not() or "")
    return said[0]


def fake_compiler(tmp_path: Path, body: str) -> str:
    """An executable ``cc`` that answers ``--version``, logs each build it is asked for (a line
    in ``cc.log``) and then runs ``body`` (a sh snippet; ``$out`` is the ``-o`` path)."""
    path = tmp_path / "bin" / "cc"
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    'if [ "$1" = --version ]; then echo "fake cc 1.0"; exit 0; fi\n'
                    f'echo "$*" >> "{tmp_path / "cc.log"}"\n'
                    'out=""; for a in "$@"; do [ "$prev" = -o ] && out="$a"; prev="$a"; done\n'
                    + body + "\n")
    path.chmod(0o755)
    return str(path)


def builds(tmp_path: Path) -> int:
    log = tmp_path / "cc.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


# -- no kernel to be had: the torch path, one warning ---------------------------------------------

def test_no_compiler_on_path(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    falls_back("no C compiler on PATH")


@pytest.mark.skipif(sys.platform == "win32", reason="a sh script stands in for the compiler")
def test_a_compiler_that_fails(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", fake_compiler(tmp_path, 'echo "cc: internal compiler error" >&2; exit 4'))
    falls_back("internal compiler error")
    assert builds(tmp_path) == 1
    assert not list((fresh / "kernels").iterdir())  # no half-built library left behind


@pytest.mark.skipif(sys.platform == "win32", reason="a sh script stands in for the compiler")
def test_clang_without_openmp(fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Apple's clang: ``-fopenmp`` is an unsupported option (the build stops there)."""
    clang = fake_compiler(tmp_path, 'for a in "$@"; do if [ "$a" = -fopenmp ]; then '
                                    "echo \"clang: error: unsupported option '-fopenmp' for target "
                                    "'arm64-apple-darwin'\" >&2; exit 1; fi; done; exit 0")
    monkeypatch.setenv("CC", clang)
    falls_back("unsupported option '-fopenmp'")


def test_windows(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delattr(os, "uname", raising=False)  # Windows has none
    falls_back("not built on Windows")


def test_any_other_error_on_the_way(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What escaped before: an AttributeError from ``os.uname`` (any exception is one warning)."""
    def no_uname() -> str:
        raise AttributeError("module 'os' has no attribute 'uname'")

    monkeypatch.setattr(kernels, "_compiler", lambda: "cc")
    monkeypatch.setattr(kernels, "_cpu_key", no_uname)
    falls_back("AttributeError: module 'os' has no attribute 'uname'")


@needs_cc
def test_no_os_uname_still_builds(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "uname", raising=False)
    assert kernels._cpu_key().startswith(platform.machine())
    lib, said = decide()
    assert lib is not None and said == [] and kernels.why_not() is None


def test_kernels_off_is_asked_for_so_it_does_not_warn(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTWISE_KERNELS", "off")
    lib, said = decide()
    assert lib is None and said == [] and kernels.why_not() == "DRAFTWISE_KERNELS=off"


# -- a cached library that does not load: rebuilt once -------------------------------------------

def truncated(target: Path) -> None:
    """What the cache holds after a build cut short: the start of an ELF header ("file too short")."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9))
    target.chmod(0o755)


@needs_cc
def test_a_truncated_cached_library_is_rebuilt(fresh: Path) -> None:
    target = kernels._target(kernels._compiler() or "cc")
    truncated(target)
    with pytest.raises(OSError):
        ctypes.CDLL(str(target))  # it really does not load
    lib, said = decide()
    assert lib is not None and said == [] and kernels.why_not() is None
    assert Path(lib._name) == target and target.stat().st_size > 1000


@pytest.mark.skipif(sys.platform == "win32", reason="a sh script stands in for the compiler")
def test_a_rebuild_that_still_does_not_load_falls_back(fresh: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    cc = fake_compiler(tmp_path, 'printf "not a library" > "$out"')
    monkeypatch.setenv("CC", cc)
    truncated(kernels._target(cc))
    falls_back("does not load either")
    assert builds(tmp_path) == 1  # rebuilt once, not again


@needs_cc
def test_a_cached_library_others_may_write_is_rebuilt(fresh: Path) -> None:
    assert kernels.library() is not None
    target = Path(kernels.library()._name)
    before = target.stat().st_ino
    target.chmod(0o666)
    kernels._state.clear()
    lib, said = decide()
    assert lib is not None and said == []
    assert target.stat().st_ino != before and stat.S_IMODE(target.stat().st_mode) == 0o755


# -- a cache folder that is not the user's own: never loaded from ---------------------------------

def built_privately(cache: Path, match: str) -> None:
    """The kernel runs, built outside ``cache`` in a temporary folder since deleted, with one
    warning that names the problem; nothing was read from or written to the cache's folder."""
    lib, said = decide()
    assert lib is not None and kernels.why_not() is None
    assert len(said) == 1 and match in said[0] and "private temporary folder" in said[0], said
    where = Path(lib._name)
    assert Path(tempfile.gettempdir()) in where.parents and not where.parent.exists()
    assert not list((cache / "kernels").iterdir())


@needs_cc
@pytest.mark.parametrize("mode, match", [(0o777, "world-writable"), (0o775, "group-writable")])
def test_a_cache_folder_others_may_write_is_refused(fresh: Path, mode: int, match: str) -> None:
    (fresh / "kernels").mkdir(parents=True)
    (fresh / "kernels").chmod(mode)
    built_privately(fresh, match)


@needs_cc
def test_a_cache_folder_another_user_owns_is_refused(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fresh / "kernels").mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(kernels, "_user", lambda: os.stat(fresh).st_uid + 1)  # the tests run as its owner
    built_privately(fresh, "owned by another user")


@needs_cc
def test_the_kernels_folder_is_made_private(fresh: Path) -> None:
    old = os.umask(0o002)  # a umask that leaves new folders group-writable
    try:
        assert kernels.library() is not None
    finally:
        os.umask(old)
    assert stat.S_IMODE((fresh / "kernels").stat().st_mode) == 0o700


def test_a_refused_folder_and_a_failed_private_build_fall_back(fresh: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    if sys.platform == "win32":
        pytest.skip("a sh script stands in for the compiler")
    monkeypatch.setenv("CC", fake_compiler(tmp_path, 'echo "cc: no space left on device" >&2; exit 1'))
    (fresh / "kernels").mkdir(parents=True)
    (fresh / "kernels").chmod(0o777)
    message = falls_back("world-writable")
    assert "no space left on device" in message


@needs_cc
def test_a_cache_that_cannot_be_made_builds_privately(fresh: Path) -> None:
    fresh.write_text("a file where the cache folder should be")  # as a read-only home would refuse it
    lib, said = decide()
    assert lib is not None and kernels.why_not() is None
    assert len(said) == 1 and "cannot use" in said[0] and "private temporary folder" in said[0], said
    assert not Path(lib._name).parent.exists()


def test_every_file_the_library_is_built_from_ships_in_the_wheel() -> None:
    """A source or header the package data leaves out would build nowhere but a clone: every
    installed copy would fall back to the torch path (with its one warning)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["draftwise"]
    package = root / "src" / "draftwise"
    for path in (*kernels.SOURCES, *kernels.HEADERS):
        assert path.exists(), path
        relative = path.resolve().relative_to(package.resolve()).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in the package data"
    included = {p.name for p in (*kernels.SOURCES, *kernels.HEADERS)}
    on_disk = {p.name for p in kernels.SOURCE.parent.iterdir() if p.suffix in (".c", ".h")}
    assert on_disk == included, f"kernel files the build does not name: {on_disk - included}"
