"""``draftwise plan``: predict each draft's speedup on a workload and recommend a draft and k.

Every output place is checked for writing, and every input file read, before the model loads;
every file is written atomically. Bad input (a binary or wrongly shaped profile or prompt file,
a bad draft spec) is one line and exit status 2. ``draftwise profile`` is in
:mod:`draftwise.cli.profile`.
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

from draftwise.bench import remote
from draftwise.capacity.plan import (
    DEFAULT_CONCURRENCY,
    REQUESTS_PER_CLIENT,
    check_fits,
    parse_concurrency,
    render_concurrency_markdown,
    run_concurrency,
)
from draftwise.capacity.remote_plan import render_markdown as render_remote_markdown
from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    DType,
    DTypeOpt,
    ModelOpt,
    Quant,
    QuantOpt,
    ThreadsOpt,
    command_line,
    err,
    load_with_status,
    out,
    output_file,
    parse_drafts,
    plot_or_warn,
    progress_bar,
    read_profile,
    user_errors,
)
from draftwise.cli.serve import SERVE_EXTRA
from draftwise.core.sampling import SamplingConfig
from draftwise.cost.measure import measure_profile
from draftwise.cost.parsing import parse_ks
from draftwise.cost.profile import Profile, default_profile_path
from draftwise.drafters import make_drafter
from draftwise.drafters.factory import model_draft_source
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.fsutil import check_writable, write_text_atomic
from draftwise.planner.defaults import default_drafts, default_drafts_text
from draftwise.planner.export import export_config
from draftwise.planner.plan import DEFAULT_SAMPLES, NONE, Plan, check_samples, make_plan
from draftwise.planner.report import (
    breakeven_text,
    inside_text,
    interval_text,
    noise_text,
    plan_rows,
    plot_plan,
    plot_samples,
    render_plan_markdown,
    validation_summary,
)
from draftwise.planner.validate import validate_plan
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    read_questions,
    select_questions,
)


class Pick(str, Enum):
    low = "low"
    point = "point"


class Engine(str, Enum):
    vllm = "vllm"
    sglang = "sglang"
    hf = "hf"


def plan_table(plan: Any) -> Table:
    """One row per category and draft (at its best k), the category's pick marked: six narrow
    columns, so the table reads in an 80-column terminal however many drafts were planned."""
    table = Table(title=f"plan for {escape(plan.model)}: predicted speedup over plain decoding")
    table.add_column("category / draft", overflow="fold")
    for col in ("k", "predicted [95%]", "a_eff", "a*", "pick"):
        table.add_column(col, justify="right", no_wrap=True)
    for i, row in enumerate(plan_rows(plan)):
        if i:
            table.add_section()
        pick = tuple(plan.recommended[row["category"]])
        table.add_row(f"[bold]{escape(row['category'])}[/]")
        for d in plan.drafts:
            c = row["drafts"].get(d)
            if c is None:
                table.add_row(f"  {escape(d)}", "-", "-", "-", "-", "")
                continue
            ok = c.effective_acceptance is not None and c.breakeven is not None and c.effective_acceptance > c.breakeven
            ae = "-" if c.effective_acceptance is None else f"{c.effective_acceptance:.2f}"
            table.add_row(f"  {escape(d)}", str(c.k), f"{c.speedup:.2f}x{escape(interval_text(c.interval))}",
                          f"[{'green' if ok else 'red'}]{ae}[/]", breakeven_text(c),
                          _PICKED if pick == (d, c.k) else "")
        if pick[0] == NONE:  # no draft beats plain decoding here
            table.add_row("  none (plain)", "-", f"{row['predicted']:.2f}x", "-", "-", _PICKED)
    return table


_PICKED = "[bold green]<-[/]"


def validation_table(validation: dict[str, Any]) -> Table:
    table = Table(title="validation: predicted against measured speedup (interleaved with plain)")
    noisy = validation.get("median_noise") is not None  # repeats >= 2: the measurement's own noise
    for col in ("category", "draft", "k", "predicted [95%]", "measured", "error", *(["noise"] if noisy else []),
                "inside"):
        table.add_column(col, justify="left" if col in ("category", "draft") else "right", overflow="fold")
    for c in validation["checks"]:
        table.add_row(escape(c["category"]), escape(c["draft"]), "-" if c["k"] is None else str(c["k"]),
                      f"{c['predicted']:.2f}x{escape(interval_text(c.get('interval')))}", f"{c['measured']:.2f}x",
                      f"{100 * c['error']:.1f}%", *([noise_text(c)] if noisy else []), inside_text(c))
    return table


def _parse_ks(text: str) -> list[int]:
    """``--ks``: :func:`~draftwise.cost.parsing.parse_ks`, its messages naming ``--ks``."""
    try:
        return parse_ks(text)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("--k "):  # parse_ks speaks for breakeven's --k
            message = "--ks " + message.removeprefix("--k ")
        raise ConfigError(message) from None


def _check_options(temperature: float, out_dir: Path | None) -> Path | None:
    """The options checked before the model loads; returns the ``--out`` folder, created."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"--temperature {temperature} must be a finite number >= 0 (0 = greedy)")
    if out_dir is None:
        return None
    out_dir = out_dir.expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a folder for plan.json, plan.md and plan.png")
    return check_writable(out_dir, "--out folder")


