"""``draftwise breakeven``: the break-even calculator (needs no model).

Examples::

    draftwise breakeven --a 0.8 --k 4 --c 0.1
    draftwise breakeven --a 0.1:0.95:0.05 --k 1-8 --draft-kind all --plot speedup.png
    draftwise breakeven --a 0.6,0.7 --k 2,4,8 --draft-ms 1.9,3.8,5.6,7.5,9.4,11.2,13.1,15 --t1-ms 21
    draftwise breakeven --profile profile.json --draft lookup --k 1-7 --json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from draftwise.cli.common import out, plot_file, read_profile, user_errors
from draftwise.cost.breakeven import (
    CostCurve,
    cost_ratio_from_c,
    cost_ratio_from_profile,
    cost_ratio_from_times,
    kind_curves,
    plot_speedup,
    sweep,
)
from draftwise.cost.parsing import (
    parse_acceptances,
    parse_draft_kinds,
    parse_floats,
    parse_ks,
)
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError


def _curves(
    *,
    c: float | None,
    draft_ms: str | None,
    t1_ms: float | None,
    draft_kind: str | None,
    v_text: str | None,
    profile_path: Path | None,
    drafts: list[str] | None,
    context: float | None,
    ks: list[int],
    k_given: bool,
) -> tuple[list[Any], dict[str, Any], float | list[float], list[int]]:
    """The cost curves the options describe, the profile's own curves (for the plot), v, and
    the k to show (by default, those the profile measured)."""
    if c is not None and draft_ms is not None:
        raise ConfigError("give the draft cost once: --c (per token, in target steps) or --draft-ms, not both")
    given = [name for name, val in (("--c", c), ("--draft-ms", draft_ms), ("--draft-kind", draft_kind),
                                    ("--profile", profile_path)) if val is not None]
    if len(given) > 1:
        raise ConfigError(f"give one source of draft costs, not {' and '.join(given)}")
    if t1_ms is not None and draft_ms is None:
        raise ConfigError("--t1-ms goes with --draft-ms (measured D(k) in ms); with --c the cost is already relative")
    if draft_ms is not None and t1_ms is None:
        raise ConfigError("--draft-ms needs --t1-ms, the time of one plain decoding step in ms")
    if profile_path is None and (drafts or context is not None):
        raise ConfigError("--draft and --context select from a measured profile; pass --profile FILE.json")
    if profile_path is not None and v_text is not None:
        raise ConfigError("--v comes from the profile when --profile is given; drop --v")

    v_vals = parse_floats(v_text if v_text is not None else "1", "--v")
    v: float | list[float] = v_vals[0] if len(v_vals) == 1 else v_vals

    if profile_path is not None:
        profile = read_profile(profile_path)
        if not k_given:
            ks = [x for x in ks if x + 1 <= profile.max_n] or [1]
        if max(ks) + 1 > profile.max_n:
            raise ConfigError(
                f"the profile measured steps of up to {profile.max_n} tokens, so k up to "
                f"{profile.max_n - 1}; narrow --k (asked for up to {max(ks)})"
            )
        names = list(dict.fromkeys(str(DraftSpec.parse(d)) for d in drafts)) if drafts else list(profile.drafts)
        if not names:
            raise ConfigError(
                f"the profile {profile_path} has no draft costs; run `draftwise profile --draft lookup` "
                "or pass --draft none for the verification bound"
            )
        curves = [CostCurve(name, cost_ratio_from_profile(profile, name, context), "profile") for name in names]
        markers = {f"profile {cv.name}": cv.ratio for cv in curves}
        return curves, markers, v, ks
    if c is not None:
        return [CostCurve(f"c={c:g}", cost_ratio_from_c(c, v), "c", c)], {}, v, ks
    if draft_ms is not None:
        assert t1_ms is not None
        times = parse_floats(draft_ms, "--draft-ms")
        ratio = cost_ratio_from_times(times, t1_ms, v)
        return [CostCurve(f"measured D(k), T(1)={t1_ms:g} ms", ratio, "draft_ms")], {}, v, ks
    return kind_curves(parse_draft_kinds(draft_kind or "all"), v), {}, v, ks


def _fmt_breakeven(a: float | None) -> str:
    if a is None:
        return "[red]never[/]"
    if a == 0:
        return "[green]any a[/]"
    return f"{a:.3f}"


def _fmt_speedup(s: float) -> str:
    return f"[green]{s:.2f}x[/]" if s > 1 else f"[red]{s:.2f}x[/]"


def _print_tables(result: dict[str, Any]) -> None:
    acc, ks = result["acceptance"], result["k"]

    table = Table(title="E(a, k): tokens per target pass")
    table.add_column("a", justify="right")
    for k in ks:
        table.add_column(f"k={k}", justify="right")
    table.add_column("ceiling 1/(1-a)", justify="right")
    for a, row, ceil in zip(acc, result["expected"], result["ceiling"]):
        table.add_row(f"{a:g}", *(f"{e:.3f}" for e in row), f"{ceil:.3f}")
    out.print(table)

    table = Table(title="step cost R(k) and break-even a*(k)")
    table.add_column("k", justify="right")
    for d in result["drafts"]:
        table.add_column(f"{escape(d['name'])}: R", justify="right")
        table.add_column("a*", justify="right")
    for j, k in enumerate(ks):
        cells = []
        for d in result["drafts"]:
            cells += [f"{d['cost_ratio'][j]:.4g}", _fmt_breakeven(d["breakeven"][j])]
        table.add_row(str(k), *cells)
    out.print(table)

    for d in result["drafts"]:
        table = Table(title=f"speedup S = E / R: {escape(d['name'])}")
        table.add_column("a", justify="right")
        for k in ks:
            table.add_column(f"k={k}", justify="right")
        table.add_column("best k", justify="right")
        for a, row, best in zip(acc, d["speedup"], d["best"]):
            verdict = "[red]no speculation[/]" if best["k"] is None else f"k={best['k']} ({best['speedup']:.2f}x)"
            table.add_row(f"{a:g}", *(_fmt_speedup(s) for s in row), verdict)
        out.print(table)


def breakeven(
    a: Annotated[
        str, typer.Option("--a", help="Acceptance: 0.8, a list 0.5,0.6,0.7, or a sweep start:stop:step.")
    ] = "0.5,0.6,0.7,0.8,0.9",
    k: Annotated[
        str | None,
        typer.Option("--k", help="Proposals per step: 4, a range 1-8, or a list 2,4,8. Default 1-8 (or what a profile measured)."),
    ] = None,
    c: Annotated[
        float | None,
        typer.Option("--c", help="Draft cost per proposed token, as a fraction of one target step: D(k) = k c T(1)."),
    ] = None,
    draft_ms: Annotated[
        str | None, typer.Option("--draft-ms", help="Measured D(k) in ms for k=1..K, comma-separated (with --t1-ms).")
    ] = None,
    t1_ms: Annotated[float | None, typer.Option("--t1-ms", help="One plain decoding step T(1), in ms.")] = None,
    draft_kind: Annotated[
        str | None,
        typer.Option(
            "--draft-kind",
            help="Typical costs: lookup (c=0.0003), self (c=0.6), model (c=0.15), a list, or all (the default).",
        ),
    ] = None,
    v: Annotated[
        str | None,
        typer.Option("--v", help="Verification cost v(k) = T(k+1)/T(1): one number, or a list for k=1..K. Default 1."),
    ] = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Take v(k) and D(k) from a measured profile (draftwise profile).")
    ] = None,
    draft: Annotated[
        list[str] | None,
        typer.Option("--draft", "-d", help="A draft of the profile (repeatable; default: all it measured)."),
    ] = None,
    context: Annotated[
        float | None, typer.Option("--context", help="Context length (tokens) to read the profile at.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Save speedup against acceptance for several k (.png, .pdf, .svg ...)."),
    ] = None,
) -> None:
    """When does speculation pay? E(a, k), speedup, break-even acceptance and the best k (no model needed)."""
    with user_errors():
        plot = plot_file(plot)  # before any work: a folder, an unknown extension, no matplotlib
        acceptances = parse_acceptances(a)
        curves, markers, v_val, ks = _curves(
            c=c, draft_ms=draft_ms, t1_ms=t1_ms, draft_kind=draft_kind, v_text=v,
            profile_path=profile, drafts=draft, context=context, ks=parse_ks(k or "1-8"), k_given=k is not None,
        )
        result = sweep(acceptances, ks, curves)
        result["v"] = v_val if profile is None else None
        result["profile"] = str(profile) if profile is not None else None
        if plot is not None:
            plot_speedup(plot, ks, curves, v=v_val, markers=markers, title="draftwise breakeven")
            result["plot"] = str(plot)
    if as_json:
        print(json.dumps(result))
        return
    _print_tables(result)
    if plot is not None:
        out.print(f"plot saved to {plot}", markup=False, highlight=False)
