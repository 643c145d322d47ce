"""Shipped draft packs: a distilled draft's trained layers, rebuilt into a folder on first use.

A draft trained with frozen embeddings (``draftwise distill``'s default when it starts from the
target's layers) differs from the target only in its layers and final norm. Its embeddings and
head *are* the target's, so a **pack** keeps just the trained weights, in bfloat16, with the
config, ``draftwise_draft.json`` (command, settings, reduced head) and the training log.

:func:`unpack_draft` rebuilds an ordinary Hugging Face folder from a pack and the target:
trained weights (as float32) + the target's embeddings + its tokenizer files. Packs for
built-in models ship inside the package (``draftwise/drafts/<converted folder name>/``);
``--draft model:default`` unpacks the one for the current target into the user cache once.
Making a pack is :func:`draftwise.distill.pack.pack_draft`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import ConfigError
from draftwise.runtime.loaders import cache_dir
from draftwise.runtime.native import load_state_dict

PACK_WEIGHTS = "layers.safetensors"
PACK_FORMAT = "draftwise-draft-pack-1"
META_FILE = "draftwise_draft.json"
#: the packs that ship with draftwise, one folder per target (named like its converted folder)
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "drafts"
EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")
EXTRA_FILES = ("train_log.jsonl", "eval.json", "generation_config.json")


def unpack_draft(pack_dir: str | Path, target: Any, dest: str | Path) -> Path:
    """An ordinary HF draft folder at ``dest`` from the pack and ``target`` (a ``draftwise.Model``)."""
    from safetensors.torch import load_file, save_file

    pack, out = Path(pack_dir), Path(dest)
    if not (pack / PACK_WEIGHTS).is_file():
        raise ConfigError(f"{pack} is not a draft pack (no {PACK_WEIGHTS})")
    meta = json.loads((pack / META_FILE).read_text())
    config = json.loads((pack / "config.json").read_text())
    if int(config.get("vocab_size", -1)) != int(target.runtime.vocab_size):
        raise ConfigError(f"the pack in {pack} was made for {meta.get('target')!r}, whose vocabulary differs from {target.name!r}'s")
    weights = {name: t.to(torch.float32) for name, t in load_file(str(pack / PACK_WEIGHTS)).items()}
    source = load_state_dict(target.folder)
    embed = source["model.embed_tokens.weight"].to(torch.float32)
    weights["model.embed_tokens.weight"] = embed
    if not config.get("tie_word_embeddings", False):
        weights["lm_head.weight"] = source.get("lm_head.weight", embed).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", META_FILE, *EXTRA_FILES):
        if (pack / name).is_file():
            shutil.copy(pack / name, out / name)
    target.tokenizer.save_pretrained(out)
    return out


def shipped_pack(target: Any) -> Path | None:
    """The pack that ships for ``target`` (keyed by its converted folder's name), if any."""
    folder = SHIPPED_DIR / Path(target.folder).name
    return folder if (folder / PACK_WEIGHTS).is_file() else None


def default_draft_folder(target: Any) -> Path:
    """The shipped draft for ``target`` as a HF folder in the user cache (unpacked once)."""
    pack = shipped_pack(target)
    if pack is None:
        shipped = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) if SHIPPED_DIR.is_dir() else []
        raise ConfigError(
            f"no distilled draft ships for {target.name!r} (drafts ship for: {', '.join(shipped) or 'none'}); "
            "train one with `draftwise distill --target ... --out DIR` and pass --draft model:DIR"
        )
    digest = hashlib.sha256((pack / PACK_WEIGHTS).read_bytes()).hexdigest()[:16]
    folder = cache_dir() / "drafts" / f"{pack.name}-{digest}"
    if (folder / "model.safetensors").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=folder.parent))
    try:
        unpack_draft(pack, target, tmp)
        try:
            os.replace(tmp, folder)  # atomic; a concurrent unpack that won leaves its folder
        except OSError:
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
