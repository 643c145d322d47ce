"""Where a GGUF conversion writes before its folder is in place, and what a dead one leaves.

A conversion writes into ``converted/.convert-<pid>-<name>-<random>`` (:func:`staging_folder`)
and renames it into place (:func:`move_into_place`), so a reader never sees half a folder. A
conversion killed outright (SIGKILL, power loss) leaves that folder behind;
:func:`clean_stale_conversions` removes it once its process is gone, or once it is an hour old.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

#: the prefix of a conversion's temporary folder, followed by ``<pid>-``
_CONVERT_PREFIX = ".convert-"
#: a temporary folder this old is stale even if a process with its pid runs (the pid was reused)
STALE_AFTER_S = 3600.0


def staging_folder(converted: Path, stem: str) -> Path:
    """A new, empty ``converted/.convert-<pid>-<stem>-<random>`` folder for this process."""
    return Path(tempfile.mkdtemp(prefix=f"{_CONVERT_PREFIX}{os.getpid()}-{stem}-", dir=converted))


def move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished ``tmp`` to ``target``; a complete ``target`` another process made
    meanwhile wins (``tmp`` is then dropped by the caller), an incomplete one is replaced."""
    try:
        tmp.rename(target)
        return
    except OSError:
        if (target / "config.json").exists():
            return
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (assumed so where it cannot be asked without harm)."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate it on Windows: go by age there
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to someone else
        return True
    except OSError:
        return False
    return True


def clean_stale_conversions(folder: Path, *, max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary folders of conversions that died (their process is gone) or that are
    older than ``max_age_s``; return what was removed. A live conversion's folder is kept.

    Folders of the old naming (``.tmp-*``) are removed by age only.
    """
    removed = []
    now = time.time()
    for tmp in folder.glob(".*"):
        if not tmp.is_dir():
            continue
        try:
            age = now - tmp.stat().st_mtime
        except OSError:
            continue  # removed meanwhile
        if tmp.name.startswith(_CONVERT_PREFIX):
            pid_text = tmp.name[len(_CONVERT_PREFIX):].split("-", 1)[0]
            dead = not pid_text.isdigit() or not _process_alive(int(pid_text))
        elif tmp.name.startswith(".tmp-"):
            dead = False
        else:
            continue
        if dead or age > max_age_s:
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed
