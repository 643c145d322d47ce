"""The distillation run: check the options, make the data, train, save, evaluate.

Files under the output folder ``DIR``:

=========================  =================================================================
``.draftwise-output``      distill's marker: ``--overwrite`` deletes, and ``--resume``
                           continues, only a folder that carries it
``config.json``,           the draft, an ordinary Hugging Face folder (full vocabulary), so
``model.safetensors``,     ``transformers`` can load it and use it as ``assistant_model``
tokenizer files,
``generation_config.json``
``draftwise_draft.json``   how it was made: target, shape, init layers, ``vocab_subset``
                           (the reduced head's token ids, or null), steps, command (no
                           machine's paths: it ships with the draft)
``data/sequences.jsonl``   the target's continuations of the training prompts (a cache)
``data/heldout.jsonl``     the questions held out of training, to evaluate on
``checkpoints/step-N.pt``  with ``snapshot_every``: the trained weights every N steps
``checkpoints/last.pt``    model + optimizer + step + RNG, rewritten every M steps and at the
                           end (``last.json`` holds its settings and step), for ``--resume``
``train_log.jsonl``        one line per step: step, loss, lr, tokens, seconds, grad_norm
``eval.json``              :func:`~draftwise.distill.evaluate.evaluate_draft` on held-out prompts
=========================  =================================================================

``time_budget`` bounds the training loop (not the one-off data generation, nor the final
evaluation): the run stops before a step that would overrun it, saving a checkpoint and the
model. The first Ctrl-C does the same; a second one aborts. Options are checked in
:mod:`.options`, checkpoints kept in :mod:`.checkpoint`, the folder's files in :mod:`.outputs`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from ..fsutil import write_text_atomic
from ..loaders import Model, load_model
from ..questions import DEFAULT_QUESTIONS, read_questions
from ..runtime.native import SUPPORTED_MODEL_TYPES
from .checkpoint import load_checkpoint, save_checkpoint
from .data import frequent_tokens, make_sequences, ordered_prompts, split_questions
from .evaluate import EvalReport, evaluate_draft
from .loop import RunProgress, StepLog, train_loop
from .options import DEFAULT_STEPS, check_numbers, check_temperatures, resolve_settings, resolve_shape
from .outputs import (
    check_out_dir,
    claim_out_dir,
    file_sha256,
    portable_command,
    prompts_name,
    save_draft_folder,
    write_eval,
    write_heldout,
    write_meta,
)
from .student import build_draft

__all__ = ["DistillResult", "StepLog", "distill"]


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


def _kept_log(log_path: Path, step: int) -> str:
    """The training log's lines up to ``step`` (a resumed run rewrites the steps after it)."""
    if not log_path.exists():
        return ""
    lines = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            if line.strip() and json.loads(line)["step"] <= step:
                lines.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a kill
    return "".join(lines)


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
    status = on_status or (lambda message: None)
    check_numbers(
        {
            "layers": layers, "hidden_size": hidden_size, "vocab_size_draft": vocab_size_draft, "steps": steps,
            "batch": batch, "seq_len": seq_len, "lr": lr, "temperature": temperature, "time_budget": time_budget,
            "seed": seed, "gen_tokens": gen_tokens, "checkpoint_every": checkpoint_every,
            "snapshot_every": snapshot_every, "eval_prompts": eval_prompts, "eval_k": eval_k,
            "eval_max_new_tokens": eval_max_new_tokens,
        }
    )
    gen_temperatures = check_temperatures(gen_temperatures)

    # -- the output folder and, on resume, its checkpoint: checked, nothing touched yet ---------
    out = Path(out_dir).expanduser()
    check_out_dir(out, resume=resume, overwrite=overwrite)
    ckpt_dir = out / "checkpoints"
    ckpt = load_checkpoint(ckpt_dir) if resume else None  # weights_only: a crafted file runs nothing
    saved = ckpt["settings"] if ckpt is not None else None

    if isinstance(target, (str, Path)):
        status(f"loading target {target}")
        target = load_model(target)
    model_type = getattr(target.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"distill builds drafts of the Llama family ({', '.join(SUPPORTED_MODEL_TYPES)}); "
            f"target {target.name!r} is a {model_type!r} model"
        )
    if saved is not None and saved["target"] != target.name:
        raise ConfigError(f"the checkpoint in {out} distils {saved['target']!r}, not {target.name!r}")
    shape = resolve_shape(
        target, saved, layers=layers, init_layers=init_layers, hidden_size=hidden_size, vocab_size_draft=vocab_size_draft
    )
    settings = resolve_settings(
        {
            "batch": batch, "seq_len": seq_len, "lr": lr, "temperature": temperature, "seed": seed,
            "prompts": str(Path(prompts).expanduser().resolve()) if prompts is not None else None,
            "gen_tokens": gen_tokens, "gen_temperatures": gen_temperatures, "train_embeddings": train_embeddings,
        },
        saved,
    )
    if settings["seq_len"] > target.runtime.max_context:
        raise ConfigError(f"--seq-len {settings['seq_len']} exceeds the target's context ({target.runtime.max_context})")
    steps = steps if steps is not None else int(ckpt["planned_steps"]) if ckpt is not None else DEFAULT_STEPS
    prompts_file = Path(settings["prompts"] or DEFAULT_QUESTIONS)
    questions = read_questions(prompts_file)
    prompts_sha = file_sha256(prompts_file)
    if ckpt is not None and ckpt.get("prompts_sha256", prompts_sha) != prompts_sha:
        raise ConfigError(
            f"{prompts_file} changed since the checkpoint in {out} was made; restore it, or start over with --overwrite"
        )
    train_rows, held_rows = split_questions(questions)
    if not train_rows:
        raise ConfigError(f"{prompts_file} leaves no training prompts after the hold-out split; give it more questions")

    # -- from here on, the folder is ours ---------------------------------------------------------
    claim_out_dir(out, resume=resume, overwrite=overwrite)
    data_dir, log_path = out / "data", out / "train_log.jsonl"
    temps = settings["gen_temperatures"]
    n_prompts = int(ckpt["num_prompts"]) if ckpt is not None else min(len(train_rows), steps * settings["batch"])
    status(
        f"making training data: {n_prompts} prompts x {len(temps)} target continuations "
        f"(temperatures {', '.join(f'{t:g}' for t in temps)}) of up to {settings['gen_tokens']} tokens "
        f"(cached in {data_dir})"
    )
    t_data = time.perf_counter()
    sequences = make_sequences(
        target, ordered_prompts(train_rows)[:n_prompts], data_dir, gen_tokens=settings["gen_tokens"],
        gen_temperatures=temps, seed=settings["seed"], on_progress=on_generate,
    )
    data_seconds = time.perf_counter() - t_data
    write_heldout(data_dir, held_rows)

    vocab_subset: list[int] | None = None
    if ckpt is not None:
        vocab_subset = ckpt.get("vocab_subset")
    elif shape.vocab_size_draft is not None:
        vocab_subset = frequent_tokens(sequences, shape.vocab_size_draft, int(target.runtime.vocab_size), sorted(target.eos_token_ids))
    head_rows = torch.tensor(vocab_subset, dtype=torch.long) if vocab_subset else None

    frozen = shape.init_layers is not None and not settings["train_embeddings"]
    model = build_draft(
        target, shape.layers, init_layers=shape.init_layers, hidden_size=shape.hidden_size, seed=settings["seed"],
        freeze_embeddings=frozen,
    )
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0
    )
    run = RunProgress()
    if ckpt is not None:
        status(f"resuming from {ckpt_dir / 'last.pt'} at step {ckpt['step']}")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        run = RunProgress(ckpt["step"], ckpt["tokens"], ckpt["seconds"], ckpt.get("first_loss"))
        ckpt = None  # the weights live in the model now
    # the log holds exactly the steps the checkpoint reached
    write_text_atomic(log_path, _kept_log(log_path, run.step) if saved is not None else "")

    full_settings = {
        "target": target.name, "layers": shape.layers, "init_layers": shape.init_layers,
        "hidden_size": shape.hidden_size, "vocab_size_draft": shape.vocab_size_draft, **settings,
    }

    def checkpoint() -> None:
        state = {
            "step": run.step, "planned_steps": steps, "tokens": run.tokens, "seconds": run.seconds,
            "first_loss": run.first_loss, "num_prompts": n_prompts, "settings": full_settings,
            "prompts_sha256": prompts_sha, "vocab_subset": vocab_subset,
        }
        save_checkpoint(ckpt_dir, model, opt, state)

    status(f"training: steps {run.step + 1}..{steps}, batch {settings['batch']} x {settings['seq_len']} tokens")
    with log_path.open("a", encoding="utf-8") as log:
        train_loop(
            target, model, opt, sequences, settings, head_rows, steps, run, log, time_budget=time_budget,
            checkpoint_every=checkpoint_every, snapshot_every=snapshot_every, checkpoint=checkpoint,
            ckpt_dir=ckpt_dir, data_dir=data_dir, on_step=on_step,
        )

    # -- the draft folder -------------------------------------------------------------------------
    status(f"saving the draft to {out}")
    save_draft_folder(out, model, target)
    write_meta(
        out,
        {
            "format": 1,
            "kind": "distilled",
            "target": target.name,
            "target_folder": Path(target.folder).name,  # the shipped packs are keyed by it
            "layers": shape.layers,
            "hidden_size": shape.hidden_size,
            "init_layers": shape.init_layers,
            "vocab_size_draft": len(vocab_subset) if vocab_subset else None,
            "vocab_subset": vocab_subset,
            "steps": run.step,
            "planned_steps": steps,
            "tokens": run.tokens,
            "train_seconds": round(run.seconds, 2),
            "first_loss": run.first_loss,
            "final_loss": run.loss,
            "stopped": run.stopped,
            "train_prompts": n_prompts,
            "train_sequences": len(sequences),
            "train_embeddings": not frozen,
            "split": "per category, file order: positions 3, 7, 11, ... held out, the rest train",
            "settings": {**full_settings, "prompts": prompts_name(settings["prompts"])},
            "prompts_sha256": prompts_sha,
            "command": portable_command(command),
        },
    )

    report = None
    if eval_prompts > 0:
        held = [q.prompt for q in ordered_prompts(held_rows)[:eval_prompts]]
        if held:
            status(f"evaluating on {len(held)} held-out prompts (k={eval_k})")
            report = evaluate_draft(target, out, held, max_new_tokens=eval_max_new_tokens, k=eval_k, on_progress=on_evaluate)
            write_eval(out, report.to_dict())
        else:
            status("no held-out prompts to evaluate on")
    return DistillResult(
        out_dir=out, steps=run.step, planned_steps=steps, first_loss=run.first_loss, loss=run.loss, tokens=run.tokens,
        train_seconds=run.seconds, data_seconds=data_seconds, stopped=run.stopped, layers=shape.layers,
        init_layers=shape.init_layers, hidden_size=shape.hidden_size,
        vocab_subset_size=len(vocab_subset) if vocab_subset else None, train_sequences=len(sequences), eval=report,
    )
