"""The output folder of a distillation run: claimed safely (only a folder that carries distill's
marker, :data:`draftwise.fsutil.MARKER`, is overwritten or resumed), and the draft's files in it
(``draftwise_draft.json``, ``eval.json``), written atomically and without machine paths
(:mod:`draftwise.training.outputs`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from draftwise.drafters.packs import META_FILE
from draftwise.errors import ConfigError
from draftwise.fsutil import (
    MARKER,
    check_output_dir,
    check_writable,
    claim_output_dir,
    is_owned_by,
    write_json_atomic,
    write_text_atomic,
)


def write_meta(out: Path, meta: dict[str, Any]) -> Path:
    """``draftwise_draft.json``: one key a line, each value compact (the subset is thousands of ids)."""
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items())
    return write_text_atomic(out / META_FILE, "{\n" + body + "\n}\n")


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


def write_eval(out: Path, report: dict[str, Any], *, name: str | None = None) -> Path:
    """``eval.json``, the draft named by its folder's name (the full path is this machine's)."""
    return write_json_atomic(out / "eval.json", {**report, "draft": f"model:{name or out.name}"}, indent=1)
