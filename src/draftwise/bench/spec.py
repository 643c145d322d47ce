"""Speculative decoding against draftwise's own plain decoding, per task category.

Every method runs on the same prompts, interleaved prompt by prompt with the plain baseline (the
order rotates), in one process, so that a shared machine's noise hits all methods alike.
Speedup = mean tokens/s of the method / mean tokens/s of plain decoding (Spec-Bench's
convention); #MAT = mean committed tokens per target pass, bonus included. In greedy mode every
method's output is compared with the baseline's token for token.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def _group_rows(rows: Sequence[dict[str, Any]], per_category: int) -> list[dict[str, Any]]:
    taken: dict[str, int] = {}
    out = []
    for row in rows:
        c = str(row.get("category", "uncategorised"))
        if taken.get(c, 0) < per_category:
            taken[c] = taken.get(c, 0) + 1
            out.append(row)
    return out


def run_spec_benchmark(
    *,
    model: str = "default",
    questions: str | Path,
    methods: Sequence[tuple[str, int]] = (("lookup", 4), ("self", 4)),
    per_category: int = 2,
    max_new_tokens: int = 128,
    dtype: str = "float32",
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run plain decoding and every ``(draft spec, k)`` method on ``per_category`` prompts of
    each category; return (and optionally write) the per-category summary."""
    from rich.progress import Progress

    from ..decode import generate
    from ..drafters import make_drafter
    from ..loaders import load_model
    from .runtime import load_questions

    if per_category < 1:
        raise ConfigError(f"per_category={per_category} must be >= 1")
    rows = _group_rows(load_questions(questions), per_category)
    target = load_model(model, dtype=dtype)  # type: ignore[arg-type]
    drafters = {f"{spec}@k={k}": (make_drafter(spec, target), k) for spec, k in methods}
    names = ["none", *drafters]
    records: list[dict[str, Any]] = []
    generate(target, "warm up", max_new_tokens=4)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("bench", total=len(rows) * len(names))
        for qi, row in enumerate(rows):
            prompt_ids = target.encode_prompt(row["turns"][0])
            order = names[qi % len(names) :] + names[: qi % len(names)]
            results: dict[str, Any] = {}
            for name in order:
                drafter, k = drafters.get(name, (None, 1))
                res = generate(target, prompt_ids, max_new_tokens=max_new_tokens, draft=drafter, k=k)
                results[name] = res
                bar.update(
                    task, advance=1,
                    description=f"{name:>16} q{row.get('question_id')} {res.tokens_per_second:5.1f} tok/s",
                )
            base = results["none"].token_ids
            for name, res in results.items():
                first_diff = next(
                    (i for i, (a, b) in enumerate(zip(res.token_ids, base)) if a != b),
                    None if len(res.token_ids) == len(base) else min(len(res.token_ids), len(base)),
                )
                records.append(
                    {
                        "question_id": row.get("question_id"),
                        "category": row.get("category"),
                        "method": name,
                        "new_tokens": res.new_tokens,
                        "wall_time": res.seconds,
                        "tokens_per_s": res.tokens_per_second,
                        "mat": res.stats.mean_committed_per_pass,
                        "proposed": res.stats.proposed,
                        "accepted": res.stats.accepted,
                        "draft_seconds": res.stats.draft_seconds,
                        "equal_to_plain": first_diff is None,
                        "first_divergence": first_diff,
                    }
                )
    summary = summarise(records, names)
    report = {
        "config": {
            "model": model, "dtype": dtype, "max_new_tokens": max_new_tokens,
            "per_category": per_category, "methods": names, "questions": str(questions),
            "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "summary": summary,
        "records": records,
    }
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "spec_vs_plain.json").write_text(json.dumps(report, indent=2))
        (out / "spec_vs_plain.md").write_text(render_markdown(report))
    return report


def summarise(records: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per category (and ``overall``) and method: tokens/s, speedup, #MAT, acceptance, equality."""
    cats = sorted({r["category"] for r in records}) + ["overall"]
    out: dict[str, dict[str, Any]] = {}
    for c in cats:
        rows = [r for r in records if c == "overall" or r["category"] == c]
        base_tps = statistics.mean(r["tokens_per_s"] for r in rows if r["method"] == "none")
        out[c] = {}
        for name in names:
            mine = [r for r in rows if r["method"] == name]
            proposed = sum(r["proposed"] for r in mine)
            tps = statistics.mean(r["tokens_per_s"] for r in mine)
            out[c][name] = {
                "tokens_per_s": tps,
                "speedup": tps / base_tps,
                "mat": statistics.mean(r["mat"] for r in mine),
                "acceptance": sum(r["accepted"] for r in mine) / proposed if proposed else None,
                "equal": sum(r["equal_to_plain"] for r in mine),
                "prompts": len(mine),
            }
    return out


def render_markdown(report: dict[str, Any]) -> str:
    cfg, summary = report["config"], report["summary"]
    methods = [m for m in cfg["methods"] if m != "none"]
    lines = [
        f"Speculative vs plain decoding, {cfg['model']} ({cfg['dtype']}), greedy, "
        f"{cfg['max_new_tokens']} new tokens, {cfg['per_category']} prompt(s) per category, "
        f"{cfg['date']}.",
        "",
        "Each cell: speedup over plain draftwise decoding / #MAT (mean committed tokens per "
        "target pass). Plain tokens/s in the second column.",
        "",
        "| category | plain tok/s | " + " | ".join(methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for cat, row in summary.items():
        cells = [f"{row[m]['speedup']:.2f}x / {row[m]['mat']:.2f}" for m in methods]
        lines.append(f"| {cat} | {row['none']['tokens_per_s']:.1f} | " + " | ".join(cells) + " |")
    overall = summary["overall"]
    eq = ", ".join(f"{m}: {overall[m]['equal']}/{overall[m]['prompts']}" for m in methods)
    lines += ["", f"Outputs equal to plain greedy: {eq}.", "", f"Command: `{cfg['command']}`", ""]
    return "\n".join(lines)
