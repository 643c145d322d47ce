"""Make a shipped draft pack from a ``draftwise distill`` output (see :mod:`draftwise.drafters.packs`,
which reads packs: a pack is the draft's trained layers only, about 28 MB for SmolLM2-135M where
the whole float32 folder is 170 MB)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from draftwise.distill.outputs import write_eval, write_meta
from draftwise.drafters.packs import (
    EMBEDDINGS,
    EXTRA_FILES,
    META_FILE,
    PACK_FORMAT,
    PACK_WEIGHTS,
)
from draftwise.errors import ConfigError
from draftwise.training.outputs import portable_meta

__all__ = ["PACK_WEIGHTS", "pack_draft"]


def pack_draft(draft_dir: str | Path, dest: str | Path, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the pack of the distilled draft in ``draft_dir`` to ``dest`` (created; must be empty).

    The pack's ``draftwise_draft.json`` and ``eval.json`` name files and folders, never a
    machine's paths (an older distill output's are cut to their names), since a pack ships.
    """
    from safetensors.torch import load_file, save_file

    src, out = Path(draft_dir), Path(dest)
    meta_path = src / META_FILE
    if not meta_path.is_file() or not (src / "model.safetensors").is_file():
        raise ConfigError(f"{src} is not a draftwise distill output (no {META_FILE} or model.safetensors)")
    meta = json.loads(meta_path.read_text())
    if meta.get("train_embeddings", True) or not meta.get("init_layers"):
        raise ConfigError(
            f"{src} trained its embeddings, so its layers alone do not describe it; only drafts "
            "distilled with frozen embeddings (the default when starting from the target's layers) pack"
        )
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / "model.safetensors"))
    kept = {name: t.to(dtype).contiguous() for name, t in state.items() if name not in EMBEDDINGS}
    save_file(kept, str(out / PACK_WEIGHTS), metadata={"format": PACK_FORMAT})
    shutil.copy(src / "config.json", out / "config.json")
    write_meta(out, portable_meta(meta))
    for name in EXTRA_FILES:
        if name == "eval.json" and (src / name).is_file():
            write_eval(out, json.loads((src / name).read_text(encoding="utf-8")), name=src.name)
        elif (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out
