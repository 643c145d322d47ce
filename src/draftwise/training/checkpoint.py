"""Checkpoints and snapshots of a distillation run, written atomically and read safely.

- ``checkpoints/last.pt``: model + optimizer + step + RNG + the run's settings, rewritten every
  ``checkpoint_every`` steps and at the end; ``last.json`` beside it repeats the state (not the
  weights) for people and scripts.
- ``checkpoints/step-000100.pt``: with ``snapshot_every``, the trained weights at that step, for
  a curve of acceptance against training time.

Both hold only tensors, dicts, lists, tuples, numbers, strings, booleans and None, and are read
with ``torch.load(weights_only=True)``: a ``.pt`` file is a pickle, and a crafted one read
without that restriction runs any code it likes. A file that needs more is refused.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import ConfigError
from draftwise.fsutil import atomic_path, write_json_atomic

LAST = "last.pt"
LAST_JSON = "last.json"
#: what a checkpoint must hold to resume from it
_CHECKPOINT_KEYS = ("model", "optimizer", "rng", "step", "planned_steps", "tokens", "seconds", "settings")


def snapshot_path(folder: Path, step: int) -> Path:
    """``folder / "step-000100.pt"`` for step 100."""
    return folder / f"step-{step:06d}.pt"


def save_checkpoint(folder: Path, model: Any, opt: Any, state: dict[str, Any]) -> None:
    """``last.pt`` (weights, optimizer, RNG and ``state``) and ``last.json`` (``state`` without the
    reduced head's ids), each replaced atomically: an interruption never leaves half a file."""
    payload = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), **state}
    with atomic_path(folder / LAST) as tmp:
        torch.save(payload, tmp)
    write_json_atomic(folder / LAST_JSON, {k: v for k, v in state.items() if k != "vocab_subset"}, indent=1)


def save_snapshot(folder: Path, model: Any, *, step: int, seconds: float, tokens: int, loss: float | None) -> None:
    """The trained weights at this step (embeddings and head only when they are trained)."""
    weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    payload = {"weights": weights, "step": step, "seconds": seconds, "tokens": tokens, "loss": loss}
    with atomic_path(snapshot_path(folder, step)) as tmp:
        torch.save(payload, tmp)


def load_safely(path: Path, what: str) -> dict[str, Any]:
    """``path`` read with ``torch.load(weights_only=True)``: plain data only, never code.

    A file that is not such a dict (a crafted pickle, a truncated or foreign file) is refused
    with one line naming it.
    """
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ConfigError(
            f"{path} is not a {what} draftwise can load safely ({reason}); delete it, or start over with --overwrite"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a {what} (it holds a {type(data).__name__}); delete it")
    return data


def load_checkpoint(folder: Path) -> dict[str, Any] | None:
    """The checkpoint in ``folder`` (``last.pt``), or None when there is none."""
    path = folder / LAST
    if not path.is_file():
        return None
    ckpt = load_safely(path, "distill checkpoint")
    missing = [key for key in _CHECKPOINT_KEYS if key not in ckpt]
    if missing or not isinstance(ckpt["settings"], dict):
        raise ConfigError(f"{path} lacks {', '.join(missing) or 'settings'}; it is not a distill checkpoint: delete it")
    return ckpt


def load_snapshot(folder: Path, step: int) -> dict[str, Any]:
    """The snapshot of ``step`` in ``folder``: ``weights``, ``step``, ``seconds``, ``tokens``, ``loss``."""
    path = snapshot_path(folder, step)
    snap = load_safely(path, "distill snapshot")
    if not isinstance(snap.get("weights"), dict):
        raise ConfigError(f"{path} holds no 'weights'; it is not a distill snapshot")
    return snap
