"""``draftwise distill``: train a small same-tokenizer draft by distillation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    Quant,
    QuantOpt,
    TargetOpt,
    ThreadsOpt,
    command_line,
    load_with_status,
    out,
    parse_number_list,
    phase_bars,
    status_printer,
    user_errors,
)
from draftwise.distill import distill
from draftwise.distill.outputs import check_out_dir
from draftwise.distill.pack import PACK_WEIGHTS, pack_draft
from draftwise.threads import set_threads


def eval_table(report: Any) -> Table:
    """The held-out evaluation of a distilled draft, as one table."""
    be = report.breakeven_acceptance
    title = Text(f"{report.draft}: greedy, k={report.k}, {report.prompts} held-out prompts")  # a path is not markup
    table = Table(title=title, show_header=False)
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = [
        ("acceptance a (accepted / proposed)", f"{report.acceptance:.3f}"),
        ("#MAT (committed per target pass)", f"{report.mean_committed:.2f}"),
        ("draft cost ratio c = T_draft(1) / T_target(1)", f"{report.cost_ratio:.3f}"),
        ("break-even acceptance at this c and k", "never pays (c >= 1)" if be is None else f"{be:.3f}"),
        ("predicted speedup E(a, k) / (k c + 1)", f"{report.predicted_speedup:.2f}x"),
        ("measured speedup (plain s / speculative s)", f"{report.speedup:.2f}x"),
        ("outputs identical to plain", f"{report.identical}/{report.prompts}"),
        ("tokens", str(report.tokens)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _load_target(target: str, out_dir: Path, *, resume: bool, overwrite: bool, device: str, quant: Quant,
                 compile_: bool) -> Any:
    """The target as distill should take it: its name (distill loads a plain float32 target
    itself, after all its checks), or for --device, --quant or --compile the model loaded here
    (it makes the training data and the teacher logits), once --out has been checked."""
    if device == "cpu" and quant is Quant.none and not compile_:
        return target
    check_out_dir(out_dir.expanduser(), resume=resume, overwrite=overwrite)
    return load_with_status(target, "float32", device=device, quant=quant.value, compile=compile_)


def _result_json(result: Any) -> str:
    return json.dumps({
        "out_dir": str(result.out_dir), "steps": result.steps, "planned_steps": result.planned_steps,
        "first_loss": result.first_loss, "loss": result.loss, "tokens": result.tokens,
        "train_seconds": result.train_seconds, "data_seconds": result.data_seconds, "stopped": result.stopped,
        "layers": result.layers, "init_layers": result.init_layers, "hidden_size": result.hidden_size,
        "vocab_subset_size": result.vocab_subset_size, "train_sequences": result.train_sequences,
        "eval": result.eval.to_dict() if result.eval else None,
    })


def _print_result(result: Any) -> None:
    loss = f"{result.first_loss:.4f} -> {result.loss:.4f}" if result.loss is not None else "no step run"
    out.print(
        f"draft saved to {result.out_dir}: {result.layers} layers, hidden {result.hidden_size}, "
        f"init layers {result.init_layers or 'random'}, head "
        f"{result.vocab_subset_size or 'full vocabulary'}; {result.steps}/{result.planned_steps} steps "
        f"({result.stopped}), KL {loss}, {result.train_seconds:.0f} s training",
        highlight=False,
        markup=False,
    )
    if result.eval is not None:
        out.print(eval_table(result.eval))
    out.print(f"use it: draftwise generate \"...\" --draft model:{result.out_dir}", highlight=False, markup=False)


# the options of distill_cmd whose declaration takes more than a line
InitLayersOpt = Annotated[str | None, typer.Option(
    "--init-layers", help="Target layers to start from, e.g. 0,10,20,29 (default evenly spaced).")]
HiddenSizeOpt = Annotated[int | None, typer.Option(
    "--hidden-size", help="Draft hidden size; other than the target's starts random.")]
VocabOpt = Annotated[int | None, typer.Option(
    "--vocab-size-draft", help="Keep only the N most frequent tokens in the draft's head.")]
TimeBudgetOpt = Annotated[float | None, typer.Option(
    "--time-budget", help="Seconds of training; stops cleanly when spent.")]
PromptsOpt = Annotated[Path | None, typer.Option(
    help="Spec-Bench-format JSONL or a text file, one prompt a line (default: the shipped dev questions).")]
GenTokensOpt = Annotated[int | None, typer.Option(
    "--gen-tokens", help="Target tokens generated per prompt (default 128).")]
GenTemperaturesOpt = Annotated[str | None, typer.Option(
    "--gen-temperatures",
    help="One target continuation per prompt per listed temperature, 0 = greedy, e.g. 0,0.7,0.7 (default 0).")]
TrainEmbeddingsOpt = Annotated[bool | None, typer.Option(
    "--train-embeddings/--freeze-embeddings",
    help="Train the embeddings and head too (default: frozen at the target's when started from its layers).")]
SnapshotOpt = Annotated[int | None, typer.Option(
    "--snapshot-every", min=1,
    help="Also keep the weights every N steps (checkpoints/step-N.pt), for a training curve.")]
OverwriteOpt = Annotated[bool, typer.Option(
    "--overwrite", help="Replace an earlier distill run in --out (never a folder distill did not make).")]
EvalPromptsOpt = Annotated[int, typer.Option(
    "--eval-prompts", min=0, help="Held-out prompts to evaluate on (0 = skip).")]


def distill_cmd(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder (a HF model folder).")],
    target: TargetOpt = "default",
    layers: Annotated[int | None, typer.Option(help="Draft layers (default 4).")] = None,
    init_layers: InitLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    vocab_size_draft: VocabOpt = None,
    steps: Annotated[int | None, typer.Option(help="Training steps (default 300).")] = None,
    batch: Annotated[int | None, typer.Option(help="Sequences per step (default 4).")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence (default 256).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak AdamW learning rate (default 3e-4).")] = None,
    temperature: Annotated[float | None, typer.Option(help="Distillation temperature T (default 1).")] = None,
    time_budget: TimeBudgetOpt = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default 0).")] = None,
    prompts: PromptsOpt = None,
    gen_tokens: GenTokensOpt = None,
    gen_temperatures: GenTemperaturesOpt = None,
    train_embeddings: TrainEmbeddingsOpt = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", min=1)] = 50,
    snapshot_every: SnapshotOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the distill run in --out.")] = False,
    overwrite: OverwriteOpt = False,
    eval_prompts: EvalPromptsOpt = 8,
    k: Annotated[int, typer.Option("--k", min=1, help="Draft tokens per step in the evaluation.")] = 4,
    eval_max_new_tokens: Annotated[int, typer.Option("--eval-max-new-tokens", min=1)] = 128,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
) -> None:
    """Train a small draft for TARGET by distillation, save it as a HF folder, and evaluate it.

    Options left unset take their defaults, or with --resume the checkpoint's values.
    """
    command = command_line()
    with user_errors():
        init_list = parse_number_list(init_layers, int, "--init-layers", "0,10,20,29")
        temps = parse_number_list(gen_temperatures, float, "--gen-temperatures", "0,0.7")
        set_threads(threads)
        target_model = _load_target(
            target, out_dir, resume=resume, overwrite=overwrite, device=device, quant=quant, compile_=compile_
        )
        with phase_bars() as (progress, bar):

            def on_step(log: Any) -> None:
                bar("training", log.step, log.steps, f"loss {log.loss:.4f}  {log.tokens_per_second:,.0f} tok/s")

            result = distill(
                target_model, out_dir, layers=layers, init_layers=init_list, hidden_size=hidden_size,
                vocab_size_draft=vocab_size_draft, steps=steps, batch=batch, seq_len=seq_len, lr=lr,
                temperature=temperature, time_budget=time_budget, seed=seed, prompts=prompts,
                gen_tokens=gen_tokens, gen_temperatures=temps, train_embeddings=train_embeddings,
                checkpoint_every=checkpoint_every, snapshot_every=snapshot_every,
                resume=resume, overwrite=overwrite, eval_prompts=eval_prompts, eval_k=k,
                eval_max_new_tokens=eval_max_new_tokens, command=command, on_status=status_printer(progress),
                on_generate=lambda done, total: bar("generating data", done, total),
                on_step=on_step,
                on_evaluate=lambda done, total: bar("evaluating", done, total),
            )
    if as_json:
        print(_result_json(result))
        return
    _print_result(result)


def pack_draft_cmd(
    draft: Annotated[Path, typer.Argument(help="A `draftwise distill` output folder.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="New folder for the pack.")],
) -> None:
    """Keep a distilled draft's trained layers only (bfloat16), the form in which drafts ship.

    The embeddings and head are the target's and come back from it on use; see
    ``draftwise.distill.pack``.
    """
    with user_errors():
        folder = pack_draft(draft, out_dir)
    size = (folder / PACK_WEIGHTS).stat().st_size / 2**20
    out.print(f"pack written to {folder}: {PACK_WEIGHTS} {size:.1f} MiB", highlight=False, markup=False)
