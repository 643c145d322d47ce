"""``draftwise bench``: every draft (and peer) against plain decoding, per category (see
:mod:`draftwise.bench.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from draftwise.bench import render_markdown, run_bench
from draftwise.bench.batched import check_batch_option
from draftwise.bench.methods import parse_methods, parse_peers
from draftwise.bench.outdir import prepare_out
from draftwise.bench.run import check_repeats, check_settle
from draftwise.bench.runner import load_plan_for_auto
from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    DType,
    ModelOpt,
    Quant,
    QuantOpt,
    ThreadsOpt,
    err,
    load_with_status,
    out,
    plain,
    user_errors,
    warn,
)
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.spec import SPEC_HELP, parse_k
from draftwise.planner.defaults import DEFAULT_DRAFTS
from draftwise.plots import PLOT_INSTALL_HINT, plotting_available
from draftwise.questions import DEFAULT_QUESTIONS, read_questions

BatchOpt = Annotated[
    int,
    typer.Option("--batch", help="Then run the questions N at a time on the batched engine (native runtime) "
                 "and report aggregate and per-request tok/s beside the one-at-a-time rows."),
]

RepeatsOpt = Annotated[
    int,
    typer.Option("--repeats", help="Run every turn N times, the drafts alternating run by run, and keep the "
                 "fastest: less of a shared machine's noise, N times the run time; summary.md then says how far "
                 "that noise still moves each speedup. Sampling needs --seed."),
]


SettleOpt = Annotated[
    float | None,
    typer.Option("--settle", help="With --repeats N >= 2: run every draft's turn again while any one's two fastest "
                 "runs differ by more than this fraction (e.g. 0.05), up to 3N runs each; a burst of noise "
                 "then cannot decide a short answer's time."),
]


def bench(
    questions: Annotated[
        Path,
        typer.Option(
            "--questions", "-q",
            help="Spec-Bench-format JSONL (question_id, category, turns; any category) or a text "
            "file with one prompt a line.",
            show_default="the Spec-Bench dev questions shipped with draftwise",
        ),
    ] = DEFAULT_QUESTIONS,
    model: ModelOpt = "default",
    drafts: Annotated[
        str,
        typer.Option(
            "--drafts", "-d",
            help=f"Comma-separated drafts run against plain decoding ({SPEC_HELP}), each optionally "
            "@k=K; auto = the plan's choice per category. 'none' always runs.",
        ),
    ] = ",".join(DEFAULT_DRAFTS),
    k: Annotated[str, typer.Option("--k", help="Tokens proposed per step: an integer or 'auto'.")] = "4",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    limit_per_category: Annotated[
        int | None, typer.Option("--limit-per-category", min=1, help="First M questions of each category.")
    ] = None,
    temperature: Annotated[float, typer.Option(help="0 = greedy (and the equality check).")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling (temperature > 0).")] = None,
    dtype: Annotated[DType, typer.Option("--dtype", help="Weights and activations dtype.")] = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    peers: Annotated[
        str | None, typer.Option("--peers", help="Also run peers on the same weights: hf.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Plan for --drafts auto (default: OUT/plan.json).")
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for answers/, summary.json, summary.md, plots.")
    ] = Path("draftwise-bench"),
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Keep the answers already in OUT and run only the missing ones; "
                     "refused if any setting that shapes an answer differs."),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the run in OUT (only a folder `draftwise bench` made).")
    ] = False,
    time_budget: Annotated[
        float | None,
        typer.Option("--time-budget", min=0, help="Seconds; stop after the question that exceeds it."),
    ] = None,
    batch: BatchOpt = 1,
    repeats: RepeatsOpt = 1,
    settle: SettleOpt = None,
) -> None:
    """Spec-Bench-style benchmark: every draft (and peer) against plain decoding, per category."""
    with user_errors():
        # everything that can be wrong is found here, in a second, before the model loads
        sampling = SamplingConfig(temperature=temperature, seed=seed)
        parsed_k = parse_k(k)
        check_batch_option(batch)
        check_settle(settle, check_repeats(repeats, sampling))
        methods = parse_methods(drafts, parsed_k)
        peer_list = parse_peers(peers or "")
        read_questions(questions)
        if any(spec == "auto" for _, spec, _ in methods):
            load_plan_for_auto(plan, out_dir)
        prepare_out(out_dir, resume=resume, overwrite=overwrite)
        loaded = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        try:
            summary = run_bench(
                loaded, questions, drafts=drafts, k=parsed_k, max_new_tokens=max_new_tokens,
                limit_per_category=limit_per_category, sampling=sampling, peers=peer_list, out_dir=out_dir,
                resume=resume, overwrite=overwrite, time_budget=time_budget, plan=plan,
                progress=True, batch=batch, repeats=repeats, settle=settle,
            )
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted[/]: the summary of the finished questions is in {plain(out_dir)}",
                      highlight=False)
            raise typer.Exit(code=130) from None
    out.print(render_markdown(summary), highlight=False, markup=False, soft_wrap=True)
    run = summary["run"]
    if run["stopped"] == "time_budget":
        err.print(
            f"[yellow]time budget reached[/]: {run['questions_finished']} of "
            f"{run['questions_total']} questions finished; rerun with --resume to continue"
        )
    if not plotting_available():
        warn(f"skipped the plots: matplotlib is not installed ({PLOT_INSTALL_HINT})")
    err.print(f"answers, summary.json, summary.md and plots in {out_dir}", style="dim", markup=False, highlight=False)