def _profile_for_plan(
    target: Any, keys: list[str], k_top: int, given: Profile | None, profile_file: Path | None
) -> Profile:
    """The ``--profile`` file (``given``, already read), or the cached profile, measured now (and
    cached) if it is missing or lacks a draft or a k. The cache folder is checked for writing
    before measuring."""
    path = profile_file.expanduser() if profile_file else default_profile_path(target)
    profile = given if profile_file else (Profile.load(path) if path.exists() else None)
    if profile is not None and not profile_file and not profile.same_machine():
        profile = None  # the cache holds another machine's costs (a shared home folder): measure here
    if profile is not None:
        profile.check_model(target)  # its mode: dtype and --quant
        missing = [d for d in keys if not profile.has_draft(d)]
        if not profile_file:  # a cached profile's costs of another variant are measured again
            missing += profile.stale_drafts(keys)
        if profile_file and missing:
            raise ConfigError(f"the profile {path} has no costs for {missing}; profile them with --draft")
        if profile_file and (stale := profile.stale_drafts(keys)):  # used as given, but said
            err.print(f"note: the profile {path} timed {', '.join(stale)} in another weight format than "
                      "this machine drafts in now; measure it again (`draftwise profile`) to price what runs",
                      highlight=False, markup=False)
        if profile_file and profile.max_n <= k_top:
            raise ConfigError(
                f"the profile {path} covers k <= {profile.max_n - 1}; narrow --ks or measure it again "
                f"with `draftwise profile --max-n {k_top + 1}`"
            )
        if not missing and profile.max_n > k_top:
            return profile
    output_file(path, "profile file")
    err.print(f"measuring a profile for {target.name} (saved to {path})", highlight=False, markup=False)
    with progress_bar("profile") as report:
        profile = measure_profile(target, drafts=keys, max_n=max(16, k_top + 1), progress=report)
    profile.save(path)
    return profile


def _load_test(concurrency: list[int], questions: list[Question]) -> Any:
    """``--concurrency --validate``: the load test's module (:mod:`draftwise.server.validate`, the
    ``serve`` extra), after checking what it will need of the grid and the dev questions: the
    plan traces ``questions``, and the load test sends others."""
    try:
        from draftwise.server import validate as load_test
    except ImportError as exc:
        raise ConfigError(f"--concurrency --validate serves the plan: {SERVE_EXTRA} ({exc})") from None
    load_test.check_options(concurrency, seen=[q.question_id for q in questions],
                            requests_per_client=REQUESTS_PER_CLIENT)
    return load_test


def _serve_profile() -> Any:
    """The served step's measurement (:mod:`draftwise.server.served_profile`), or None where the
    serve extra is not installed (the passes alone are priced, and a note says so)."""
    try:
        from draftwise.server.served_profile import resolve_served_profile
    except ImportError as exc:
        err.print(f"note: pricing the passes alone, not the served step: {SERVE_EXTRA} ({exc})", highlight=False,
                  markup=False)
        return None
    return resolve_served_profile


def _validate(target: Any, plan: Plan, questions: list[Question], repeats: int, seeds: int | None) -> None:
    """Run the recommendations (and the overall pick) for real; the result goes in the plan."""
    best = plan.recommended["overall"]
    extra = [best] if best[0] != "none" else []
    with progress_bar("validate") as report:
        plan.validation = validate_plan(target, plan, questions, extra=extra, repeats=repeats, seeds=seeds,
                                        progress=report)


