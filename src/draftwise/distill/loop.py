"""The training loop of a distillation run: one KL step a batch, logged, checkpointed, stoppable.

Each step takes a batch of cached sequences (:func:`~draftwise.distill.data.batch_indices`, a
pure function of the step, so a resumed run sees the batches it would have), scores them with
the target (no gradient) and the draft, and takes one AdamW step on KL(p_target || q_draft).
The learning rate warms up linearly, then follows a cosine down to a tenth.

The loop stops after a step when ``on_step`` returns True, at the first Ctrl-C (a second one
aborts), or before a step that would overrun the time budget; it then writes a checkpoint, so
``--resume`` carries on exactly where it stopped: :func:`resume_from` loads the checkpoint and
:func:`start_log` cuts the log back to its step (``distill`` and ``train-head`` alike).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import ConfigError
from ..fsutil import write_text_atomic
from .checkpoint import save_snapshot
from .data import batch_indices, make_batch
from .student import draft_logits, kl_loss, teacher_logits

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


def train_loop(
    target: Any,
    model: Any,
    opt: Any,
    sequences: Sequence[Sequence[int]],
    settings: dict[str, Any],
    head_rows: torch.Tensor | None,
    steps: int,
    run: RunProgress,
    log: IO[str],
    *,
    time_budget: float | None,
    checkpoint_every: int,
    snapshot_every: int | None,
    checkpoint: Callable[[], None],
    ckpt_dir: Path,
    data_dir: Path,
    on_step: Callable[[StepLog], bool | None] | None,
) -> None:
    """Train from ``run.step`` to ``steps``, updating ``run``; stops early on a time budget,
    Ctrl-C or ``on_step`` returning True, always with a checkpoint of the last step."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    lr_at = lr_schedule(settings["lr"], steps)
    interrupted = [False]
    run_times: list[float] = []
    t_loop = time.perf_counter()
    with graceful_interrupt(interrupted):
        while run.step < steps:
            t0 = time.perf_counter()
            idx = batch_indices(run.step, settings["batch"], len(sequences), settings["seed"])
            ids, mask = make_batch([sequences[i] for i in idx], settings["seq_len"])  # [B, L] each
            lr_now = lr_at(run.step)
            for group in opt.param_groups:
                group["lr"] = lr_now
            with torch.no_grad():
                t_logits = teacher_logits(target.runtime, ids, mask, head_rows)  # [N, V']
            loss = kl_loss(draft_logits(model, ids, mask, head_rows), t_logits, settings["temperature"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, GRAD_CLIP))
            opt.step()
            dt = time.perf_counter() - t0
            if time_budget is not None and not run_times and dt > time_budget:
                raise ConfigError(
                    f"--time-budget {time_budget:g} s is too small: one training step took {dt:.1f} s here; "
                    f"pass at least {math.ceil(dt * 3)} s (the data stays cached in {data_dir}: "
                    "rerun with --resume)"
                )
            run_times.append(dt)
            run.step += 1
            n_tokens = int(mask.sum())
            run.tokens += n_tokens
            run.seconds += dt
            run.loss = loss.item()
            run.first_loss = run.loss if run.first_loss is None else run.first_loss
            entry = StepLog(run.step, steps, run.loss, lr_now, run.tokens, run.seconds, grad_norm, n_tokens / dt)
            log.write(json.dumps(entry.to_dict()) + "\n")
            log.flush()
            if on_step is not None and on_step(entry) is True:
                run.stopped = "callback"
            elif interrupted[0]:
                run.stopped = "interrupted"
            elif time_budget is not None and run.step < steps:
                mean = sum(run_times) / len(run_times)
                if time.perf_counter() - t_loop + mean > time_budget:
                    run.stopped = "time budget"
            ending = run.stopped != "completed" or run.step == steps
            if ending or run.step % checkpoint_every == 0:
                checkpoint()
            if snapshot_every and (ending or run.step % snapshot_every == 0):
                save_snapshot(ckpt_dir, model, step=run.step, seconds=run.seconds, tokens=run.tokens, loss=run.loss)
            if run.stopped != "completed":
                break
