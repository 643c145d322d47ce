"""A draft head's files: ``eagle_head.safetensors`` and ``draftwise_head.json``, and the fingerprint
of the target it was trained for.

``eagle_head.safetensors`` holds the head's tensors (fp32 or bf16, plus ``draft_tokens`` for a
reduced vocabulary); ``draftwise_head.json`` its shape (:class:`~.eagle_head.HeadConfig`, with
the arch), the target's name, fingerprint, hidden size and vocabulary, and how it was trained.
Loading refuses, one line each, a missing or damaged file, weights that do not fit the config and
a head made for another target.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.head import EagleHead, HeadConfig
from draftwise.errors import ConfigError

HEAD_FORMAT = "draftwise-eagle-head-1"
HEAD_WEIGHTS = "eagle_head.safetensors"
HEAD_META = "draftwise_head.json"


def target_fingerprint(tokenizer: Any, hidden_size: int, vocab_size: int) -> str:
    """A short hash of what a head depends on: the tokenizer's id -> string map, the hidden
    size and the head width. A head trained for another target has another fingerprint."""
    h = hashlib.sha256()
    for piece, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{piece}\n".encode("utf-8", "surrogatepass"))
    h.update(f"hidden={hidden_size};vocab={vocab_size}".encode())
    return h.hexdigest()[:16]


@dataclass
class LoadedHead:
    head: EagleHead
    draft_tokens: torch.Tensor | None  # [V'] the target's head rows the head scores; None: all
    meta: dict[str, Any]


def save_head(
    folder: str | Path,
    head: EagleHead,
    *,
    draft_tokens: Sequence[int] | torch.Tensor | None,
    target: dict[str, Any],
    extra: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write ``folder/eagle_head.safetensors`` and ``folder/draftwise_head.json``. ``target``
    holds at least ``fingerprint``, ``hidden_size`` and ``vocab_size`` (and the model's name)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    if draft_tokens is not None:
        tensors["draft_tokens"] = torch.as_tensor(draft_tokens, dtype=torch.long).contiguous()
    save_file(tensors, str(folder / HEAD_WEIGHTS))
    meta = {"format": HEAD_FORMAT, "config": asdict(head.cfg), "target": dict(target), **(extra or {})}
    meta["draft_vocab_size"] = int(len(draft_tokens)) if draft_tokens is not None else int(target["vocab_size"])
    (folder / HEAD_META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return folder


def load_head(folder: str | Path, *, fingerprint: str | None = None) -> LoadedHead:
    """Read a head folder, refusing (one line each) a missing or damaged file and a head made
    for another target (``fingerprint``: the target's, from :func:`target_fingerprint`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, weights_path = folder / HEAD_META, folder / HEAD_WEIGHTS
    if not folder.is_dir():
        raise ConfigError(f"no draft head at {folder}: expected a folder with {HEAD_META} and {HEAD_WEIGHTS}")
    for path in (meta_path, weights_path):
        if not path.is_file():
            raise ConfigError(f"the draft head {folder} lacks {path.name}; train one with `draftwise train-head`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != HEAD_FORMAT:
            raise ValueError(f"format is not {HEAD_FORMAT}")
        cfg = HeadConfig.from_dict(meta["config"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the draft head's {meta_path.name} is damaged ({exc})") from None
    theirs = (meta.get("target") or {}).get("fingerprint")
    if fingerprint is not None and theirs != fingerprint:
        name = (meta.get("target") or {}).get("name", "another model")
        raise ConfigError(
            f"the draft head in {folder} was trained for {name} (fingerprint {theirs}), not this target "
            f"({fingerprint}): its tokenizer or hidden size differ; train one with `draftwise train-head`"
        )
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"the draft head's {weights_path.name} is damaged ({str(exc)[:120]})") from None
    draft_tokens = tensors.pop("draft_tokens", None)
    head = EagleHead(cfg)
    try:
        head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"the draft head's weights do not fit its config ({str(exc).splitlines()[0][:160]})") from None
    head.eval().requires_grad_(False)
    if draft_tokens is not None:
        vocab = int((meta.get("target") or {}).get("vocab_size", 0)) or math.inf
        if draft_tokens.ndim != 1 or int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= vocab:
            raise ConfigError("the draft head's draft_tokens are not token ids of its target")
    return LoadedHead(head, draft_tokens, meta)
