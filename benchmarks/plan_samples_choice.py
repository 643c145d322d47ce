"""How many continuations per prompt a sampled plan needs (``plan --samples``), measured.

Reads a plan made with many continuations per prompt (``plan --temperature T --samples 8``).
For each category's pick (its top candidate where it decodes plainly) it takes the per-unit predicted speedups (``samples`` in plan.json),
measures their spread between continuations of the same prompt (the pooled within-prompt
standard deviation sigma, relative to the mean), and computes what a plan with S continuations
would miss by against a validation with S new ones: the mean absolute error of a difference of
two means of S draws, sqrt(2 / S) * sigma * sqrt(2 / pi), as a share of the speedup. It also
resamples the units directly (a plan's S against a rerun's S, drawn without overlap from the
units there are) as a check on that formula.

    python benchmarks/plan_samples_choice.py PLAN_DIR --out benchmarks/results/plan-samples
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np

from draftwise.planner.plan import load_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="1,2,3,4,6,8")
    args = ap.parse_args()
    plan = load_plan(args.plan)
    s_total = int(plan.config.get("samples", 1))
    if s_total < 4:
        raise SystemExit(f"the plan has {s_total} continuations per prompt; make one with --samples 8")
    sizes = [int(x) for x in args.sizes.split(",")]
    units = [(p["question_id"], p["category"]) for p in plan.prompts]
    rng = np.random.default_rng(0)
    rows = []
    for cat, cands in plan.categories.items():
        if cat == "overall":
            continue
        d, k = plan.recommended[cat]
        best = next((c for c in cands if (c.draft, c.k) == (d, k)), cands[0])  # the pick (or the top, if none)
        mine = [(q, v) for (q, c), v in zip([u for u in units if u[1] == cat], best.samples or [])]
        by_prompt: dict[object, list[float]] = {}
        for q, v in mine:
            by_prompt.setdefault(q, []).append(v)
        mean = statistics.mean(v for _, v in mine)
        within = [statistics.pvariance(vs) * len(vs) / (len(vs) - 1) for vs in by_prompt.values() if len(vs) > 1]
        sigma = math.sqrt(statistics.mean(within)) / mean if within else 0.0
        row = {"category": cat, "pick": f"{best.draft} k={best.k}", "mean_unit_speedup": mean, "rel_sd": sigma,
               "formula": {}, "resampled": {}}
        for s in sizes:
            row["formula"][s] = math.sqrt(2 / s) * sigma * math.sqrt(2 / math.pi)
            if 2 * s <= s_total:
                errs = []
                for _ in range(400):
                    a, b = [], []
                    for vs in by_prompt.values():
                        idx = rng.permutation(len(vs))
                        a += [vs[i] for i in idx[:s]]
                        b += [vs[i] for i in idx[s : 2 * s]]
                    errs.append(abs(np.mean(a) - np.mean(b)) / np.mean(b))
                row["resampled"][s] = float(np.mean(errs))
        rows.append(row)
    summary = {
        "plan": str(args.plan), "samples_in_plan": s_total, "temperature": plan.config.get("temperature"),
        "median_expected_error": {s: statistics.median(r["formula"][s] for r in rows) for s in sizes},
        "max_expected_error": {s: max(r["formula"][s] for r in rows) for s in sizes},
        "median_resampled_error": {s: statistics.median(r["resampled"][s] for r in rows)
                                   for s in sizes if 2 * s <= s_total},
        "categories": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "samples_choice.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# Continuations per prompt: what a sampled plan misses by (plan: {args.plan}, "
             f"{s_total} continuations, temperature {plan.config.get('temperature')})", "",
             "| S | median expected error | max expected error | median resampled error |", "|---:|---:|---:|---:|"]
    for s in sizes:
        res = summary["median_resampled_error"].get(s)
        lines.append(f"| {s} | {100 * summary['median_expected_error'][s]:.1f}% | "
                     f"{100 * summary['max_expected_error'][s]:.1f}% | {'-' if res is None else f'{100 * res:.1f}%'} |")
    lines += ["", "| category | pick | relative SD between continuations |", "|---|---|---:|"]
    lines += [f"| {r['category']} | {r['pick']} | {100 * r['rel_sd']:.1f}% |" for r in rows]
    (args.out / "samples_choice.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
