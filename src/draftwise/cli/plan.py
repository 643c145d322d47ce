"""``draftwise profile`` and ``draftwise plan``: measure costs, predict, recommend.

Every output place is checked for writing before any measuring, and every file is written
atomically; bad input (a binary or wrongly shaped profile or prompt file, a bad draft spec) is
one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..cost.export import export_config
from ..cost.measure import measure_profile
from ..cost.parsing import parse_ks
from ..cost.plan import make_plan
from ..cost.profile import Profile, default_profile_path
from ..plots import plotting_available
from ..cost.report import (
    breakeven_text,
    draft_cells,
    inside_text,
    interval_text,
    plan_rows,
    plot_plan,
    plot_profile,
    render_plan_markdown,
    validation_summary,
)
from ..cost.validate import validate_plan
from ..drafters import make_drafter
from ..drafters.factory import model_draft_source
from ..drafters.spec import SPEC_HELP, DraftSpec, split_draft_list
from ..errors import ConfigError
from ..fsutil import check_writable, write_text_atomic
from ..questions import DEFAULT_QUESTIONS, read_questions, select_questions
from ..sampling import SamplingConfig
from .common import (
    CompileOpt, DeviceOpt, DType, ModelOpt, Quant, QuantOpt, ThreadsOpt, err, load_with_status, out, progress_bar,
    user_errors,
)

NO_PLOT = "matplotlib is not installed, so {what} was skipped (pip install 'draftwise[plot]')"


class Pick(str, Enum):
    low = "low"
    point = "point"


class Engine(str, Enum):
    vllm = "vllm"
    sglang = "sglang"
    hf = "hf"


def parse_drafts(text: str, flag: str) -> list[DraftSpec]:
    """The drafts of ``--draft``/``--drafts``: specs, comma-separated, each listed once
    (``lookup`` and ``lookup:min=1`` are one draft). k comes from ``--ks``, not ``@k=``."""
    specs: list[DraftSpec] = []
    for item in split_draft_list(text):
        if "@" in item:
            raise ConfigError(f"{flag} takes draft specs without @k (got {item!r}); give the k values with --ks")
        spec = DraftSpec.parse(item)
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise ConfigError(f"{flag} needs at least one draft, e.g. {flag} lookup,self ({SPEC_HELP})")
    return specs


def _check_file(path: Path, what: str) -> Path:
    """``path`` can be written as a file: not a folder, and its folder writable (checked now,
    before any measuring)."""
    path = path.expanduser()
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give a file path inside it")
    check_writable(path.parent, f"folder of {what}")
    return path


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


def profile_cmd(
    model: ModelOpt = "default",
    dtype: Annotated[DType, typer.Option("--dtype")] = DType.float32,
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
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw T(n) to this PNG.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Measure this machine: the target's T(n), each draft's D(k) and the per-step overhead."""
    with user_errors():
        try:
            ctx = [int(c) for c in contexts.split(",") if c.strip()]
        except ValueError:
            raise ConfigError(f"--contexts takes integers like 128,1024, got {contexts!r}") from None
        specs = parse_drafts(drafts, "--draft")
        if out_file is not None:
            out_file = _check_file(out_file, "--out")
        if plot is not None:
            plot = _check_file(plot, "--plot")
            if not plotting_available():
                err.print(NO_PLOT.format(what=f"the plot {plot}"), markup=False, highlight=False)
                plot = None
        target = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        path = _check_file(out_file or default_profile_path(target), "profile file")
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


def plan_table(plan: Any) -> Table:
    table = Table(title=f"plan for {escape(plan.model)}: predicted speedup over plain decoding")
    table.add_column("category")
    table.add_column("recommended")
    table.add_column("predicted", justify="right")
    for d in plan.drafts:
        table.add_column(f"{escape(d)}: best k, speedup, a_eff / a*", justify="right")

    def cell(c: Any) -> str:
        ok = c.effective_acceptance is not None and c.breakeven is not None and c.effective_acceptance > c.breakeven
        ae = "-" if c.effective_acceptance is None else f"{c.effective_acceptance:.2f}"
        return (f"k={c.k} {c.speedup:.2f}x{escape(interval_text(c.interval))} "
                f"[{'green' if ok else 'red'}]{ae}[/] / {breakeven_text(c)}")

    for row in plan_rows(plan):
        cells = draft_cells(row, plan.drafts, cell)
        table.add_row(escape(row["category"]), escape(row["recommended"]),
                      f"{row['predicted']:.2f}x{escape(interval_text(row['interval']))}", *cells)
    return table


def validation_table(validation: dict[str, Any]) -> Table:
    table = Table(title="validation: predicted against measured speedup (interleaved with plain)")
    for col in ("category", "draft", "k", "predicted [95%]", "measured", "error", "inside"):
        table.add_column(col, justify="left" if col in ("category", "draft") else "right")
    for c in validation["checks"]:
        table.add_row(escape(c["category"]), escape(c["draft"]), "-" if c["k"] is None else str(c["k"]),
                      f"{c['predicted']:.2f}x{escape(interval_text(c.get('interval')))}", f"{c['measured']:.2f}x",
                      f"{100 * c['error']:.1f}%", inside_text(c))
    return table


