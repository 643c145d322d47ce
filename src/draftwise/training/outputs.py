"""Files a trained draft ships with hold no machine's path: the target and the prompts file by
name, paths in the recorded command cut to their last part (:func:`portable_command`,
:func:`portable_meta`); the held-out questions a run kept aside (:func:`write_heldout`)."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from draftwise.fsutil import (
    write_text_atomic,
)
from draftwise.questions import DEFAULT_QUESTIONS, Question


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_machine_path(text: str) -> bool:
    """An absolute path, a home-relative one, or one that climbs out of the current folder.

    >>> [_is_machine_path(t) for t in ("/srv/runs/x", "~/x", "../data/q.jsonl", "drafts/x", "C:\\\\x", "0.7")]
    [True, True, True, False, True, False]
    """
    parts = PurePosixPath(text).parts
    return (
        PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute()
        or text.startswith("~") or ".." in parts
    )


def _name_only(text: str) -> str:
    return PureWindowsPath(text).name if "\\" in text else PurePosixPath(text).name


def portable_command(command: str | None) -> str | None:
    """``command`` with every machine path in it cut to its last part (a file or folder name).

    >>> portable_command("draftwise distill --out /srv/runs/smol4 --prompts=../data/q.jsonl --lr 5e-4")
    'draftwise distill --out smol4 --prompts=q.jsonl --lr 5e-4'
    """
    if command is None:
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: words as they stand
        words = command.split()
    out = []
    for word in words:
        flag, eq, value = word.partition("=") if word.startswith("-") else ("", "", word)
        if not eq and flag:
            out.append(word)
            continue
        out.append(flag + eq + (_name_only(value) if _is_machine_path(value) else value))
    return shlex.join(out)


def prompts_name(prompts: str | None) -> str:
    """How the meta names the prompts file: its name (the shipped questions when None)."""
    return Path(prompts).name if prompts else DEFAULT_QUESTIONS.name


def write_heldout(data_dir: Path, held: Sequence[Question]) -> Path:
    """The questions training never sees, for ``draftwise bench --questions DIR/data/heldout.jsonl``."""
    rows = [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in held]
    return write_text_atomic(data_dir / "heldout.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def portable_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (of any distill version) without machine paths: for a pack that ships.

    >>> portable_meta({"target_folder": "/srv/cache/x/SmolLM2", "settings": {"prompts": "/srv/q.jsonl"},
    ...                "command": "draftwise distill --out /srv/runs/a"})
    {'target_folder': 'SmolLM2', 'settings': {'prompts': 'q.jsonl'}, 'command': 'draftwise distill --out a'}
    """
    meta = dict(meta)
    if isinstance(meta.get("target_folder"), str):
        meta["target_folder"] = _name_only(meta["target_folder"])
    if isinstance(meta.get("settings"), dict):
        meta["settings"] = {**meta["settings"], "prompts": prompts_name(meta["settings"].get("prompts"))}
    if isinstance(meta.get("command"), str):
        meta["command"] = portable_command(meta["command"])
    return meta


