"""What every training loop shares: the progress of a run, its log, its learning-rate schedule
(a linear warm-up, then a cosine down to a tenth), and how it stops and resumes.

A loop stops after a step when ``on_step`` returns True, at the first Ctrl-C (a second one
aborts), or before a step that would overrun the time budget; it then writes a checkpoint, so
``--resume`` carries on exactly where it stopped: :func:`resume_from` loads the checkpoint and
:func:`start_log` cuts the log back to its step (``distill`` and ``train-head`` alike).
"""

from __future__ import annotations

import json
import math
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.fsutil import write_text_atomic

GRAD_CLIP = 1.0


@dataclass
class StepLog:
    """One training step, as written to ``train_log.jsonl`` (``seconds``: cumulative)."""

    step: int
    steps: int
    loss: float
    lr: float
    tokens: int
    seconds: float
    grad_norm: float
    tokens_per_second: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "loss": self.loss, "lr": self.lr, "tokens": self.tokens,
            "seconds": round(self.seconds, 3), "grad_norm": self.grad_norm,
            "tokens_per_second": round(self.tokens_per_second, 1),
        }


@dataclass
class RunProgress:
    """The loop's running totals (kept in the checkpoint, so a resumed run carries on)."""

    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    first_loss: float | None = None
    loss: float | None = None
    stopped: str = "completed"


def resume_from(ckpt: dict[str, Any] | None, model: Any, opt: Any) -> RunProgress:
    """Load a checkpoint's weights, optimizer and RNG into ``model`` and ``opt``, and return its
    totals; a fresh :class:`RunProgress` when there is no checkpoint (``ckpt`` None)."""
    if ckpt is None:
        return RunProgress()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"])
    return RunProgress(ckpt["step"], ckpt.get("tokens", 0), ckpt.get("seconds", 0.0), ckpt.get("first_loss"))


def kept_log(path: Path, step: int) -> str:
    """The training log's lines up to ``step`` (a resumed run rewrites the steps after it).

    A line cut short by a kill, or one without a step, is dropped.
    """
    if not path.exists():
        return ""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return "".join(kept)


def start_log(path: Path, step: int, *, resumed: bool) -> None:
    """Make the log at ``path`` hold exactly the steps the run starts from: empty for a new run,
    the checkpoint's steps (``<= step``) for a resumed one."""
    write_text_atomic(path, kept_log(path, step) if resumed else "")


@contextmanager
def graceful_interrupt(flag: list[bool]) -> Iterator[None]:
    """The first Ctrl-C sets ``flag[0]`` (the loop stops after its step); a second aborts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if flag[0]:
            raise KeyboardInterrupt
        flag[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def lr_schedule(base_lr: float, steps: int) -> Callable[[int], float]:
    """Linear warm-up over ``min(20, steps / 10)`` steps, then cosine down to a tenth.

    >>> lr = lr_schedule(1.0, 100)
    >>> lr(0), lr(9), round(lr(99), 3)
    (0.1, 1.0, 0.1)
    """
    warmup = min(20, max(1, steps // 10))

    def lr_at(s: int) -> float:
        if s < warmup:
            return base_lr * (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    return lr_at