def _write_plan(plan: Plan, out_dir: Path) -> list[str]:
    """plan.json, plan.md and (with matplotlib) plan.png in ``out_dir``; the names written."""
    plan.save(out_dir / "plan.json")
    write_text_atomic(out_dir / "plan.md", render_plan_markdown(plan))
    png = plot_or_warn(plot_plan, plan, out_dir / "plan.png", label="plan.png")
    samples = plot_or_warn(plot_samples, plan, out_dir / "plan_samples.png", plan.validation,
                           label="plan_samples.png")
    return ["plan.json", "plan.md"] + (["plan.png"] if png else []) + (["plan_samples.png"] if samples else [])


def _export(plan: Plan, target: Any, engine: Engine) -> str:
    """The overall recommendation as ``engine``'s configuration (engines take a fixed k: for an
    ``auto`` pick, the draft's best fixed k overall)."""
    d, k = plan.recommended["overall"]
    if k == "auto":
        k = next(c.k for c in plan.categories["overall"] if c.draft == d and isinstance(c.k, int))
    spec = DraftSpec.parse(d)
    if spec.kind == "model":  # engines need a real folder, also for model:default
        spec = DraftSpec.parse(f"model:{model_draft_source(spec.source or '', target)}")
    return export_config(spec, k, engine.value, model=str(target.folder))


def _print_plan(plan: Plan, out_dir: Path | None, written: list[str], exported: str | None) -> None:
    out.print(plan_table(plan))
    d, k = plan.recommended["overall"]
    out.print(
        f"overall: [bold]{'no speculation' if d == 'none' else escape(f'{d} with k={k}')}[/] "
        f"(predicted {plan.predicted['overall']:.2f}x{escape(interval_text(plan.intervals.get('overall')))}); "
        f"routing each category to its own pick: {plan.routed_overall:.2f}x"
        f"{escape(interval_text(plan.routed_interval))}. a_eff: acceptance achieved; a*: needed to break even "
        "(green: above it); <-: the category's pick; in brackets: 95% prediction intervals."
    )
    for category, note in plan.notes.items():
        out.print(f"{category}: {note}", highlight=False, markup=False)
    if plan.validation:
        out.print(validation_table(plan.validation))
        out.print(validation_summary(plan.validation), highlight=False, markup=False)
        for note in plan.validation.get("notes") or []:
            out.print(f"note: {note}", highlight=False, markup=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir / written[0]}, {', '.join(written[1:])}", highlight=False, markup=False)
    if exported is not None:
        out.print(exported, highlight=False, markup=False)


PromptsOpt = Annotated[Path | None, typer.Option(
    "--prompts", help="Your workload: Spec-Bench JSONL, or text with one prompt a line "
    "(default: the Spec-Bench dev questions shipped with draftwise).")]
PickOpt = Annotated[Pick | None, typer.Option(
    "--pick", help="Rank candidates by the interval's low end or by the prediction "
    "(default: low with --temperature > 0, point in greedy mode).")]
SureOpt = Annotated[bool, typer.Option(
    "--sure", help="Speculate only where the 95% interval's low end beats plain decoding.")]
DraftsOpt = Annotated[str | None, typer.Option(
    "--drafts", help="Comma-separated draft specs.", show_default=default_drafts_text())]
SamplesOpt = Annotated[int | None, typer.Option(
    "--samples", help="With --temperature > 0: continuations decoded per prompt, each its own seed; "
    f"the intervals come from their spread. [default: {DEFAULT_SAMPLES}]", show_default=False)]
ValidateSeedsOpt = Annotated[int | None, typer.Option(
    "--validate-seeds", min=1, help="With sampling: seeds per prompt when validating, none of them the "
    "plan's (default: as many as --samples).", show_default=False)]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", help="Also predict throughput at these numbers of concurrent requests, e.g. 1,2,4,8,16 "
    "(batched passes; writes concurrency.json/.md/.png in --out; with --validate, load-tests a server at each; "
    "with --engine, the grid of the engine's plan).")]
# `plan --engine vllm`: measure running servers of the engine over HTTP (draftwise.bench.remote)
EngineOpt = Annotated[Engine | None, typer.Option(
    "--engine", help="Plan for this engine's servers, measured over HTTP (vllm; needs --url and --spec-url); "
    "no model loads here.")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="With --engine: the plain server, e.g. http://localhost:8000.")]