def _profile_for_plan(target: Any, keys: list[str], k_top: int, profile_file: Path | None) -> Profile:
    """The ``--profile`` file, or the cached profile, measured now (and cached) if it is missing
    or lacks a draft or a k. The cache folder is checked for writing before measuring."""
    path = profile_file or default_profile_path(target)
    profile = Profile.load(path) if (profile_file or path.exists()) else None
    if profile is not None:
        profile.check_model(target)  # its mode: dtype and --quant
        missing = [d for d in keys if not profile.has_draft(d)]
        if profile_file and missing:
            raise ConfigError(f"the profile {path} has no costs for {missing}; profile them with --draft")
        if profile_file and profile.max_n <= k_top:
            raise ConfigError(
                f"the profile {path} covers k <= {profile.max_n - 1}; narrow --ks or measure it again "
                f"with `draftwise profile --max-n {k_top + 1}`"
            )
        if not missing and profile.max_n > k_top:
            return profile
    _check_file(path, "profile file")
    err.print(f"measuring a profile for {target.name} (saved to {path})", highlight=False, markup=False)
    with progress_bar("profile") as report:
        profile = measure_profile(target, drafts=keys, max_n=max(16, k_top + 1), progress=report)
    profile.save(path)
    return profile


def plan_cmd(
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help="Your workload: Spec-Bench JSONL, or text with one prompt a line "
            "(default: the Spec-Bench dev questions shipped with draftwise).",
        ),
    ] = None,
    model: ModelOpt = "default",
    dtype: Annotated[DType, typer.Option("--dtype")] = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    drafts: Annotated[str, typer.Option("--drafts", help="Comma-separated draft specs.")] = "lookup,self",
    ks: Annotated[str, typer.Option("--ks", help="k values to consider, e.g. 1-8.")] = "1-8",
    per_category: Annotated[int, typer.Option("--per-category", min=1, help="Prompts sampled per category.")] = 2,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    profile_file: Annotated[Path | None, typer.Option("--profile", help="Profile JSON (default: cached, or measured now).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write plan.json, plan.md and plan.png here.")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Run the recommendations for real and compare.")] = False,
    validate_repeats: Annotated[int, typer.Option("--validate-repeats", min=1, help="Runs per generation when validating (best kept).")] = 2,
    pick: Annotated[Pick | None, typer.Option(
        "--pick", help="Rank candidates by the interval's low end or by the prediction "
        "(default: low with --temperature > 0, point in greedy mode).")] = None,
    sure: Annotated[bool, typer.Option(
        "--sure", help="Speculate only where the 95% interval's low end beats plain decoding.")] = False,
    export: Annotated[Engine | None, typer.Option("--export", help="Print the overall recommendation for a serving engine.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Recommend a draft and k per category of a workload, with the break-even acceptance of each."""
    with user_errors():
        questions = select_questions(read_questions(prompts or DEFAULT_QUESTIONS), per_category)
        specs = parse_drafts(drafts, "--drafts")
        k_list = parse_ks(ks)
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ConfigError(f"--temperature {temperature} must be a finite number >= 0 (0 = greedy)")
        if out_dir is not None:
            out_dir = out_dir.expanduser()
            if out_dir.exists() and not out_dir.is_dir():
                raise ConfigError(f"--out {out_dir} is a file; give a folder for plan.json, plan.md and plan.png")
            check_writable(out_dir, "--out folder")
        if profile_file is not None:
            Profile.load(profile_file)  # a missing or malformed profile fails before the model loads
        target = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        for spec in specs:  # unknown specs fail here, before any measuring (a model draft loads later)
            if spec.kind != "model":
                make_drafter(spec, target)
        keys = [str(s) for s in specs]
        profile = _profile_for_plan(target, keys, max(k_list), profile_file)
        with progress_bar("plan") as report:
            plan = make_plan(
                target, questions, profile, drafts=keys, ks=k_list, max_new_tokens=max_new_tokens,
                sampling=SamplingConfig(temperature=temperature), sure=sure,
                pick=pick.value if pick else None, progress=report,
            )
        plan.config["command"] = "draftwise " + " ".join(sys.argv[1:])
        plan.config["prompts_file"] = str(prompts) if prompts else "the Spec-Bench dev questions (draftwise.questions.DEFAULT_QUESTIONS)"
        if validate:
            best = plan.recommended["overall"]
            extra = [best] if best[0] != "none" else []
            with progress_bar("validate") as report:
                plan.validation = validate_plan(
                    target, plan, questions, extra=extra, repeats=validate_repeats, progress=report
                )
        if out_dir is not None:
            plan.save(out_dir / "plan.json")
            write_text_atomic(out_dir / "plan.md", render_plan_markdown(plan))
            if plotting_available():
                plot_plan(plan, out_dir / "plan.png")
            else:
                err.print(NO_PLOT.format(what="plan.png"), markup=False, highlight=False)
        exported = None
        if export is not None:
            d, k = plan.recommended["overall"]
            spec = DraftSpec.parse(d)
            if spec.kind == "model":  # engines need a real folder, also for model:default
                spec = DraftSpec.parse(f"model:{model_draft_source(spec.source or '', target)}")
            exported = export_config(spec, k, export.value, model=str(target.folder))
    if as_json:
        print(json.dumps(plan.to_dict(), indent=2))
        return
    out.print(plan_table(plan))
    d, k = plan.recommended["overall"]
    out.print(
        f"overall: [bold]{'no speculation' if d == 'none' else escape(f'{d} with k={k}')}[/] "
        f"(predicted {plan.predicted['overall']:.2f}x{escape(interval_text(plan.intervals.get('overall')))}); "
        f"routing each category to its own pick: {plan.routed_overall:.2f}x"
        f"{escape(interval_text(plan.routed_interval))}. a_eff: acceptance achieved; a*: needed to break even "
        "(green: above it); in brackets: 95% prediction intervals."
    )
    if plan.validation:
        v = plan.validation
        out.print(validation_table(v))
        out.print(validation_summary(v), highlight=False, markup=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir / 'plan.json'}, plan.md" + (", plan.png" if plotting_available() else ""),
                  highlight=False, markup=False)
    if exported is not None:
        out.print(exported, highlight=False, markup=False)
