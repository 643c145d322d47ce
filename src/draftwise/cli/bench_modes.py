"""``draftwise bench-modes``: the native runtime's weight formats, plain and speculative."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from draftwise.bench import render_modes_markdown, run_modes_benchmark
from draftwise.cli.common import (
    ModelOpt,
    QuestionsOpt,
    ThreadsOpt,
    out,
    progress_bar,
    user_errors,
)
from draftwise.fsutil import check_writable
from draftwise.questions import DEFAULT_QUESTIONS


def bench_modes(
    model: ModelOpt = "default",
    questions: QuestionsOpt = DEFAULT_QUESTIONS,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Prompts, round-robin over the categories.")] = 10,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens per generation (EOS ignored).")] = 64,
    modes: Annotated[str, typer.Option(help="Comma-separated: float32, bfloat16, q4, int8.")] = "float32,bfloat16,q4,int8",
    drafts: Annotated[str, typer.Option(help="Comma-separated draft specs run on every mode (e.g. lookup,self).")] = "lookup",
    k: Annotated[str, typer.Option("--k", help="Tokens a draft proposes per step, or 'auto'.")] = "auto",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write JSON, markdown and a PNG here.")] = None,
    threads: ThreadsOpt = None,
) -> None:
    """Plain and speculative decoding in float32, bfloat16, q4 and int8: speed and fidelity."""
    with user_errors():
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("bench-modes") as bar:
            report = run_modes_benchmark(
                model=model,
                questions=questions,
                num_prompts=num_prompts,
                max_new_tokens=max_new_tokens,
                modes=modes,
                drafts=drafts,
                k=k,
                out_dir=out_dir,
                progress=bar,
                threads=threads,
                command=shlex.join(["draftwise", *sys.argv[1:]]),
            )
    out.print(render_modes_markdown(report), highlight=False, markup=False)
