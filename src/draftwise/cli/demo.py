"""``draftwise demo``: the README's main job, a short benchmark that ends in a recommendation.

On the embedded default model and a few dev questions, one from each Spec-Bench group (taken
from the questions held out of the shipped draft's training), it:

1. loads (or measures once) this machine's profile: T(n), each draft's D(k);
2. plans: traces the default drafts (:func:`draftwise.planner.defaults.default_drafts`: lookup
   and suffix), predicts every k and the adaptive k, recommends per category;
3. benchmarks plain decoding, each draft at its best k and ``auto`` (the plan's pick per
   category), interleaved prompt by prompt, checking that every output equals plain decoding;
4. prints, in 80 columns: each category's pick, the break-even acceptance of each draft against
   what it achieved, what was measured (both speedups, labelled) and the recommendation. The
   full tables are in ``--out``: plan.md (every draft in every category) and bench/summary.md
   (every group).

It needs nothing beside the installed package: the questions ship inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from draftwise.bench import run_bench
from draftwise.bench.methods import AUTO, BASELINE
from draftwise.bench.report import format_value
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
    plot_or_warn,
    progress_bar,
    user_errors,
)
from draftwise.errors import ConfigError
from draftwise.fsutil import (
    MARKER,
    claim_output_dir,
    is_owned_by,
    write_json_atomic,
    write_text_atomic,
)
from draftwise.planner.defaults import default_drafts
from draftwise.planner.plan import Plan, make_plan
from draftwise.planner.report import (
    best_per_draft,
    breakeven_text,
    interval_text,
    plan_rows,
    plot_plan,
    render_plan_markdown,
)
from draftwise.plots import plotting_available
from draftwise.policy.adaptive import resolve_profile
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    category_group,
    read_questions,
)
from draftwise.training.data import split_questions

COMMAND = "demo"


def picks_table(plan: Plan) -> Table:
    """Each category's pick and its prediction (every draft in every category is in plan.md)."""
    table = Table(title="plan: each category's pick (every draft, every category: plan.md)")
    table.add_column("category", overflow="fold")
    table.add_column("pick", overflow="fold")
    table.add_column("predicted [95%]", justify="right", no_wrap=True)
    for row in plan_rows(plan):
        table.add_row(plain(row["category"]), plain(row["recommended"]),
                      f"{row['predicted']:.2f}x{escape(interval_text(row['interval']))}")
    return table


