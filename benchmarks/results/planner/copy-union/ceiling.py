"""How often can a fixed pick per group meet the greedy bench's per-group goal (`auto` >= 0.97x
the better of `lookup` and `suffix` in every group) on a random draw of questions, as
`draftwise bench --limit-per-category 2` draws them? Resamples 2 questions per category (both
turns of an MT-bench question) from the 64 dev questions of `answers.jsonl`, prices each draft's
replayed steps as `replay.py` does (a group's speedup is its mean tokens/s over plain's, per
turn where the bench takes a question's turns together), and counts the draws on which each assignment of a draft to
each group meets the goal. Question sampling only: the bench's timing noise comes on top, so
these are upper bounds. No model runs. From the repository root:

    python benchmarks/results/planner/copy-union/ceiling.py [draws]
"""
import itertools
import random
import statistics
import sys
from collections import defaultdict

from replay import ROWS, per_question  # noqa: E402 (replay.py sets up the path)

from draftwise.questions import category_group


def main(draws: int = 3000, seed: int = 1) -> None:
    names = ["lookup", "suffix", "pick"]
    res = {name: per_question(name) for name in names}
    cats: dict = defaultdict(lambda: defaultdict(list))
    for i, row in enumerate(ROWS):
        cats[row["category"]][row["qid"]].append(i)
    groups: dict = defaultdict(list)
    for cat in cats:
        groups[category_group(cat)].append(cat)

    def speedup(name, idx):  # the bench's group speedup: mean tokens/s over plain's
        r = res[name]
        return statistics.mean(r[i][1] for i in idx) / statistics.mean(r[i][2] for i in idx)

    rng = random.Random(seed)
    table = []
    for _ in range(draws):
        row = {}
        for group, members in groups.items():
            idx = [i for cat in members for q in rng.sample(list(cats[cat].values()), 2) for i in q]
            row[group] = {name: speedup(name, idx) for name in names}
        table.append(row)

    def met(choice):
        return sum(
            all(r[g][choice[g]] >= 0.97 * max(r[g]["lookup"], r[g]["suffix"]) for g in groups) for r in table
        ) / draws

    everywhere = {name: met(dict.fromkeys(groups, name)) for name in names}
    best = max(
        (dict(zip(groups, c)) for c in itertools.product(["lookup", "suffix"], repeat=len(groups))), key=met
    )
    print(f"{draws} draws of 2 questions per category; share of draws on which the goal is met:")
    for name, share in everywhere.items():
        print(f"- `{name}` in every group: {share:.1%}")
    print(f"- the best fixed draft per group, chosen on these same draws: {met(best):.1%} ({best})")
    print("\n| group | suffix/lookup, 5% | median | 95% | draws: suffix < 0.97x lookup | lookup < 0.97x suffix |")
    print("|---|---:|---:|---:|---:|---:|")
    for g in groups:
        q = sorted(r[g]["suffix"] / r[g]["lookup"] for r in table)
        lo = sum(x < 0.97 for x in q) / draws
        hi = sum(x > 1 / 0.97 for x in q) / draws
        print(f"| {g} | {q[int(0.05 * draws)]:.3f} | {q[draws // 2]:.3f} | {q[int(0.95 * draws)]:.3f} | {lo:.0%} | {hi:.0%} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
