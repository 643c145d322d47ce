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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.distill.evaluate import EvalReport, evaluate_draft
from draftwise.distill.loop import train_loop
from draftwise.distill.options import (
    DEFAULT_STEPS,
    DEFAULTS,
    NUMBER_RULES,
    DraftShape,
    resolve_shape,
)
from draftwise.distill.outputs import (
    check_out_dir,
    claim_out_dir,
    save_draft_folder,
    write_eval,
    write_meta,
)
from draftwise.distill.student import build_draft
from draftwise.errors import ConfigError
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions
from draftwise.runtime.loaders import Model, load_model
from draftwise.runtime.native import SUPPORTED_MODEL_TYPES
from draftwise.training.checkpoint import load_checkpoint, save_checkpoint
from draftwise.training.data import (
    frequent_tokens,
    make_sequences,
    ordered_prompts,
    split_questions,
)
from draftwise.training.loop import RunProgress, StepLog, resume_from, start_log
from draftwise.training.options import (
    check_numbers,
    check_temperatures,
    resolve_settings,
)
from draftwise.training.outputs import (
    file_sha256,
    portable_command,
    prompts_name,
    write_heldout,
)

__all__ = ["DistillResult", "StepLog", "distill"]

Status = Callable[[str], None]


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


@dataclass
class _Plan:
    """What the checks settled before the output folder is touched."""

    out: Path
    target: Model
    shape: DraftShape
    settings: dict[str, Any]  # the training settings (options.DEFAULTS' keys), resolved
    steps: int
    ckpt: dict[str, Any] | None  # the checkpoint resumed from, dropped once loaded
    prompts_sha: str
    train_rows: list[Question]
    held_rows: list[Question]

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"

    @property
    def data_dir(self) -> Path:
        return self.out / "data"

    @property
    def full_settings(self) -> dict[str, Any]:
        """The settings a checkpoint keeps, so that ``--resume`` trains as the first part did."""
        shape = self.shape
        return {
            "target": self.target.name, "layers": shape.layers, "init_layers": shape.init_layers,
            "hidden_size": shape.hidden_size, "vocab_size_draft": shape.vocab_size_draft, **self.settings,
        }


@dataclass
class _Data:
    """The training data: the target's continuations and, for a reduced head, its token ids."""

    sequences: list[list[int]]
    num_prompts: int
    seconds: float
    vocab_subset: list[int] | None


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
        },
        NUMBER_RULES,
    )
    explicit = {
        "batch": batch, "seq_len": seq_len, "lr": lr, "temperature": temperature, "seed": seed,
        "prompts": str(Path(prompts).expanduser().resolve()) if prompts is not None else None,
        "gen_tokens": gen_tokens, "gen_temperatures": check_temperatures(gen_temperatures),
        "train_embeddings": train_embeddings,
    }
    shape = {"layers": layers, "init_layers": init_layers, "hidden_size": hidden_size, "vocab_size_draft": vocab_size_draft}
    plan = _plan(target, Path(out_dir).expanduser(), shape, explicit, steps, resume=resume, overwrite=overwrite, status=status)

    claim_out_dir(plan.out, resume=resume, overwrite=overwrite)  # from here on, the folder is ours
    data = _make_data(plan, status, on_generate)
    model, opt, run = _setup_draft(plan, status)
    _train(plan, data, model, opt, run, status, time_budget=time_budget, checkpoint_every=checkpoint_every,
           snapshot_every=snapshot_every, on_step=on_step)
    status(f"saving the draft to {plan.out}")
    save_draft_folder(plan.out, model, plan.target)
    write_meta(plan.out, _meta(plan, data, run, command))
    report = _evaluate(plan, status, prompts=eval_prompts, k=eval_k, max_new_tokens=eval_max_new_tokens,
                       on_progress=on_evaluate)
    return DistillResult(
        out_dir=plan.out, steps=run.step, planned_steps=plan.steps, first_loss=run.first_loss, loss=run.loss,
        tokens=run.tokens, train_seconds=run.seconds, data_seconds=data.seconds, stopped=run.stopped,
        layers=plan.shape.layers, init_layers=plan.shape.init_layers, hidden_size=plan.shape.hidden_size,
        vocab_subset_size=len(data.vocab_subset) if data.vocab_subset else None,
        train_sequences=len(data.sequences), eval=report,
    )