SpecUrlOpt = Annotated[str | None, typer.Option(
    "--spec-url", help="With --engine: a server of the same model started with --speculative-config.")]
ValidateUrlOpt = Annotated[str | None, typer.Option(
    "--validate-url", help="With --engine: a server started with the recommendation, measured against plain at "
    "every N (implies --validate).")]
MeasureAtOpt = Annotated[str | None, typer.Option(
    "--measure-at", help="With --engine: the N measured to fit the model (default: the smallest, the one "
    "nearest 4, the largest); --validate measures every N.")]
SpecConfigOpt = Annotated[str | None, typer.Option(
    "--spec-config", help="With --engine: the JSON --speculative-config the --spec-url server was started with "
    "(completes the recommended command).")]


def _plan_remote(engine: Engine | None, urls: tuple[str | None, str | None, str | None], spec_config: str | None,
                 measure_at: str | None, concurrency: str | None, prompts: Path | None, per_category: int,
                 max_new_tokens: int, validate: bool, out_dir: Path | None, as_json: bool) -> None:
    """``plan --engine vllm --url PLAIN --spec-url SPEC``: measure the running servers over HTTP,
    fit, predict each N and recommend (:mod:`draftwise.bench.remote`); no model loads here."""
    url, spec_url, validate_url = urls
    with user_errors():
        if engine is None:
            raise ConfigError("--url, --spec-url, --validate-url, --measure-at and --spec-config plan for a running "
                              "engine's servers: add --engine vllm")
        if engine is not Engine.vllm:
            raise ConfigError(f"--engine {engine.value}: only vllm servers can be measured; use --export "
                              f"{engine.value} for its options")
        if url is None or spec_url is None:
            raise ConfigError("--engine vllm plans by measuring running servers of one model: give --url PLAIN_URL "
                              "(no speculation) and --spec-url SPEC_URL (started with --speculative-config)")
        questions = select_questions(read_questions(prompts or DEFAULT_QUESTIONS), per_category)
        ns = parse_concurrency(concurrency) if concurrency is not None else list(DEFAULT_CONCURRENCY)
        at = remote.parse_measure_at(measure_at) if measure_at is not None else None
        config = remote.parse_spec_config(spec_config)
        out_dir = _check_options(0.0, out_dir)
        result = remote.plan_vllm(
            url, spec_url, prompts=[q.turns[0] for q in questions], concurrency=ns, measure_at=at,
            max_tokens=max_new_tokens, validate=validate, validate_url=validate_url, spec_config=config,
            status=lambda line: err.print(line, highlight=False, markup=False))
        result["config"].update(command=command_line(), prompts_file=str(prompts) if prompts else
                                "the Spec-Bench dev questions (draftwise.questions.DEFAULT_QUESTIONS)")
        written = remote.write_remote_plan(result, out_dir, warn=lambda line: err.print(
            line, highlight=False, markup=False)) if out_dir is not None else []
    if as_json:
        print(json.dumps(result, indent=2))
        return
    out.print(render_remote_markdown(result), highlight=False, markup=False, soft_wrap=True)  # the command, unbroken
    if out_dir is not None:
        out.print(f"wrote {out_dir / written[0]}, {', '.join(written[1:])}", highlight=False, markup=False)


