"""The output folder of a distillation run: claimed safely, filled with files that travel.

- The folder is distill's only when it carries distill's marker (:data:`draftwise.fsutil.MARKER`).
  ``--overwrite`` deletes nothing else, and ``--resume`` continues nothing else: a user's folder
  that merely holds a ``data/`` or ``checkpoints/`` folder is refused, by name.
- What ships with a draft (``draftwise_draft.json``, ``eval.json``, the packs made from them)
  holds no machine's path: the target and the prompts file by name, paths in the recorded
  command cut to their last part.
- Every JSON file is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..drafters.packs import META_FILE
from ..errors import ConfigError
from ..fsutil import (
    MARKER,
    check_output_dir,
    check_writable,
    claim_output_dir,
    is_owned_by,
    write_json_atomic,
    write_text_atomic,
)
from ..questions import DEFAULT_QUESTIONS, Question

COMMAND = "distill"


def check_out_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse, before any work, an ``--out`` this run may not use; touches nothing."""
    if resume and overwrite:
        raise ConfigError("pass --resume (continue the run in the folder) or --overwrite (start over), not both")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a folder")
    if resume:
        if not is_owned_by(out, COMMAND):
            raise ConfigError(
                f"nothing to resume in {out}: `draftwise distill` did not make it (no {MARKER} file); drop --resume"
            )
        return
    if not overwrite and is_owned_by(out, COMMAND) and any(p.name != MARKER for p in out.iterdir()):
        raise ConfigError(
            f"{out} holds an earlier distill run; pass --resume to continue it, --overwrite to replace it, or another --out"
        )
    check_output_dir(out, COMMAND, overwrite=overwrite, holds="a distill run")


def claim_out_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Make ``out`` this run's: on resume it already is; else empty it (only if distill made it) and mark it."""
    if resume:
        check_writable(out)
    else:
        claim_output_dir(out, COMMAND, overwrite=overwrite, holds="a distill run")


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


def write_meta(out: Path, meta: dict[str, Any]) -> Path:
    """``draftwise_draft.json``: one key a line, each value compact (the subset is thousands of ids)."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items())
    return write_text_atomic(out / META_FILE, "{\n" + body + "\n}\n")


def write_eval(out: Path, report: dict[str, Any], *, name: str | None = None) -> Path:
    """``eval.json``, the draft named by its folder's name (the full path is this machine's)."""
    return write_json_atomic(out / "eval.json", {**report, "draft": f"model:{name or out.name}"}, indent=1)


def save_draft_folder(out: Path, model: Any, target: Any) -> None:
    """The draft as an ordinary Hugging Face folder: weights, config, the target's tokenizer and
    generation config (so ``transformers`` can use it as ``assistant_model``)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its shard bar would garble ours
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()
    target.tokenizer.save_pretrained(out)
    gen_cfg = Path(target.folder) / "generation_config.json"
    if gen_cfg.is_file():
        shutil.copy(gen_cfg, out / "generation_config.json")