def _load_target(target: Model | str | Path, status: Status) -> Model:
    """``target`` loaded if named, and refused unless distill can build a draft of its family."""
    if isinstance(target, (str, Path)):
        status(f"loading target {target}")
        target = load_model(target)
    model_type = getattr(target.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"distill builds drafts of the Llama family ({', '.join(SUPPORTED_MODEL_TYPES)}); "
            f"target {target.name!r} is a {model_type!r} model"
        )
    return target


def _plan(
    target: Model | str | Path, out: Path, shape: dict[str, Any], explicit: dict[str, Any], steps: int | None, *,
    resume: bool, overwrite: bool, status: Status,
) -> _Plan:
    """Check the output folder, the checkpoint (on resume), the target, the shape and the
    prompts, touching nothing; every bad option fails here, before the slow work."""
    check_out_dir(out, resume=resume, overwrite=overwrite)
    ckpt = load_checkpoint(out / "checkpoints") if resume else None  # weights_only: a crafted file runs nothing
    saved = ckpt["settings"] if ckpt is not None else None
    target = _load_target(target, status)
    if saved is not None and saved["target"] != target.name:
        raise ConfigError(f"the checkpoint in {out} distils {saved['target']!r}, not {target.name!r}")
    draft_shape = resolve_shape(target, saved, **shape)
    settings = resolve_settings(explicit, saved, DEFAULTS)
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
    return _Plan(out, target, draft_shape, settings, steps, ckpt, prompts_sha, train_rows, held_rows)


def _make_data(plan: _Plan, status: Status, on_generate: Callable[[int, int], None] | None) -> _Data:
    """The target's continuations of the training prompts (cached), the held-out questions
    written beside them, and the reduced head's token ids (the checkpoint's on resume)."""
    settings, target, ckpt = plan.settings, plan.target, plan.ckpt
    temps = settings["gen_temperatures"]
    n_prompts = int(ckpt["num_prompts"]) if ckpt is not None else min(len(plan.train_rows), plan.steps * settings["batch"])
    status(
        f"making training data: {n_prompts} prompts x {len(temps)} target continuations "
        f"(temperatures {', '.join(f'{t:g}' for t in temps)}) of up to {settings['gen_tokens']} tokens "
        f"(cached in {plan.data_dir})"
    )
    t0 = time.perf_counter()
    sequences = make_sequences(
        target, ordered_prompts(plan.train_rows)[:n_prompts], plan.data_dir, gen_tokens=settings["gen_tokens"],
        gen_temperatures=temps, seed=settings["seed"], on_progress=on_generate,
    )
    seconds = time.perf_counter() - t0
    write_heldout(plan.data_dir, plan.held_rows)
    vocab_subset: list[int] | None = None
    if ckpt is not None:
        vocab_subset = ckpt.get("vocab_subset")
    elif plan.shape.vocab_size_draft is not None:
        vocab = int(target.runtime.vocab_size)
        vocab_subset = frequent_tokens(sequences, plan.shape.vocab_size_draft, vocab, sorted(target.eos_token_ids))
    return _Data(sequences, n_prompts, seconds, vocab_subset)


def _frozen(plan: _Plan) -> bool:
    """Whether the draft keeps the target's embeddings and head (started from its layers, not trained)."""
    return plan.shape.init_layers is not None and not plan.settings["train_embeddings"]


