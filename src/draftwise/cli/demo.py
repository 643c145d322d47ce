"""``draftwise demo``: the README's main job, a short benchmark that ends in a recommendation.

On the embedded default model and one dev prompt from each Spec-Bench group (from the
questions held out of the shipped draft's training) it:

1. loads (or measures once) this machine's profile: T(n), each draft's D(k);
2. plans: traces lookup, self-speculation and the shipped distilled draft (``model:default``,
   when one ships for the model), predicts every k, recommends per category;
3. benchmarks plain decoding, each draft at its best k and ``auto`` (the plan's pick per
   category), interleaved prompt by prompt, checking that every output equals plain decoding;
4. prints the table, the break-even acceptance of each draft against what it achieved, and the
   recommendation. Everything is written to ``--out``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import DType, ModelOpt, err, load_with_status, out, progress_bar, user_errors
from .plan import plan_table


def breakeven_table(plan) -> Table:  # type: ignore[no-untyped-def]
    """Per draft, overall: its best k, the acceptance it needs there and what it achieved."""
    from ..cost.report import best_per_draft, breakeven_text

    table = Table(title="break-even: the acceptance each draft needs on this machine vs what it achieved")
    for col in ("draft", "best k", "needs a* >=", "achieved a_eff", "raw acceptance", "predicted", "pays?"):
        table.add_column(col, justify="left" if col == "draft" else "right")
    for name, c in best_per_draft(plan, "overall").items():
        be = breakeven_text(c)
        ae = "-" if c.effective_acceptance is None else f"{c.effective_acceptance:.2f}"
        raw = "-" if c.acceptance is None else f"{c.acceptance:.2f}"
        pays = c.speedup > 1.0
        table.add_row(name, str(c.k), be, ae, raw, f"{c.speedup:.2f}x",
                      "[green]yes[/]" if pays else "[red]no[/]")
    return table


def demo(
    model: ModelOpt = "default",
    dtype: Annotated[DType, typer.Option("--dtype")] = DType.float32,
    questions: Annotated[Path | None, typer.Option(help="Spec-Bench JSONL (default: the dev questions).")] = None,
    per_group: Annotated[int, typer.Option("--per-group", min=1, help="Prompts per Spec-Bench group.")] = 1,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the plan and benchmark files go.")] = Path("out/demo"),
) -> None:
    """Profile, plan and benchmark on a handful of dev prompts; recommend a draft."""
    from ..bench.harness import GROUPS, category_group, read_questions, render_markdown, run_bench
    from ..bench.runtime import DEFAULT_QUESTIONS
    from ..cost.adaptive import resolve_profile
    from ..cost.plan import make_plan
    from ..cost.report import plot_plan, render_plan_markdown

    with user_errors():
        rows = read_questions(questions or DEFAULT_QUESTIONS)
        if questions is None:  # the dev questions the shipped draft was not trained on
            from ..distill.data import split_questions

            _, held = split_questions([{"category": q.category, "index": i} for i, q in enumerate(rows)])
            rows = [rows[r["index"]] for r in held]
        picked, taken = [], {g: 0 for g in GROUPS}
        for q in rows:
            g = category_group(q.category)
            if taken[g] < per_group:
                taken[g] += 1
                picked.append(q)
        target = load_with_status(model, dtype.value)
        from ..drafters.packs import shipped_pack

        drafts = ["lookup", "self"] + (["model:default"] if shipped_pack(target) is not None else [])
        with err.status("profile: loading, or measuring this machine once (about a minute) ..."):
            profile = resolve_profile(target, drafts)
        plan_rows = [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in picked]
        with progress_bar("plan") as report:
            plan = make_plan(target, plan_rows, profile, drafts=drafts, ks=range(1, 9),
                             max_new_tokens=max_new_tokens, progress=report)
        plan.config["command"] = "draftwise demo"
        out_dir.mkdir(parents=True, exist_ok=True)
        plan.save(out_dir / "plan.json")
        (out_dir / "plan.md").write_text(render_plan_markdown(plan))
        plot_plan(plan, out_dir / "plan.png")
        from ..cost.report import best_per_draft

        best = best_per_draft(plan, "overall")
        methods = [(d, best[d].k) for d in drafts if d in best] + ["auto"]
        summary = run_bench(
            target, picked, drafts=methods, max_new_tokens=max_new_tokens, out_dir=out_dir / "bench",
            plan=plan, dtype=dtype.value,
        )
    out.print(render_markdown(summary), highlight=False, markup=False)
    out.print(plan_table(plan))
    out.print(breakeven_table(plan))
    d, k = plan.recommended["overall"]
    routed = summary["groups"]["overall"].get("auto", {}).get("speedup")
    measured = f", measured {routed:.2f}x" if routed else ""
    out.print(
        f"recommendation for this workload: [bold]{'no speculation' if d == 'none' else f'--draft {d} --k {k}'}[/]"
        f" (predicted {plan.predicted['overall']:.2f}x); each category its own pick (--drafts auto): "
        f"predicted {plan.routed_overall:.2f}x{measured}"
    )
    out.print(f"files: {out_dir}/plan.md, plan.png, bench/summary.md, bench/*.png", highlight=False)
    (out_dir / "demo.json").write_text(json.dumps({"plan": plan.to_dict(), "bench": summary}, indent=2, default=str))
