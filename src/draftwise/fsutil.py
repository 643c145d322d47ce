"""Files written safely: atomically (a reader never sees half a file, a crash never leaves one),
output folders deleted only when draftwise made them, and unwritable places found before work.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_json_atomic(d / "x.json", {"a": 1}).read_text()
'{\\n  "a": 1\\n}\\n'
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftwise.errors import ConfigError

#: the file a command leaves in a folder it made, so ``--overwrite`` knows it may delete it
MARKER = ".draftwise-output"
#: the mode of a new file written atomically (``mkstemp`` would leave it private, 0600)
_NEW_FILE_MODE = 0o644


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends.

    For writers that want a file name (``torch.save``, ``safetensors``): on an error or an
    interruption the temporary file is removed and ``path`` keeps its old content, if any.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else _NEW_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    with atomic_path(path) as tmp:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the data does
    return path


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """``data`` as JSON (UTF-8, a final newline), written atomically."""
    return write_text_atomic(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def read_json(path: Path, what: str, made_by: str) -> Any:
    """The JSON in ``path``, a ``what`` (e.g. "profile") written by the command ``made_by``;
    a binary or non-JSON file is a ConfigError that says so."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a {what}: it is not UTF-8 text (binary?)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); pass a {what} written by `{made_by}`") from None


@contextmanager
def fields_of(source: str, remedy: str) -> Iterator[None]:
    """Reading a JSON document's fields: a missing field (KeyError) or a wrong shape (TypeError,
    ValueError, AttributeError) inside the block is one ConfigError naming ``source``, ending in
    ``remedy`` (e.g. "measure it again").

    >>> with fields_of("p.json", "measure it again"):
    ...     {}["step"]
    Traceback (most recent call last):
    draftwise.errors.ConfigError: p.json is incomplete: it has no 'step' field; measure it again
    """
    try:
        yield
    except KeyError as exc:
        raise ConfigError(f"{source} is incomplete: it has no {exc} field; {remedy}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{source} is malformed: {exc}; {remedy}") from None


def cache_root() -> Path:
    """draftwise's cache folder: ``$DRAFTWISE_CACHE`` (``~`` expanded), else the platform's user
    cache dir (``platformdirs``; ``$XDG_CACHE_HOME/draftwise`` or ``~/.cache/draftwise`` without it)."""
    env = os.environ.get("DRAFTWISE_CACHE", "").strip()
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("draftwise"))
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        return Path(base) / "draftwise"


def check_writable(folder: str | Path, what: str = "output folder", *, fix: str = "choose another") -> Path:
    """Create ``folder`` if needed and prove a file can be written there; a clear error otherwise.

    Call it before expensive work, so a bad ``--out`` fails in a second, not after the run.
    ``fix`` ends the message (e.g. ``"set DRAFTWISE_CACHE to a writable folder"``).
    """
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".draftwise-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"cannot write to the {what} {folder}: {exc.strerror or exc}; {fix}") from None
    return folder


def _owner(folder: Path) -> str | None:
    marker = folder / MARKER
    return marker.read_text(encoding="utf-8", errors="replace").strip() if marker.is_file() else None


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds anything besides draftwise's marker (a marker alone loses nothing)."""
    return folder.is_dir() and any(p.name != MARKER for p in folder.iterdir())


def _is_ours(name: str, writes: Collection[str]) -> bool:
    """Whether ``name`` is one of ``writes`` or a temporary file :func:`atomic_path` left for one.

    >>> [_is_ours(n, ["config.json"]) for n in ("config.json", ".config.json.k3x9.tmp", "notes.txt")]
    [True, True, False]
    """
    return name in writes or any(name.startswith(f".{w}.") and name.endswith(".tmp") for w in writes)


def _foreign(folder: Path, writes: Collection[str] | None) -> list[str]:
    """The entries of ``folder`` its command did not write (none when it names no ``writes``)."""
    if writes is None or not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != MARKER and not _is_ours(p.name, writes))


def _names(names: list[str], most: int = 5) -> str:
    """
    >>> _names(["a", "b"]), _names(list("abcdefg"))
    ('a, b', 'a, b, c, d, e and 2 more')
    """
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_output_dir(
    folder: str | Path, command: str, *, overwrite: bool, holds: str = "results", writes: Collection[str] | None = None
) -> Path:
    """What :func:`claim_output_dir` would do, checked without touching anything.

    Call it before expensive work; it raises the same errors :func:`claim_output_dir` would.
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} exists and is not a folder; pass another --out")
    if not _holds_files(folder):
        return folder
    if _owner(folder) != command:  # never suggest --overwrite for a folder it would not delete
        if overwrite:
            raise ConfigError(
                f"refusing to delete {folder}: `draftwise {command}` did not make it (no {MARKER} "
                f"file naming {command!r}); delete it yourself or pass another --out"
            )
        raise ConfigError(f"{folder} is not empty and `draftwise {command}` did not make it; pass a new or empty --out")
    foreign = _foreign(folder, writes)
    if foreign:  # --overwrite would not help either: it deletes only what the command wrote
        raise ConfigError(
            f"{folder} holds files `draftwise {command}` did not write ({_names(foreign)}); "
            "move them out or pass another --out"
        )
    if not overwrite:
        raise ConfigError(f"{folder} already holds {holds}; pass --overwrite to replace them or another --out")
    return folder


def _delete_entries(folder: Path, writes: Collection[str] | None) -> None:
    """Delete what ``folder`` holds (only ``writes`` when given), never ``folder`` itself: a
    symbolic link to a folder stays a link, and the output is written through it."""
    for entry in folder.iterdir():
        if entry.name == MARKER or (writes is not None and not _is_ours(entry.name, writes)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def claim_output_dir(
    folder: str | Path, command: str, *, overwrite: bool, holds: str = "results", writes: Collection[str] | None = None
) -> Path:
    """Prepare ``folder`` for ``command``'s output and mark it as made by draftwise.

    - missing or empty: created and marked;
    - holds earlier output and ``overwrite`` is False: refused, naming the folder;
    - ``overwrite`` is True: emptied **only** if it carries this command's marker (a folder
      draftwise did not make is never touched);
    - ``writes``: the names the command writes in the folder. Then ``--overwrite`` deletes only
      those, and a folder that also holds anything else (a file the user added later) is
      refused, naming it.

    A symbolic link to a folder is written through: what it points to is emptied and filled.
    """
    folder = check_output_dir(folder, command, overwrite=overwrite, holds=holds, writes=writes)
    if _holds_files(folder):  # overwrite, and the folder is ours (checked above)
        _delete_entries(folder, writes)
    check_writable(folder)
    write_text_atomic(folder / MARKER, command + "\n")
    return folder


def is_owned_by(folder: str | Path, command: str) -> bool:
    """Whether ``folder`` carries ``command``'s marker."""
    return _owner(Path(folder).expanduser()) == command