def breakeven_table(plan: Plan) -> Table:
    """Per draft, overall: its best k, the acceptance it needs there and what it achieved."""
    table = Table(title="break-even: the acceptance each draft needs on this machine (a*) "
                  "and what it achieved (a_eff), all categories")
    table.add_column("draft", overflow="fold")
    for col in ("best\nk", "needs\na*", "achieved\na_eff", "predicted", "pays?"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, c in best_per_draft(plan, "overall").items():
        ae = "-" if c.effective_acceptance is None else f"{c.effective_acceptance:.2f}"
        table.add_row(plain(name), str(c.k), breakeven_text(c), ae, f"{c.speedup:.2f}x",
                      "[green]yes[/]" if c.speedup > 1.0 else "[red]no[/]")
    return table


def measured_table(summary: dict[str, Any]) -> Table:
    """Every method over all the questions, with both speedups, labelled (every group:
    bench/summary.md)."""
    run, eq = summary["run"], summary["equality"]
    table = Table(
        title=f"measured: {run['questions_finished']} questions, interleaved with plain decoding (none)",
        caption="speedup: mean tok/s is Spec-Bench's (each question's tok/s, averaged, over none's); "
        "total time is none's total time over the method's (what a user waiting for every answer "
        "sees). equal: turns identical to none. Every group: bench/summary.md",
        caption_justify="left",
    )
    table.add_column("method", overflow="fold")
    for col in ("k", "tok/s", "speedup:\nmean tok/s", "speedup:\ntotal time", "#MAT", "equal"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, row in summary["groups"].get("overall", {}).items():
        k = summary["config"]["drafts"].get(name, {}).get("k")
        same = eq["methods"].get(name) if eq.get("checked") else None
        table.add_row(
            plain(name.split("@k=")[0]), "-" if name in (BASELINE, AUTO) or k is None else str(k),
            format_value(row["tokens_per_s"], ".1f"), format_value(row["speedup"], ".2f", "x"),
            format_value(row.get("speedup_total_time"), ".2f", "x"), format_value(row["mat"], ".2f"),
            "-" if same is None else f"{same['equal']}/{same['total']}",
        )
    return table


def pick_questions(questions: Sequence[Question], count: int | None) -> list[Question]:
    """``count`` questions, round-robin over the groups (Spec-Bench's, or a category of one's
    own) in file order; None: one from each group.

    >>> qs = [Question(i, c, ("q",)) for i, c in enumerate(["writing", "math", "qa", "rag", "qa"])]
    >>> [q.question_id for q in pick_questions(qs, None)], [q.question_id for q in pick_questions(qs, 4)]
    ([0, 2, 3], [0, 2, 3, 1])
    """
    queues: dict[str, list[Question]] = {}  # groups in the order they first appear
    for q in questions:
        queues.setdefault(category_group(q.category), []).append(q)
    if count is None:
        count = len(queues)
    if count > len(questions):
        raise ConfigError(f"--num-questions {count} is more than the {len(questions)} questions there are")
    picked: list[Question] = []
    depth = 0
    while len(picked) < count:
        picked += [qs[depth] for qs in queues.values() if depth < len(qs)][: count - len(picked)]
        depth += 1
    return picked


def demo_questions(questions: Path | None, count: int | None) -> list[Question]:
    """The questions the demo runs: from ``questions``, or the held-out shipped dev questions."""
    if questions is not None:
        return pick_questions(read_questions(questions), count)
    # the dev questions the shipped draft was not trained on
    _, held = split_questions(read_questions(DEFAULT_QUESTIONS))
    return pick_questions(held, count)


def prepare_out(folder: Path) -> Path:
    """An empty folder for the demo's files: its own earlier output is replaced, anything else
    refused (checked before any work, so a bad ``--out`` fails in a second)."""
    folder = folder.expanduser()
    if folder.is_dir() and any(folder.iterdir()) and not is_owned_by(folder, COMMAND):
        raise ConfigError(
            f"{folder} already holds files `draftwise demo` did not make (it has no {MARKER}); "
            "pass a new or empty --out"
        )
    return claim_output_dir(folder, COMMAND, overwrite=True, holds="demo output")


def demo(
    model: ModelOpt = "default",
    dtype: Annotated[DType, typer.Option("--dtype")] = DType.float32,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    questions: Annotated[
        Path | None, typer.Option(help="Spec-Bench JSONL or one prompt a line (default: the shipped dev questions).")
    ] = None,
    num_questions: Annotated[
        int | None,
        typer.Option("--num-questions", min=1, help="How many questions to run, spread over the groups "
                     "(default: one from each Spec-Bench group)."),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where the plan and benchmark files go (replaced on a rerun).")
    ] = Path("out/demo"),
) -> None:
    """Profile, plan and benchmark on a handful of dev prompts; recommend a draft."""
    with user_errors():
        picked = demo_questions(questions, num_questions)
        out_dir = prepare_out(out_dir)
        target = load_with_status(
            model, dtype.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        drafts = default_drafts(target)  # what measured best: lookup, suffix and, with a shipped head, the hybrid
        with err.status("profile: loading, or measuring this machine once (about a minute) ..."):
            profile = resolve_profile(target, drafts)
        with progress_bar("plan") as report:
            plan = make_plan(target, picked, profile, drafts=drafts, ks=range(1, 9),
                             max_new_tokens=max_new_tokens, progress=report)
        plan.config["command"] = "draftwise demo"
        plan.save(out_dir / "plan.json")
        write_text_atomic(out_dir / "plan.md", render_plan_markdown(plan))
        # without matplotlib: one line here; run_bench then skips its plots as well
        plot_or_warn(plot_plan, plan, out_dir / "plan.png", label="the plots (plan.png, bench/*.png)")
        best = best_per_draft(plan, "overall")
        methods: list[Any] = [(d, best[d].k) for d in drafts if d in best] + ["auto"]
        summary = run_bench(
            target, picked, drafts=methods, max_new_tokens=max_new_tokens, out_dir=out_dir / "bench",
            plan=plan, dtype=dtype.value,
        )
        write_json_atomic(out_dir / "demo.json", {"plan": plan.to_dict(), "bench": _jsonable(summary)})
    out.print(picks_table(plan))
    out.print(breakeven_table(plan))
    out.print(measured_table(summary))
    print_recommendation(plan, summary)
    pngs = "plan.png, bench/*.png" if plotting_available() else "no plots"
    out.print(f"files: {plain(out_dir)}/plan.md, bench/summary.md, {pngs}", highlight=False)


def print_recommendation(plan: Plan, summary: dict[str, Any]) -> None:
    """The plan's overall pick and the routed (per-category) prediction, with what was measured."""
    d, k = plan.recommended["overall"]
    routed = summary["groups"]["overall"].get(AUTO, {})
    measured = ""
    if routed.get("speedup"):
        total = format_value(routed.get("speedup_total_time"), ".2f", "x")
        measured = f", measured {routed['speedup']:.2f}x (mean tok/s) and {total} (total time)"
    pick = "no speculation" if d == "none" else f"--draft {plain(d)} --k {k}"
    out.print(
        f"recommendation for this workload: [bold]{pick}[/] (predicted {plan.predicted['overall']:.2f}x"
        f"{escape(interval_text(plan.intervals.get('overall')))}); each category its own pick (--drafts auto): "
        f"predicted {plan.routed_overall:.2f}x{escape(interval_text(plan.routed_interval))}{measured}; "
        "in brackets: 95% prediction intervals"
    )


def _jsonable(data: Any) -> Any:
    """``data`` with anything JSON cannot hold (paths, say) as a string."""
    if isinstance(data, dict):
        return {str(key): _jsonable(v) for key, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_jsonable(v) for v in data]
    return data if data is None or isinstance(data, (str, int, float, bool)) else str(data)
