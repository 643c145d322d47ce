"""``draftwise profile``: measure this machine's costs, the input of ``plan`` and ``--k auto``.

The output file and the plot are checked for writing before any measuring, and the profile is
written atomically; bad input is one line and exit status 2.
"""

from __future__ import annotations

import json
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
    load_with_status,
    out,
    output_file,
    parse_drafts,
    plot_file,
    progress_bar,
    user_errors,
)
from draftwise.cost.measure import measure_profile
from draftwise.cost.profile import default_profile_path
from draftwise.errors import ConfigError
from draftwise.planner.report import plot_profile


def profile_table(profile: Any) -> Table:
    contexts = sorted(profile.step)
    table = Table(title=f"{escape(profile.model)} ({profile.dtype}): one target step feeding n tokens, ms")
    table.add_column("n", justify="right")
    for c in contexts:
        table.add_column(f"T(n) @{c}", justify="right")
        table.add_column(f"step @{c}", justify="right")
    if profile.step_sampled:
        table.add_column(f"sampled step @{contexts[0]}", justify="right")
    table.add_column(f"v(n-1) @{contexts[0]}", justify="right")
    for n in range(1, profile.max_n + 1):
        cells = [str(n)]
        for c in contexts:
            cells += [f"{1000 * profile.forward[c][n - 1]:.1f}", f"{1000 * profile.step[c][n - 1]:.1f}"]
        if profile.step_sampled:
            cells.append(f"{1000 * profile.step_sampled[contexts[0]][n - 1]:.1f}")
        cells.append("-" if n == 1 else f"{profile.verify_ratio(n - 1, contexts[0]):.2f}")
        table.add_row(*cells)
    return table


def drafts_table(profile: Any) -> Table:
    table = Table(title="draft cost D(k), ms (c = D(k) / (k T(1)))")
    table.add_column("draft")
    ks = [1, 2, 4, 8, 15]
    ks = [k for k in ks if k < profile.max_n]
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    for spec in profile.drafts:
        table.add_row(escape(spec), *[
            f"{1000 * profile.draft_time(spec, k):.2f} (c={profile.draft_ratio(spec, k):.3f})" for k in ks
        ])
    return table


def _contexts(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--contexts takes integers like 128,1024, got {text!r}") from None


def profile_cmd(
    model: ModelOpt = "default",
    dtype: DTypeOpt = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    drafts: Annotated[
        str, typer.Option("--draft", "-d", help="Comma-separated draft specs to cost, e.g. lookup,self.")
    ] = "lookup,self",
    max_n: Annotated[int, typer.Option("--max-n", min=2, help="Measure passes of 1..N tokens.")] = 16,
    contexts: Annotated[str, typer.Option(help="Context lengths to measure at (interpolated between).")] = "128,1024",
    repeats: Annotated[
        int, typer.Option(min=1, help="Timings per point (the mean of the faster half is kept).")
    ] = 9,
    out_file: Annotated[Path | None, typer.Option("--out", help="Profile JSON (default: the user cache).")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw T(n) to this file (.png, .pdf, .svg ...).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Measure this machine: the target's T(n), each draft's D(k) and the per-step overhead."""
    with user_errors():
        ctx = _contexts(contexts)
        specs = parse_drafts(drafts, "--draft")
        if out_file is not None:
            out_file = output_file(out_file, "--out")
        plot = plot_file(plot)
        target = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        path = output_file(out_file or default_profile_path(target), "profile file")
        with progress_bar("profile") as report:
            profile = measure_profile(
                target, drafts=specs, max_n=max_n, contexts=ctx, repeats=repeats, progress=report
            )
        path = profile.save(path)
        if plot:
            plot_profile(profile, plot)
    if as_json:
        print(json.dumps(profile.to_dict(), indent=2))
        return
    out.print(profile_table(profile))
    out.print(drafts_table(profile))
    out.print(f"per-token overhead outside steps: {1000 * profile.token_overhead:.2f} ms")
    out.print(f"saved {path}" + (f"; plot {plot}" if plot else ""), highlight=False, markup=False)
