"""Where a draft's time goes, a pass at a time, from a finished ``draftwise bench`` run, and what it
would take to beat another draft by a given factor (issue 29: the hybrid against suffix alone).

From every turn's stats in ``answers/<method>.jsonl``: the target passes, the time verifying
(the passes themselves, with their tree rows), the time drafting, and the rest of the wall time
(prefill, sampling, bookkeeping). Then, for ``--method`` against ``--base`` by total time (with
the same greedy output, ``base``'s total time over ``method``'s):

- **measured**: P_b T_b / (P_m T_m), T a pass's time with everything in it;
- **free draft**: the same with ``method``'s drafting at 0 ms (what no cheaper head can exceed at
  this acceptance);
- **passes needed**: the passes ``method`` would have to take, at its measured cost a pass, to
  reach ``--goal`` x ``base`` (and the #MAT that means).

    python benchmarks/hybrid_budget.py --bench benchmarks/results/hybrid-dev-2048-fill3 \\
        --base suffix --method suffix+eagle:default --goal 1.15

Prints a markdown table and writes ``budget.json`` beside it when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draftwise.bench.methods import method_filename


def totals(path: Path) -> dict[str, float]:
    """Summed passes, seconds verifying and drafting, wall seconds and new tokens of one method."""
    out = {"passes": 0.0, "verify_s": 0.0, "draft_s": 0.0, "wall_s": 0.0, "tokens": 0.0, "nodes": 0.0}
    for line in path.read_text().splitlines():
        choice = json.loads(line)["choices"][0]
        out["wall_s"] += sum(choice["wall_time"])
        out["tokens"] += sum(choice["new_tokens"])
        for st in choice["stats"]:
            out["passes"] += st["target_passes"]
            out["verify_s"] += st["verify_seconds"]
            out["draft_s"] += st["draft_seconds"]
            out["nodes"] += st.get("proposed", 0)
    if not out["passes"]:
        raise SystemExit(f"{path}: no passes recorded")
    return out


def budget(base: dict[str, float], method: dict[str, float], goal: float) -> dict[str, Any]:
    """The measured and the free-draft ratios, and the passes ``method`` needs for ``goal``.

    >>> b = {"passes": 100, "verify_s": 7.0, "draft_s": 0.0, "wall_s": 7.5, "tokens": 200, "nodes": 300}
    >>> m = {"passes": 80, "verify_s": 6.0, "draft_s": 0.5, "wall_s": 6.9, "tokens": 200, "nodes": 320}
    >>> r = budget(b, m, 1.15)
    >>> round(r["measured"], 3), round(r["free_draft"], 3), round(r["passes_needed"], 1)
    (1.087, 1.172, 75.6)
    """
    t_b, t_m = base["wall_s"] / base["passes"], method["wall_s"] / method["passes"]
    free = (method["wall_s"] - method["draft_s"]) / method["passes"]
    needed = base["passes"] * t_b / (goal * t_m)
    return {
        "measured": base["wall_s"] / method["wall_s"],
        "free_draft": base["passes"] * t_b / (method["passes"] * free),
        "passes_needed": needed, "mat_needed": method["tokens"] / needed,
        "mat": method["tokens"] / method["passes"], "pass_ms": 1e3 * t_m, "base_pass_ms": 1e3 * t_b,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, nargs="+", required=True, help="finished bench folders")
    ap.add_argument("--base", default="suffix")
    ap.add_argument("--method", default="suffix+eagle:default")
    ap.add_argument("--goal", type=float, default=1.15)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    print("| run | method | passes | verify ms/pass | draft ms/pass | other ms/pass | nodes/pass | #MAT |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for bench in args.bench:
        got = {}
        for name in (args.base, args.method):
            path = bench / "answers" / method_filename(name)
            if not path.exists():
                raise SystemExit(f"{path}: no such answers file (is {name!r} one of the run's methods?)")
            t = got[name] = totals(path)
            p = t["passes"]
            print(f"| {bench.name} | {name} | {p:.0f} | {1e3 * t['verify_s'] / p:.2f} | {1e3 * t['draft_s'] / p:.2f} | "
                  f"{1e3 * (t['wall_s'] - t['verify_s'] - t['draft_s']) / p:.2f} | {t['nodes'] / p:.2f} | "
                  f"{t['tokens'] / p:.2f} |")
        rows.append({"bench": str(bench), "base": got[args.base], "method": got[args.method],
                     **budget(got[args.base], got[args.method], args.goal)})
    print()
    print(f"| run | {args.method} / {args.base} by total time | with drafting free | passes for {args.goal}x "
          f"(#MAT) | measured passes (#MAT) |")
    print("|---|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {Path(r['bench']).name} | {r['measured']:.3f} | {r['free_draft']:.3f} | {r['passes_needed']:.0f} "
              f"({r['mat_needed']:.2f}) | {r['method']['passes']:.0f} ({r['mat']:.2f}) |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "budget.json").write_text(json.dumps({"goal": args.goal, "base": args.base, "method": args.method,
                                                          "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
