"""Would another way of keeping a turn's time let the group clause hold? Offline, on recorded rounds.

Issue 28's group clause (``auto`` >= 0.97x the better of ``lookup`` and ``suffix`` in every
group, and >= 1.0x overall) read over redraws of each turn's rounds, for a pick that is exactly
the better peer in each group (by median run times; its rounds drawn apart from the peers'), as
``benchmarks/auto_vs_best.py --draws`` does, but with each turn's time kept three ways: the
fastest of the drawn rounds (bench's), their median and their mean. Prints the share of draws
on which the whole clause holds.

    python benchmarks/results/planner/redraw_estimators.py > benchmarks/results/planner/redraw_estimators.txt
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from draftwise.bench import noise
from draftwise.bench.answers import question_key, read_answers
from draftwise.questions import Question, category_group

HERE = Path(__file__).resolve().parent
SETS = ("bench-unseen-24-2-head", "bench-unseen-26-2-settle", "bench-unseen-28-2-settle")
KEEP = {"fastest": min, "median": statistics.median, "mean": statistics.fmean}
PEERS = ("lookup", "suffix")


def held_share(bench: Path, keep, draws: int = 1000, seed: int = 0) -> float:
    """Share of ``draws`` on which a pick exactly the better peer holds the whole clause."""
    read = {m: read_answers(bench / "answers" / f"{m}.jsonl") for m in ("none", "auto", *PEERS)}
    questions = [Question(json.loads(k), r["category"], ("",)) for k, r in read["none"].items()]
    runs = noise.runs_of(read)
    medians = noise.speedups(runs, questions, lambda m, k, t: statistics.median(runs[m][k][1][t]))
    better = {g: max(PEERS, key=lambda p: rows[p]) for g, rows in medians.items() if g != "overall"}
    runs["auto"] = {question_key(q): runs[better[category_group(q.category)]][question_key(q)] for q in questions}
    rng = random.Random(seed)
    held = 0
    for _ in range(draws):
        rounds = {(k, t): rng.choices(range(len(turn)), k=len(turn))
                  for k, (_, turns) in runs["none"].items() for t, turn in enumerate(turns)}

        def pick(m: str, k: str, t: int) -> float:
            turn = runs[m][k][1][t]
            idx = rng.choices(range(len(turn)), k=len(turn)) if m == "auto" else rounds[k, t]
            return keep([turn[i] for i in idx])

        s = noise.speedups(runs, questions, pick)
        held += all(rows["auto"] / max(rows[p] for p in PEERS) >= (1.0 if g == "overall" else 0.97)
                    for g, rows in s.items())
    return held / draws


def main() -> None:
    print("| set | " + " | ".join(KEEP) + " |")
    print("|---|" + "---:|" * len(KEEP))
    for name in SETS:
        shares = [held_share(HERE / name, keep) for keep in KEEP.values()]
        print(f"| `{name}` | " + " | ".join(f"{s:.0%}" for s in shares) + " |")


if __name__ == "__main__":
    main()