def _setup_draft(plan: _Plan, status: Status) -> tuple[Any, torch.optim.Optimizer, RunProgress]:
    """The draft, its optimizer and the run's totals: fresh, or (resume) the checkpoint's."""
    shape, settings = plan.shape, plan.settings
    model = build_draft(
        plan.target, shape.layers, init_layers=shape.init_layers, hidden_size=shape.hidden_size,
        seed=settings["seed"], freeze_embeddings=_frozen(plan),
    )
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0
    )
    if plan.ckpt is not None:
        status(f"resuming from {plan.ckpt_dir / 'last.pt'} at step {plan.ckpt['step']}")
    run = resume_from(plan.ckpt, model, opt)
    start_log(plan.out / "train_log.jsonl", run.step, resumed=plan.ckpt is not None)
    plan.ckpt = None  # the weights live in the model now
    return model, opt, run


def _train(
    plan: _Plan, data: _Data, model: Any, opt: torch.optim.Optimizer, run: RunProgress, status: Status, *,
    time_budget: float | None, checkpoint_every: int, snapshot_every: int | None,
    on_step: Callable[[StepLog], bool | None] | None,
) -> None:
    """Train from ``run.step`` to ``plan.steps``, logging every step and checkpointing as asked."""
    settings = plan.settings

    def checkpoint() -> None:
        state = {
            "step": run.step, "planned_steps": plan.steps, "tokens": run.tokens, "seconds": run.seconds,
            "first_loss": run.first_loss, "num_prompts": data.num_prompts, "settings": plan.full_settings,
            "prompts_sha256": plan.prompts_sha, "vocab_subset": data.vocab_subset,
        }
        save_checkpoint(plan.ckpt_dir, model, opt, state)

    head_rows = torch.tensor(data.vocab_subset, dtype=torch.long) if data.vocab_subset else None
    status(f"training: steps {run.step + 1}..{plan.steps}, batch {settings['batch']} x {settings['seq_len']} tokens")
    with (plan.out / "train_log.jsonl").open("a", encoding="utf-8") as log:
        train_loop(
            plan.target, model, opt, data.sequences, settings, head_rows, plan.steps, run, log,
            time_budget=time_budget, checkpoint_every=checkpoint_every, snapshot_every=snapshot_every,
            checkpoint=checkpoint, ckpt_dir=plan.ckpt_dir, data_dir=plan.data_dir, on_step=on_step,
        )


def _meta(plan: _Plan, data: _Data, run: RunProgress, command: str | None) -> dict[str, Any]:
    """``draftwise_draft.json``: how the draft was made, with no machine's paths (it ships)."""
    target, shape, subset = plan.target, plan.shape, data.vocab_subset
    return {
        "format": 1,
        "kind": "distilled",
        "target": target.name,
        "target_folder": Path(target.folder).name,  # the shipped packs are keyed by it
        "layers": shape.layers,
        "hidden_size": shape.hidden_size,
        "init_layers": shape.init_layers,
        "vocab_size_draft": len(subset) if subset else None,
        "vocab_subset": subset,
        "steps": run.step,
        "planned_steps": plan.steps,
        "tokens": run.tokens,
        "train_seconds": round(run.seconds, 2),
        "first_loss": run.first_loss,
        "final_loss": run.loss,
        "stopped": run.stopped,
        "train_prompts": data.num_prompts,
        "train_sequences": len(data.sequences),
        "train_embeddings": not _frozen(plan),
        "split": "per category, file order: positions 3, 7, 11, ... held out, the rest train",
        "settings": {**plan.full_settings, "prompts": prompts_name(plan.settings["prompts"])},
        "prompts_sha256": plan.prompts_sha,
        "command": portable_command(command),
    }


def _evaluate(
    plan: _Plan, status: Status, *, prompts: int, k: int, max_new_tokens: int,
    on_progress: Callable[[int, int], None] | None,
) -> EvalReport | None:
    """Speculative against plain decoding on up to ``prompts`` held-out prompts (``eval.json``)."""
    if prompts <= 0:
        return None
    held = [q.prompt for q in ordered_prompts(plan.held_rows)[:prompts]]
    if not held:
        status("no held-out prompts to evaluate on")
        return None
    status(f"evaluating on {len(held)} held-out prompts (k={k})")
    report = evaluate_draft(plan.target, plan.out, held, max_new_tokens=max_new_tokens, k=k, on_progress=on_progress)
    write_eval(plan.out, report.to_dict())
    return report
