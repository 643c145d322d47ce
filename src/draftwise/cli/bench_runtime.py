"""``draftwise bench-runtime``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import DType, DTypeOpt, ModelOpt, RuntimeChoice, RuntimeOpt, err, load_with_status, out, user_errors

def bench_runtime(
    model: ModelOpt = "default",
    questions: Annotated[
        Path | None, typer.Option(help="Spec-Bench-format JSONL (default: the dev questions).")
    ] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 20,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    dtypes: Annotated[str, typer.Option(help="Comma-separated: float32,bfloat16.")] = "float32,bfloat16",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write JSON + markdown here.")] = None,
) -> None:
    """Plain decoding: the native runtime against Hugging Face generate, plus the roofline."""
    from ..bench.runtime import DEFAULT_QUESTIONS, render_markdown, run_runtime_benchmark

    with user_errors():
        report = run_runtime_benchmark(
            model=model,
            questions=questions or DEFAULT_QUESTIONS,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            dtypes=[d.strip() for d in dtypes.split(",") if d.strip()],
            out_dir=out_dir,
        )
    out.print(render_markdown(report), highlight=False, markup=False)
