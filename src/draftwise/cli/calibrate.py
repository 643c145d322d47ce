"""``draftwise calibrate-self``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    DType,
    DTypeOpt,
    ModelOpt,
    Quant,
    QuantOpt,
    ThreadsOpt,
    err,
    load_with_status,
    out,
    user_errors,
)
from draftwise.cost.calibrate import (
    calibrate_self,
    candidate_layer_sets,
    save_calibration,
)
from draftwise.drafters.factory import calibration_path
from draftwise.fsutil import check_writable
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions


def calibrate_self_cmd(
    model: ModelOpt = "default",
    dtype: DTypeOpt = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    questions: Annotated[
        Path | None, typer.Option(help="Spec-Bench-format JSONL (default: the dev questions).")
    ] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 4,
    k: Annotated[int, typer.Option("--k", min=1)] = 4,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 48,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Save the best as --draft self.")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Search the layer subset that maximises self-speculation's predicted speedup, and save it."""
    with user_errors():
        rows = read_questions(questions or DEFAULT_QUESTIONS)
        prompts = [q.prompt for q in spread_questions(rows, min(num_prompts, len(rows)))]
        loaded = load_with_status(
            model, dtype.value, "native", threads=threads, device=device, quant=quant.value, compile=compile_
        )
        if save:  # a read-only cache fails now, not after the calibration
            check_writable(calibration_path(loaded).parent, "calibration cache folder (DRAFTWISE_CACHE)")
        total = len(candidate_layer_sets(loaded.runtime.num_layers))
        with err.status("calibrating ...") as status:
            done = [0]

            def report(c: Any) -> None:
                done[0] += 1
                status.update(
                    f"calibrating: {done[0]}/{total} candidates, last: {c.description} "
                    f"-> predicted {c.predicted_speedup:.2f}x"
                )

            results = calibrate_self(
                loaded, prompts, k=k, max_new_tokens=max_new_tokens, on_candidate=report
            )
        saved = save_calibration(loaded, results[0], k, results) if save else None
    if as_json:
        print(json.dumps({"saved": saved, "candidates": [asdict(c) for c in results]}))
        return
    table = Table(title=f"self-speculation candidates (k={k}, {len(prompts)} prompts)")
    for col in ("layers", "cost c", "acceptance by position", "E", "predicted speedup"):
        table.add_column(col)
    for c in results:
        table.add_row(
            escape(c.description),
            f"{c.draft_cost_ratio:.2f}",
            " ".join(f"{a:.2f}" for a in c.acceptance_by_position),
            f"{c.expected_committed:.2f}",
            f"{c.predicted_speedup:.2f}x",
        )
    out.print(table)
    best = results[0]
    verdict = "pays" if best.predicted_speedup > 1 else "does not pay on this machine"
    out.print(f"best: {escape(best.description)}: predicted {best.predicted_speedup:.2f}x ({verdict})")
    if saved:
        out.print(f"saved to {saved}; `--draft self` now uses it", markup=False, highlight=False)
