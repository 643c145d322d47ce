"""``draftwise bench-runtime``: plain decoding, the native runtime against Hugging Face ``generate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from draftwise.bench import render_runtime_markdown, run_runtime_benchmark
from draftwise.cli.common import ModelOpt, QuestionsOpt, ThreadsOpt, out, user_errors
from draftwise.fsutil import check_writable
from draftwise.questions import DEFAULT_QUESTIONS


def bench_runtime(
    model: ModelOpt = "default",
    questions: QuestionsOpt = DEFAULT_QUESTIONS,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 20,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    dtypes: Annotated[str, typer.Option(help="Comma-separated: float32,bfloat16.")] = "float32,bfloat16",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write JSON + markdown here.")] = None,
    threads: ThreadsOpt = None,
) -> None:
    """Plain decoding: the native runtime against Hugging Face generate, speed and equal outputs."""
    with user_errors():
        if out_dir is not None:
            check_writable(out_dir)
        report = run_runtime_benchmark(
            model=model,
            questions=questions,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            dtypes=[d.strip() for d in dtypes.split(",") if d.strip()],
            out_dir=out_dir,
            threads=threads,
        )
    out.print(render_runtime_markdown(report), highlight=False, markup=False)
