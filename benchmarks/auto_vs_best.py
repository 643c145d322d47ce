"""Issue 28's greedy clause from a finished ``draftwise bench`` run: ``auto`` against the better of
its peers (``lookup`` and ``suffix`` by default) per group and overall, in both of bench's
speedups, with the floor that the host's noise sets on this reading.

The floor: wherever ``auto`` ran exactly what a peer ran (the same draft, the same target passes,
the same accepted lengths, token for token), the two times measure the same work, so their
ratio is the bench's own noise on that turn. Beside a clause that reads the *better* of two
noisy peers (the larger of two draws), that noise is what a pick equal to the best one reads.

    python benchmarks/auto_vs_best.py --bench benchmarks/results/planner/bench-unseen-24-2-head

Prints a markdown table; with ``--out FILE`` writes the figures as JSON too.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from draftwise.bench.answers import read_answers
from draftwise.bench.methods import method_filename

SPEEDUPS = ("speedup", "speedup_total_time")


def ratios(groups: dict[str, dict[str, Any]], method: str, peers: list[str]) -> dict[str, dict[str, float]]:
    """``method``'s speedup over the better of ``peers``' in each group, for each of bench's speedups.

    >>> g = {"qa": {"a": {"speedup": 1.5, "speedup_total_time": 1.4}, "l": {"speedup": 1.2,
    ...      "speedup_total_time": 1.4}, "s": {"speedup": 1.6, "speedup_total_time": 1.0}}}
    >>> {k: round(v, 4) for k, v in ratios(g, "a", ["l", "s"])["qa"].items()}
    {'speedup': 0.9375, 'speedup_total_time': 1.0}
    """
    out = {}
    for group, rows in groups.items():
        if method in rows and all(p in rows for p in peers):
            out[group] = {s: rows[method][s] / max(rows[p][s] for p in peers) for s in SPEEDUPS}
    return out


def same_work(bench: Path, method: str, peers: list[str]) -> list[dict[str, Any]]:
    """Every turn where ``method`` ran exactly what a peer ran: its time over the peer's."""
    read = {m: read_answers(bench / "answers" / method_filename(m)) for m in [method, *peers]}
    found = []
    for key, rec in read[method].items():
        mine = rec["choices"][0]
        for peer in peers:
            theirs = read[peer].get(key, {}).get("choices", [None])[0]
            if theirs is None:
                continue
            for t, (a, b) in enumerate(zip(mine["stats"], theirs["stats"])):
                if (a["draft"], a["target_passes"]) == (b["draft"], b["target_passes"]) \
                        and mine["accept_lengths"][t] == theirs["accept_lengths"][t]:
                    found.append({"question": key, "turn": t, "peer": peer, "category": rec["category"],
                                  "ratio": theirs["wall_time"][t] / mine["wall_time"][t],
                                  "runs": [len(a.get("repeat_seconds", [0])), len(b.get("repeat_seconds", [0]))]})
    return found


def report(bench: Path, method: str = "auto", peers: tuple[str, ...] = ("lookup", "suffix"),
           group_goal: float = 0.97, overall_goal: float = 1.0) -> tuple[str, dict[str, Any]]:
    """The table (markdown) and the figures behind it."""
    summary = json.loads((bench / "summary.json").read_text())
    by_group = ratios(summary["groups"], method, list(peers))
    floor = same_work(bench, method, list(peers))
    miss = [g for g, r in by_group.items() if g != "overall" and r["speedup"] < group_goal]
    held = by_group.get("overall", {}).get("speedup", 0.0) >= overall_goal
    lines = [f"`{method}` over the better of {', '.join(f'`{p}`' for p in peers)} ({bench.name}):", "",
             "| group | mean tok/s | total time |", "|---|---:|---:|"]
    lines += [f"| {g} | {r['speedup']:.3f} | {r['speedup_total_time']:.3f} |" for g, r in by_group.items()]
    lines += ["", f"Overall >= {overall_goal}: {'held' if held else 'missed'}; every group >= {group_goal}: "
              + ("held" if not miss else "missed in " + ", ".join(miss)) + "."]
    if floor:
        r = [f["ratio"] for f in floor]
        lines += ["", f"Same work ({len(floor)} turns where `{method}` ran exactly what a peer ran): its speed over "
                  f"the peer's median {statistics.median(r):.3f}, from {min(r):.3f} to {max(r):.3f}."]
    return "\n".join(lines), {"groups": by_group, "missed_groups": miss, "overall_held": held, "same_work": floor}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="a finished `draftwise bench` --out folder")
    ap.add_argument("--method", default="auto")
    ap.add_argument("--peers", default="lookup,suffix", help="comma-separated methods of the same run")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if not (args.bench / "summary.json").is_file():
        raise SystemExit(f"{args.bench}: no summary.json (not a finished `draftwise bench` folder)")
    text, figures = report(args.bench, args.method, tuple(p for p in args.peers.split(",") if p))
    print(text)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