def plan_cmd(
    prompts: PromptsOpt = None,
    model: ModelOpt = "default",
    dtype: DTypeOpt = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    drafts: DraftsOpt = None,
    ks: Annotated[str, typer.Option("--ks", help="k values to consider, e.g. 1-8.")] = "1-8",
    per_category: Annotated[int, typer.Option("--per-category", min=1, help="Prompts sampled per category.")] = 2,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    samples: SamplesOpt = None,
    auto_k: Annotated[bool, typer.Option(
        "--k-auto/--no-k-auto", "--auto/--no-auto",
        help="Weigh the adaptive k (--k auto) against every fixed k (--auto: the older name).")] = True,
    profile_file: Annotated[Path | None, typer.Option("--profile", help="Profile JSON (default: cached, or measured now).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write plan.json, plan.md and plan.png here.")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Run the recommendations for real and compare.")] = False,
    validate_repeats: Annotated[int, typer.Option("--validate-repeats", min=1, help="Runs per generation when validating (best kept).")] = 2,
    validate_seeds: ValidateSeedsOpt = None,
    pick: PickOpt = None,
    sure: SureOpt = False,
    export: Annotated[Engine | None, typer.Option("--export", help="Print the overall recommendation for a serving engine.")] = None,
    concurrency: ConcurrencyOpt = None,
    served_step: Annotated[bool, typer.Option(
        "--served-step/--passes-only", help="With --concurrency: price each step as draftwise serve runs it, "
        "measured once on this machine (the serve extra; cached beside the batch profile), or the passes alone."
    )] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    engine: EngineOpt = None, url: UrlOpt = None, spec_url: SpecUrlOpt = None, validate_url: ValidateUrlOpt = None,
    measure_at: MeasureAtOpt = None, spec_config: SpecConfigOpt = None,
) -> None:
    """Recommend a draft and k per category of a workload, with the break-even acceptance of each."""
    if any(v is not None for v in (engine, url, spec_url, validate_url, measure_at, spec_config)):  # over HTTP
        return _plan_remote(engine, (url, spec_url, validate_url), spec_config, measure_at, concurrency, prompts,
                            per_category, max_new_tokens, validate, out_dir, as_json)
    with user_errors():
        questions = select_questions(read_questions(prompts or DEFAULT_QUESTIONS), per_category)
        specs = parse_drafts(drafts, "--drafts") if drafts is not None else None
        k_list = _parse_ks(ks)
        out_dir = _check_options(temperature, out_dir)
        ns = parse_concurrency(concurrency) if concurrency is not None else None
        if ns is not None and out_dir is None:
            raise ConfigError("--concurrency writes concurrency.json, .md and .png: give --out DIR")
        load_test = _load_test(ns, questions) if ns is not None and validate else None
        given_samples, samples = samples, DEFAULT_SAMPLES if samples is None else samples
        check_samples(samples, SamplingConfig(temperature=temperature))
        if given_samples is not None and samples > 1 and temperature == 0:
            err.print(f"note: --samples {samples} at temperature 0 decodes one continuation per prompt: greedy "
                      "continuations are all the same", highlight=False, markup=False)
        given = read_profile(profile_file) if profile_file is not None else None  # fails before the model loads
        target = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        if specs is None:  # the defaults depend on the model: a shipped head adds the hybrid
            specs = [DraftSpec.parse(d) for d in default_drafts(target, temperature)]
        for spec in specs:  # unknown specs fail here, before any measuring (a model draft loads later)
            if spec.kind != "model":
                make_drafter(spec, target)
        keys = [str(s) for s in specs]
        if ns is not None:  # each N's cache fits
            check_fits(target, ns)
        profile = _profile_for_plan(target, keys, max(k_list), given, profile_file)
        with progress_bar("plan") as report:
            plan = make_plan(
                target, questions, profile, drafts=keys, ks=k_list, max_new_tokens=max_new_tokens,
                sampling=SamplingConfig(temperature=temperature), samples=samples, auto=auto_k, sure=sure,
                pick=pick.value if pick else None, progress=report,
            )
        plan.config["command"] = "draftwise " + " ".join(sys.argv[1:])
        plan.config["prompts_file"] = str(prompts) if prompts else "the Spec-Bench dev questions (draftwise.questions.DEFAULT_QUESTIONS)"
        if validate:
            _validate(target, plan, questions, validate_repeats, validate_seeds)
        written = _write_plan(plan, out_dir) if out_dir is not None else []
        capacity = None
        if ns is not None and out_dir is not None:
            capacity = run_concurrency(
                target, plan, ns, out_dir=out_dir, profile=profile, validate=load_test is not None,
                plan_path=out_dir / "plan.json", max_new_tokens=max_new_tokens,
                requests_per_client=REQUESTS_PER_CLIENT, export=[export.value] if export is not None else [],
                status=lambda line: err.print(line, highlight=False, markup=False),
                measure=load_test.measure_concurrency if load_test is not None else None,
                serve_profile=_serve_profile() if served_step else None,
            )
            written += ["concurrency.json", "concurrency.md"]
        exported = _export(plan, target, export) if export is not None else None
    if as_json:
        print(json.dumps(plan.to_dict(), indent=2))
        return
    _print_plan(plan, out_dir, written, exported)
    if capacity is not None:
        out.print(render_concurrency_markdown(capacity), highlight=False, markup=False)
