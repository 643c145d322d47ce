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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import ConfigError

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


def check_output_dir(folder: str | Path, command: str, *, overwrite: bool, holds: str = "results") -> Path:
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
    if not overwrite:
        raise ConfigError(f"{folder} already holds {holds}; pass --overwrite to replace them or another --out")
    return folder


def claim_output_dir(folder: str | Path, command: str, *, overwrite: bool, holds: str = "results") -> Path:
    """Prepare ``folder`` for ``command``'s output and mark it as made by draftwise.

    - missing or empty: created and marked;
    - holds earlier output and ``overwrite`` is False: refused, naming the folder;
    - ``overwrite`` is True: deleted and made anew **only** if it carries this command's marker;
      a folder draftwise did not make is never deleted.
    """
    folder = check_output_dir(folder, command, overwrite=overwrite, holds=holds)
    if _holds_files(folder):  # overwrite, and the folder is ours (checked above)
        shutil.rmtree(folder)
    check_writable(folder)
    write_text_atomic(folder / MARKER, command + "\n")
    return folder


def is_owned_by(folder: str | Path, command: str) -> bool:
    """Whether ``folder`` carries ``command``'s marker."""
    return _owner(Path(folder).expanduser()) == command
