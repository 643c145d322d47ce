"""Issue 28's greedy clause from a finished ``draftwise bench`` run: ``auto`` against the better of
its peers (``lookup`` and ``suffix`` by default) per group and overall, in both of bench's
speedups, with the floor that the host's noise sets on this reading.

The floor: wherever ``auto`` ran exactly what a peer ran (the same draft, the same target passes,
the same accepted lengths, token for token), the two times measure the same work, so their
ratio is the bench's own noise on that turn. Beside a clause that reads the *better* of two
noisy peers (the larger of two draws), that noise is what a pick equal to the best one reads.

The runs: with ``--repeats`` (and ``--settle``) every turn runs in rounds and keeps each run's time.
Redrawing each turn's rounds with replacement (the same rounds for every method), keeping each
method's fastest run as bench does, gives how far the clause's reading moves with the host's
noise alone, the work and the questions held fixed (``--draws`` of them,
:mod:`draftwise.bench.noise`): a 95% interval and the median per group, and the share of draws on
which the clause holds. The same redraws with ``auto``'s runs replaced by the runs of the peer
that is better in that group (by the peers' median run times), drawn in rounds of their own,
read a pick that is exactly the better draft. That reading is optimistic: such a pick's own runs
would add noise that the peer's few recorded runs do not show.

    python benchmarks/auto_vs_best.py --bench benchmarks/results/planner/bench-unseen-24-2-head

Prints a markdown table; with ``--out FILE`` writes the figures as JSON too, and with ``--plot
FILE`` (and ``--draws``) a picture of the resampled intervals.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftwise.bench.answers import question_key, read_answers
from draftwise.bench.methods import BASELINE, method_filename
from draftwise.bench.noise import DRAWS, redraw, runs_of, speedups, spread
from draftwise.bench.summary import OVERALL
from draftwise.plots import check_plot_path, pyplot, save_figure
from draftwise.questions import Question, category_group

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


def resample(bench: Path, method: str = "auto", peers: Sequence[str] = ("lookup", "suffix"), draws: int = DRAWS,
             seed: int = 0, group_goal: float = 0.97, overall_goal: float = 1.0,
             keep: Callable[[list[float]], float] = min) -> dict[str, Any]:
    """The clause's reading under the host's noise: per group, the 95% interval over ``draws``
    redraws of the rounds and the share held, for ``method`` as run and for a pick that is exactly
    the better peer (by the peers' median run times) with runs of its own. Each turn keeps the
    fastest of its drawn rounds, as bench does, or ``keep`` of them."""
    read = {m: read_answers(bench / "answers" / method_filename(m)) for m in [BASELINE, method, *peers]}
    questions = [Question(json.loads(k), r["category"], ("",)) for k, r in read[BASELINE].items()
                 if all(k in read[m] for m in read)]
    runs = runs_of(read)
    counts = [len(t) for by_q in runs.values() for _, turns in by_q.values() for t in turns]
    if max(counts) < 2:
        raise SystemExit(f"{bench}: every turn ran once, so there are no runs to draw again (bench with --repeats)")
    medians = speedups(runs, questions, lambda m, k, t: statistics.median(runs[m][k][1][t]))
    better = {g: max(peers, key=lambda p: rows[p]) for g, rows in medians.items() if g != OVERALL}
    perfect = {question_key(q): runs[better[category_group(q.category)]][question_key(q)] for q in questions}

    def reading(s: dict[str, dict[str, float]]) -> dict[str, float]:
        return {g: rows[method] / max(rows[p] for p in peers) for g, rows in s.items()}

    def goal(g: str) -> float:
        return overall_goal if g == OVERALL else group_goal

    out: dict[str, Any] = {"draws": draws, "seed": seed, "better_peer": better,
                           "runs_per_turn": [min(counts), max(counts)]}
    for name, mine, unpaired in (("as_run", runs[method], ()), ("perfect_pick", perfect, (method,))):
        seen = redraw({**runs, method: mine}, questions, reading, draws, seed, unpaired, keep)
        out[name] = {"clause_held": sum(all(r[g] >= goal(g) for g in r) for r in seen) / draws,
                     "groups": {g: {**spread([r[g] for r in seen]), "held": sum(r[g] >= goal(g) for r in seen) / draws}
                                for g in seen[0]}}
    return out


def report(bench: Path, method: str = "auto", peers: tuple[str, ...] = ("lookup", "suffix"),
           group_goal: float = 0.97, overall_goal: float = 1.0, draws: int = 0,
           seed: int = 0) -> tuple[str, dict[str, Any]]:
    """The table (markdown) and the figures behind it; with ``draws``, the resampled readings too."""
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
    figures = {"groups": by_group, "missed_groups": miss, "overall_held": held, "same_work": floor}
    if draws > 0:
        figures["resampled"] = rs = resample(bench, method, peers, draws, seed, group_goal, overall_goal)
        lines += ["", f"Redrawn ({draws} redraws of each turn's {rs['runs_per_turn'][0]}-{rs['runs_per_turn'][1]} "
                  f"rounds, each method's fastest kept; seed {seed}): the reading's 95% interval, its median and "
                  "the share of draws at or above the goal, as run and for a pick that is exactly the better peer "
                  "(better by the peers' median run times, so not always the better one in the table above; "
                  "its runs drawn apart from the peer's).", "",
                  "| group | better peer | as run: interval | median | held | perfect pick: interval | median | held |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for g, r in rs["as_run"]["groups"].items():
            p = rs["perfect_pick"]["groups"][g]
            lines.append(f"| {g} | {rs['better_peer'].get(g, '')} | {r['low']:.3f}-{r['high']:.3f} | {r['median']:.3f} "
                         f"| {r['held']:.0%} | {p['low']:.3f}-{p['high']:.3f} | {p['median']:.3f} | {p['held']:.0%} |")
        lines += ["", f"The whole clause held on {rs['as_run']['clause_held']:.0%} of draws as run, and on "
                  f"{rs['perfect_pick']['clause_held']:.0%} for a pick that is exactly the better peer."]
    return "\n".join(lines), figures


def plot(figures: dict[str, Any], path: Path, group_goal: float = 0.97) -> Path:
    """Each group's resampled 95% interval, as run and for a pick that is exactly the better peer,
    the bench's own reading as a dot, and the goal as a line."""
    plt = pyplot()
    rs, read = figures["resampled"], figures["groups"]
    groups = list(rs["as_run"]["groups"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups)), 4))
    for j, (name, label) in enumerate((("as_run", "as run"), ("perfect_pick", "exactly the better peer"))):
        xs = [i + (j - 0.5) * 0.3 for i in range(len(groups))]
        lows = [rs[name]["groups"][g]["low"] for g in groups]
        highs = [rs[name]["groups"][g]["high"] for g in groups]
        ax.vlines(xs, lows, highs, linewidth=6, alpha=0.5, color=f"C{j}", label=f"{label}: 95% of draws")
    ax.plot(range(len(groups)), [read.get(g, {}).get("speedup", float("nan")) for g in groups], "ko",
            markersize=4, label="the bench's reading")
    ax.axhline(group_goal, color="red", linewidth=0.8, linestyle="--", label=f"group goal {group_goal}")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel("auto / the better peer (mean tok/s)")
    ax.legend(fontsize="small")
    return save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="a finished `draftwise bench` --out folder")
    ap.add_argument("--method", default="auto")
    ap.add_argument("--peers", default="lookup,suffix", help="comma-separated methods of the same run")
    ap.add_argument("--draws", type=int, default=0, help="resample each turn's runs this many times (0: no)")
    ap.add_argument("--seed", type=int, default=0, help="the resampling's seed")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--plot", type=Path, help="with --draws: plot the resampled intervals here (e.g. noise.png)")
    args = ap.parse_args(argv)
    if not (args.bench / "summary.json").is_file():
        raise SystemExit(f"{args.bench}: no summary.json (not a finished `draftwise bench` folder)")
    if args.draws < 0:
        raise SystemExit(f"--draws {args.draws}: must be 0 (no resampling) or more")
    if args.plot and not args.draws:
        raise SystemExit("--plot draws the resampled intervals: give --draws too (e.g. --draws 1000)")
    if args.plot:
        check_plot_path(args.plot, "--plot")
    text, figures = report(args.bench, args.method, tuple(p for p in args.peers.split(",") if p),
                           draws=args.draws, seed=args.seed)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    if args.plot:
        plot(figures, args.plot)


if __name__ == "__main__":
    main()
