"""The distillation run: check the options, make the data, train, save, evaluate.

Files under the output folder ``DIR``:

=========================  =================================================================
``config.json``,           the draft, an ordinary Hugging Face folder (full vocabulary), so
``model.safetensors``,     ``transformers`` can load it and use it as ``assistant_model``
tokenizer files,
``generation_config.json``
``draftwise_draft.json``   how it was made: target, shape, init layers, ``vocab_subset``
                           (the reduced head's token ids, or null), steps, command
``data/sequences.jsonl``   the target's continuations of the training prompts (a cache)
``data/heldout.jsonl``     the questions held out of training, to evaluate on
``checkpoints/step-N.pt``  with ``snapshot_every``: the trained weights every N steps
``checkpoints/last.pt``    model + optimizer + step + RNG, rewritten every M steps and at the
                           end (``last.json`` holds its settings and step, for ``--resume``)
``train_log.jsonl``        one line per step: step, loss, lr, tokens, seconds, grad_norm
``eval.json``              :func:`~draftwise.distill.evaluate.evaluate_draft` on held-out prompts
=========================  =================================================================

``time_budget`` bounds the training loop (not the one-off data generation, nor the final
evaluation): the run stops before a step that would overrun it, saving a checkpoint and the
model. The first Ctrl-C does the same; a second one aborts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .data import (
    batch_indices,
    frequent_tokens,
    make_batch,
    make_sequences,
    ordered_prompts,
    split_questions,
)
from .evaluate import EvalReport, evaluate_draft
from .student import build_draft, draft_logits, evenly_spaced_layers, kl_loss, teacher_logits

if TYPE_CHECKING:
    from ..loaders import Model

META_FILE = "draftwise_draft.json"
#: options that define a run; ``--resume`` keeps the checkpoint's values and refuses others
_DEFAULTS: dict[str, Any] = {
    "batch": 4,
    "seq_len": 256,
    "lr": 3e-4,
    "temperature": 1.0,
    "seed": 0,
    "gen_tokens": 128,
    "gen_temperatures": [0.0],
    "train_embeddings": False,
}
DEFAULT_STEPS = 300
GRAD_CLIP = 1.0
_OUTPUT_MARKERS = (META_FILE, "checkpoints", "data", "train_log.jsonl")


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
class DistillResult:
    """What :func:`distill` made. ``stopped``: completed, time budget, interrupted or callback."""

    out_dir: Path
    steps: int
    planned_steps: int
    first_loss: float | None
    loss: float | None
    tokens: int
    train_seconds: float
    data_seconds: float
    stopped: str
    layers: int
    init_layers: list[int] | None
    hidden_size: int
    vocab_subset_size: int | None
    train_sequences: int
    eval: EvalReport | None = None


def _check_number(name: str, value: Any, *, minimum: float, integer: bool, strict: bool = False) -> None:
    if value is None:
        return
    kind = int if integer else (int, float)
    bad = isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value)
    if bad or value < minimum or (strict and value == minimum):
        rel = ">" if strict else ">="
        what = "an integer" if integer else "a number"
        raise ConfigError(f"{name}={value!r} must be {what} {rel} {minimum}")


def default_layers(target_layers: int) -> int:
    """4 layers, or half the target's when it has fewer than 8 (at least 1)."""
    return max(1, min(4, target_layers // 2))


def _looks_like_output(folder: Path) -> bool:
    return any((folder / name).exists() for name in _OUTPUT_MARKERS)


@contextmanager
def _graceful_interrupt(flag: list[bool]) -> Iterator[None]:
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


def _resolve_settings(explicit: dict[str, Any], saved: dict[str, Any] | None) -> dict[str, Any]:
    """Explicit values, else the checkpoint's (on resume), else the defaults."""
    out: dict[str, Any] = {}
    for key, value in explicit.items():
        if saved is not None and key in saved:
            if value is not None and value != saved[key]:
                flag = "--" + key.replace("_", "-")
                raise ConfigError(
                    f"{flag} {value} differs from the checkpoint's {saved[key]}; drop {flag} to "
                    "resume that run, or start a new one with --overwrite"
                )
            out[key] = saved[key]
        else:
            out[key] = value if value is not None else _DEFAULTS.get(key)
    return out


def _save_checkpoint(folder: Path, model: Any, opt: Any, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), **state,
    }
    tmp = folder / "last.pt.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, folder / "last.pt")  # atomic: an interruption never leaves half a checkpoint
    (folder / "last.json").write_text(json.dumps({k: v for k, v in state.items() if k != "vocab_subset"}, indent=1))


def _save_snapshot(folder: Path, model: Any, *, step: int, seconds: float, tokens: int, loss: float | None) -> None:
    """The trained weights at this step (embeddings and head only when they are trained), for
    the acceptance-against-training-time curve: ``checkpoints/step-000100.pt``."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    payload = {"weights": weights, "step": step, "seconds": seconds, "tokens": tokens, "loss": loss}
    tmp = folder / f"step-{step:06d}.pt.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, folder / f"step-{step:06d}.pt")


def distill(
    target: Model | str | Path,
    out_dir: str | Path,
    *,
    layers: int | None = None,
    init_layers: Sequence[int] | None = None,
    hidden_size: int | None = None,
    vocab_size_draft: int | None = None,
    steps: int | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    lr: float | None = None,
    temperature: float | None = None,
    time_budget: float | None = None,
    seed: int | None = None,
    prompts: str | Path | None = None,
    gen_tokens: int | None = None,
    gen_temperatures: Sequence[float] | None = None,
    train_embeddings: bool | None = None,
    checkpoint_every: int = 50,
    snapshot_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    eval_prompts: int = 8,
    eval_k: int = 4,
    eval_max_new_tokens: int = 128,
    command: str | None = None,
    on_status: Callable[[str], None] | None = None,
    on_generate: Callable[[int, int], None] | None = None,
    on_step: Callable[[StepLog], bool | None] | None = None,
    on_evaluate: Callable[[int, int], None] | None = None,
) -> DistillResult:
    """Train a small draft for ``target`` by self-distillation and save it to ``out_dir``.

    The draft has ``layers`` layers (default 4), started from the target's layers
    ``init_layers`` (default: evenly spaced, first and last included) and its embeddings,
    final norm and head; with ``hidden_size`` other than the target's it starts random.
    ``vocab_size_draft=N`` keeps only the N most frequent tokens in the draft's head (the
    folder still holds the full head; draftwise computes the N rows only). Started from the
    target's layers, the embeddings and head stay frozen at the target's unless
    ``train_embeddings=True``; such a draft can be packed (:func:`~draftwise.distill.pack_draft`).
    ``gen_temperatures`` makes one continuation per prompt per entry (0 = greedy), e.g.
    ``[0, 0.7, 0.7]`` triples the data. ``snapshot_every=N`` keeps the trained weights every
    N steps (``checkpoints/step-N.pt``) for a curve against training time. Options left at
    None take their defaults (batch 4, seq_len 256, lr 3e-4, temperature 1, seed 0,
    gen_tokens 128, one greedy continuation, frozen embeddings) or, with ``resume=True``, the
    checkpoint's values. ``on_step`` is called after every step; returning True stops the run
    cleanly.

    Example::

        from draftwise import load_model
        from draftwise.distill import distill
        result = distill(load_model("default"), "drafts/smol4", layers=4, steps=300,
                         vocab_size_draft=8192, time_budget=3600)
        result.eval.acceptance, result.eval.speedup
        # then: draftwise generate "..." --draft model:drafts/smol4
    """
    from ..bench.runtime import DEFAULT_QUESTIONS, load_questions
    from ..loaders import load_model

    status = on_status or (lambda message: None)
    for name, value, minimum, integer, strict in (
        ("layers", layers, 1, True, False),
        ("hidden_size", hidden_size, 1, True, False),
        ("vocab_size_draft", vocab_size_draft, 1, True, False),
        ("steps", steps, 1, True, False),
        ("batch", batch, 1, True, False),
        ("seq_len", seq_len, 2, True, False),
        ("lr", lr, 0, False, True),
        ("temperature", temperature, 0, False, True),
        ("time_budget", time_budget, 0, False, True),
        ("seed", seed, 0, True, False),
        ("gen_tokens", gen_tokens, 1, True, False),
        ("checkpoint_every", checkpoint_every, 1, True, False),
        ("snapshot_every", snapshot_every, 1, True, False),
        ("eval_prompts", eval_prompts, 0, True, False),
        ("eval_k", eval_k, 1, True, False),
        ("eval_max_new_tokens", eval_max_new_tokens, 1, True, False),
    ):
        _check_number(name, value, minimum=minimum, integer=integer, strict=strict)
    if gen_temperatures is not None:
        gen_temperatures = [float(t) for t in gen_temperatures]
        if not gen_temperatures:
            raise ConfigError("gen_temperatures is empty; give at least one (0 = greedy)")
        for t in gen_temperatures:
            _check_number("gen_temperatures", t, minimum=0, integer=False)
    if resume and overwrite:
        raise ConfigError("pass --resume (continue the run in the folder) or --overwrite (start over), not both")

    if isinstance(target, (str, Path)):
        status(f"loading target {target}")
        target = load_model(target)
    from ..runtime.native import SUPPORTED_MODEL_TYPES

    if getattr(target.config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"distill builds drafts of the Llama family ({', '.join(SUPPORTED_MODEL_TYPES)}); "
            f"target {target.name!r} is a {getattr(target.config, 'model_type', None)!r} model"
        )

    # -- the output folder: decide, but touch nothing until every option is checked ------------
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a folder")
    non_empty = out.is_dir() and any(out.iterdir())
    saved: dict[str, Any] | None = None  # the checkpoint's settings, when resuming one
    saved_state: dict[str, Any] = {}
    ckpt_dir = out / "checkpoints"
    if resume:
        if not non_empty or not _looks_like_output(out):
            raise ConfigError(f"nothing to resume in {out}: it holds no distill run; drop --resume")
        if (ckpt_dir / "last.json").is_file() and (ckpt_dir / "last.pt").is_file():
            saved_state = json.loads((ckpt_dir / "last.json").read_text())
            saved = saved_state["settings"]
    elif non_empty and not overwrite:
        raise ConfigError(f"output folder {out} exists and is not empty; pass --overwrite to replace it or --resume to continue it")
    elif non_empty and not _looks_like_output(out):
        raise ConfigError(
            f"--overwrite refuses to delete {out}: it does not look like a distill output "
            f"(none of {', '.join(_OUTPUT_MARKERS)}); pass an empty or new folder"
        )

    # -- the draft's shape ----------------------------------------------------------------------
    n_target = target.runtime.num_layers
    t_hidden = int(target.config.hidden_size)
    t_vocab = int(target.runtime.vocab_size)
    init_list = None if init_layers is None else [int(i) for i in init_layers]
    if saved is not None:
        if saved["target"] != target.name:
            raise ConfigError(f"the checkpoint in {out} distils {saved['target']!r}, not {target.name!r}")
        if layers is not None and layers != saved["layers"]:
            raise ConfigError(f"--layers {layers} differs from the checkpoint's {saved['layers']}; drop it to resume")
        if init_list is not None and init_list != saved["init_layers"]:
            raise ConfigError(f"--init-layers {init_list} differs from the checkpoint's {saved['init_layers']}")
        if hidden_size is not None and hidden_size != saved["hidden_size"]:
            raise ConfigError(f"--hidden-size {hidden_size} differs from the checkpoint's {saved['hidden_size']}")
        if vocab_size_draft is not None and vocab_size_draft != saved["vocab_size_draft"]:
            raise ConfigError(f"--vocab-size-draft {vocab_size_draft} differs from the checkpoint's {saved['vocab_size_draft']}")
        n_layers, init_list = saved["layers"], saved["init_layers"]
        d_hidden, vocab_size_draft = saved["hidden_size"], saved["vocab_size_draft"]
    else:
        if init_list is not None and layers is not None and len(init_list) != layers:
            raise ConfigError(f"--init-layers lists {len(init_list)} layers but --layers is {layers}; give one per draft layer")
        n_layers = layers if layers is not None else (len(init_list) if init_list else default_layers(n_target))
        if n_layers > n_target:
            raise ConfigError(f"--layers {n_layers} is more than the target's {n_target} layers; a draft must be smaller")
        d_hidden = hidden_size if hidden_size is not None else t_hidden
        if d_hidden != t_hidden:
            if init_list is not None:
                raise ConfigError(
                    f"--init-layers needs the target's hidden size ({t_hidden}); with --hidden-size "
                    f"{d_hidden} the draft starts random: drop one of them"
                )
        else:
            if init_list is None:
                init_list = evenly_spaced_layers(n_layers, n_target)
            bad = [i for i in init_list if not 0 <= i < n_target]
            if bad:
                raise ConfigError(f"--init-layers {bad} out of range: the target has layers 0..{n_target - 1}")
        if vocab_size_draft is not None and vocab_size_draft > t_vocab:
            raise ConfigError(f"--vocab-size-draft {vocab_size_draft} is larger than the target's vocabulary ({t_vocab})")
        if vocab_size_draft == t_vocab:
            vocab_size_draft = None  # the full head: nothing to reduce
    if d_hidden != t_hidden:
        from .student import draft_config

        draft_config(target.config, n_layers, hidden_size=d_hidden)  # raises on a bad hidden size

    prompts_path = str(Path(prompts).expanduser().resolve()) if prompts is not None else None
    settings = _resolve_settings(
        {
            "batch": batch, "seq_len": seq_len, "lr": lr, "temperature": temperature, "seed": seed,
            "prompts": prompts_path, "gen_tokens": gen_tokens, "gen_temperatures": gen_temperatures,
            "train_embeddings": train_embeddings,
        },
        saved,
    )
    settings["prompts"] = settings["prompts"] or str(DEFAULT_QUESTIONS)
    if settings["seq_len"] > target.runtime.max_context:
        raise ConfigError(f"--seq-len {settings['seq_len']} exceeds the target's context ({target.runtime.max_context})")
    steps = steps if steps is not None else saved_state.get("planned_steps", DEFAULT_STEPS)
    assert steps is not None
    rows = load_questions(settings["prompts"])
    train_rows, held_rows = split_questions(rows)
    if not train_rows:
        raise ConfigError(f"{settings['prompts']} leaves no training prompts after the hold-out split; give it more questions")

    # -- from here on, the folder is ours ---------------------------------------------------------
    if overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"

    temps = settings["gen_temperatures"]
    n_prompts = saved_state["num_prompts"] if saved else min(len(train_rows), steps * settings["batch"])
    train_prompts = ordered_prompts(train_rows)[:n_prompts]
    status(
        f"making training data: {n_prompts} prompts x {len(temps)} target continuations "
        f"(temperatures {', '.join(f'{t:g}' for t in temps)}) of up to {settings['gen_tokens']} tokens "
        f"(cached in {out / 'data'})"
    )
    t_data = time.perf_counter()
    sequences = make_sequences(
        target, train_prompts, out / "data", gen_tokens=settings["gen_tokens"],
        gen_temperatures=temps, seed=settings["seed"], on_progress=on_generate,
    )
    n_seq = len(sequences)
    data_seconds = time.perf_counter() - t_data
    # the questions training never sees, for `draftwise bench --questions DIR/data/heldout.jsonl`
    (out / "data" / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_rows))

    vocab_subset: list[int] | None = None
    ckpt: dict[str, Any] | None = None
    if saved is not None:
        status(f"resuming from {ckpt_dir / 'last.pt'}")
        ckpt = torch.load(ckpt_dir / "last.pt", weights_only=False)
        vocab_subset = ckpt["vocab_subset"]
    elif vocab_size_draft is not None:
        vocab_subset = frequent_tokens(sequences, vocab_size_draft, t_vocab, sorted(target.eos_token_ids))
    head_rows = torch.tensor(vocab_subset, dtype=torch.long) if vocab_subset else None

    frozen = init_list is not None and not settings["train_embeddings"]
    model = build_draft(
        target, n_layers, init_layers=init_list, hidden_size=d_hidden, seed=settings["seed"], freeze_embeddings=frozen
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    step, tokens, train_seconds, first_loss = 0, 0, 0.0, None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        step, tokens, train_seconds, first_loss = ckpt["step"], ckpt["tokens"], ckpt["seconds"], ckpt["first_loss"]
        del ckpt
    # the log holds exactly the steps the checkpoint reached
    kept_lines = []
    if log_path.exists() and saved is not None:
        kept_lines = [ln for ln in log_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
    log_path.write_text("".join(ln + "\n" for ln in kept_lines))

    full_settings = {
        "target": target.name, "layers": n_layers, "init_layers": init_list, "hidden_size": d_hidden,
        "vocab_size_draft": vocab_size_draft, **settings,
    }
    warmup = min(20, max(1, steps // 10))
    base_lr = settings["lr"]

    def lr_at(s: int) -> float:  # linear warm-up, then cosine down to a tenth
        if s < warmup:
            return base_lr * (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    def checkpoint() -> None:
        _save_checkpoint(
            ckpt_dir, model, opt,
            {
                "step": step, "planned_steps": steps, "tokens": tokens, "seconds": train_seconds,
                "first_loss": first_loss, "num_prompts": n_prompts, "settings": full_settings,
                "vocab_subset": vocab_subset,
            },
        )

    stopped, loss_value = "completed", None
    interrupted = [False]
    run_times: list[float] = []
    t_loop = time.perf_counter()
    status(f"training: steps {step + 1}..{steps}, batch {settings['batch']} x {settings['seq_len']} tokens")
    with _graceful_interrupt(interrupted), log_path.open("a") as log:
        while step < steps:
            t0 = time.perf_counter()
            idx = batch_indices(step, settings["batch"], n_seq, settings["seed"])
            ids, mask = make_batch([sequences[i] for i in idx], settings["seq_len"])  # [B, L] each
            lr_now = lr_at(step)
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
                    f"pass at least {math.ceil(dt * 3)} s (the data stays cached in {out / 'data'}: "
                    "rerun with --resume)"
                )
            run_times.append(dt)
            step += 1
            n_tokens = int(mask.sum())
            tokens += n_tokens
            train_seconds += dt
            loss_value = loss.item()
            first_loss = loss_value if first_loss is None else first_loss
            entry = StepLog(step, steps, loss_value, lr_now, tokens, train_seconds, grad_norm, n_tokens / dt)
            log.write(json.dumps(entry.to_dict()) + "\n")
            log.flush()
            if on_step is not None and on_step(entry) is True:
                stopped = "callback"
            elif interrupted[0]:
                stopped = "interrupted"
            elif time_budget is not None and step < steps:
                mean = sum(run_times) / len(run_times)
                if time.perf_counter() - t_loop + mean > time_budget:
                    stopped = "time budget"
            if stopped != "completed" or step % checkpoint_every == 0 or step == steps:
                checkpoint()
            if snapshot_every and (step % snapshot_every == 0 or stopped != "completed" or step == steps):
                _save_snapshot(ckpt_dir, model, step=step, seconds=train_seconds, tokens=tokens, loss=loss_value)
            if stopped != "completed":
                break

    # -- the draft folder -------------------------------------------------------------------------
    status(f"saving the draft to {out}")
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
    meta = {
        "format": 1,
        "kind": "distilled",
        "target": target.name,
        "target_folder": str(target.folder),
        "layers": n_layers,
        "hidden_size": d_hidden,
        "init_layers": init_list,
        "vocab_size_draft": len(vocab_subset) if vocab_subset else None,
        "vocab_subset": vocab_subset,
        "steps": step,
        "planned_steps": steps,
        "tokens": tokens,
        "train_seconds": round(train_seconds, 2),
        "first_loss": first_loss,
        "final_loss": loss_value,
        "stopped": stopped,
        "train_prompts": n_prompts,
        "train_sequences": n_seq,
        "train_embeddings": not frozen,
        "split": "per category, file order: positions 3, 7, 11, ... held out, the rest train",
        "settings": full_settings,
        "command": command,
    }
    # one key a line, each value compact (the subset is thousands of ids)
    (out / META_FILE).write_text("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items()) + "\n}\n")

    report = None
    if eval_prompts > 0:
        held = [p.text for p in ordered_prompts(held_rows)[:eval_prompts]]
        if held:
            status(f"evaluating on {len(held)} held-out prompts (k={eval_k})")
            report = evaluate_draft(target, out, held, max_new_tokens=eval_max_new_tokens, k=eval_k, on_progress=on_evaluate)
            (out / "eval.json").write_text(json.dumps(report.to_dict(), indent=1))
        else:
            status("no held-out prompts to evaluate on")
    return DistillResult(
        out_dir=out, steps=step, planned_steps=steps, first_loss=first_loss, loss=loss_value, tokens=tokens,
        train_seconds=train_seconds, data_seconds=data_seconds, stopped=stopped, layers=n_layers,
        init_layers=init_list, hidden_size=d_hidden,
        vocab_subset_size=len(vocab_subset) if vocab_subset else None, train_sequences=n_seq, eval=report,
    )
