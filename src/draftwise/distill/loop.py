"""The small draft's training loop: one KL step a batch, logged, checkpointed, stoppable.

Each step takes a batch of cached sequences (:func:`~draftwise.training.data.batch_indices`, a
pure function of the step, so a resumed run sees the batches it would have), scores them with
the target (no gradient) and the draft, and takes one AdamW step on KL(p_target || q_draft).
Stopping, resuming and the learning-rate schedule are :mod:`draftwise.training.loop`'s.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from draftwise.distill.student import draft_logits, kl_loss, teacher_logits
from draftwise.errors import ConfigError
from draftwise.training.checkpoint import save_snapshot
from draftwise.training.data import batch_indices, make_batch
from draftwise.training.loop import (
    GRAD_CLIP,
    RunProgress,
    StepLog,
    graceful_interrupt,
    lr_schedule,
)


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
