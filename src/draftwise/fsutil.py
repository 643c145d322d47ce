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
from pathlib import Path
from typing import Any

from .errors import ConfigError

#: the file a command leaves in a folder it made, so ``--overwrite`` knows it may delete it
MARKER = ".draftwise-output"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """``data`` as JSON (UTF-8, a final newline), written atomically."""
    return write_text_atomic(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def check_writable(folder: str | Path, what: str = "output folder") -> Path:
    """Create ``folder`` if needed and prove a file can be written there; a clear error otherwise.

    Call it before expensive work, so a bad ``--out`` fails in a second, not after the run.
    """
    folder = Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".draftwise-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"cannot write to the {what} {folder}: {exc.strerror or exc}; choose another") from None
    return folder


def claim_output_dir(folder: str | Path, command: str, *, overwrite: bool, holds: str = "results") -> Path:
    """Prepare ``folder`` for ``command``'s output and mark it as made by draftwise.

    - missing or empty: created and marked;
    - holds earlier output and ``overwrite`` is False: refused, naming the folder;
    - ``overwrite`` is True: deleted and made anew **only** if it carries this command's marker;
      a folder draftwise did not make is never deleted.
    """
    folder = Path(folder).expanduser()
    marker = folder / MARKER
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} exists and is not a folder; pass another --out")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise ConfigError(f"{folder} already holds {holds}; pass --overwrite to replace them or another --out")
        owner = marker.read_text(encoding="utf-8", errors="replace").strip() if marker.is_file() else None
        if owner != command:
            raise ConfigError(
                f"refusing to delete {folder}: `draftwise {command}` did not make it (no {MARKER} "
                f"file naming {command!r}); delete it yourself or pass another --out"
            )
        shutil.rmtree(folder)
    check_writable(folder)
    marker.write_text(command + "\n", encoding="utf-8")
    return folder


def is_owned_by(folder: str | Path, command: str) -> bool:
    """Whether ``folder`` carries ``command``'s marker."""
    marker = Path(folder) / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8", errors="replace").strip() == command
