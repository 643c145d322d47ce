"""``draftwise bench``: the Spec-Bench-format harness (see draftwise.bench.harness)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import DType, ModelOpt, err, load_with_status, out, user_errors


def bench(
    questions: Annotated[
        Path, typer.Option("--questions", "-q", help="Spec-Bench-format JSONL (question_id, category, turns).")
    ],
    model: ModelOpt = "default",
    drafts: Annotated[
        str,
        typer.Option(
            "--drafts", "-d",
            help="Comma-separated draft specs run against plain decoding: lookup, self[:...], "
            "model:PATH, auto (the plan's choice per category). 'none' always runs.",
        ),
    ] = "lookup,self",
    k: Annotated[str, typer.Option("--k", help="Tokens proposed per step: an integer or 'auto'.")] = "4",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    limit_per_category: Annotated[
        int | None, typer.Option("--limit-per-category", min=1, help="First M questions of each category.")
    ] = None,
    temperature: Annotated[float, typer.Option(help="0 = greedy (and the equality check).")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling (temperature > 0).")] = None,
    dtype: Annotated[DType, typer.Option("--dtype", help="Weights and activations dtype.")] = DType.float32,
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
        bool, typer.Option("--resume", help="Keep the answers already in OUT; run only the missing ones.")
    ] = False,
    time_budget: Annotated[
        float | None,
        typer.Option("--time-budget", min=0, help="Seconds; stop after the question that exceeds it."),
    ] = None,
) -> None:
    """Spec-Bench-style benchmark: every draft (and peer) against plain decoding, per category."""
    from ..bench.harness import parse_drafts, parse_k, read_questions, render_markdown, run_bench
    from ..sampling import SamplingConfig

    with user_errors():
        sampling = SamplingConfig(temperature=temperature, seed=seed)
        parsed_k = parse_k(k)
        parse_drafts(drafts, parsed_k)
        read_questions(questions)  # fail on a bad file before loading the model
        peer_list = [p.strip() for p in (peers or "").split(",") if p.strip()]
        loaded = load_with_status(model, dtype.value)
        try:
            summary = run_bench(
                loaded,
                questions,
                drafts=drafts,
                k=parsed_k,
                max_new_tokens=max_new_tokens,
                limit_per_category=limit_per_category,
                sampling=sampling,
                peers=peer_list,
                out_dir=out_dir,
                resume=resume,
                time_budget=time_budget,
                plan=plan,
                progress=True,
            )
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted[/]: the summary of the finished questions is in {out_dir}")
            raise typer.Exit(code=130) from None
    out.print(render_markdown(summary), highlight=False, markup=False, soft_wrap=True)
    run = summary["run"]
    if run["stopped"] == "time_budget":
        err.print(
            f"[yellow]time budget reached[/]: {run['questions_finished']} of "
            f"{run['questions_total']} questions finished; rerun with --resume to continue"
        )
    err.print(f"[dim]answers, summary.json, summary.md and plots in {out_dir}[/]")
