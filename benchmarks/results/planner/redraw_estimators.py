"""Would another way of keeping a turn's time let the group clause hold? Offline, on recorded rounds.

Issue 28's group clause (``auto`` >= 0.97x the better of ``lookup`` and ``suffix`` in every
group, and >= 1.0x overall), read by ``benchmarks/auto_vs_best.py``'s redraws of each turn's
rounds for a pick that is exactly the better peer in each group, with each turn's time kept three
ways: the fastest of the drawn rounds (bench's), their median and their mean. Prints the share
of 1000 draws on which the whole clause holds.

    python benchmarks/results/planner/redraw_estimators.py > benchmarks/results/planner/redraw_estimators.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # benchmarks/, for auto_vs_best
from auto_vs_best import resample  # noqa: E402

SETS = ("bench-unseen-24-2-head", "bench-unseen-26-2-settle", "bench-unseen-28-2-settle")
KEEP = {"fastest": min, "median": statistics.median, "mean": statistics.fmean}


def main() -> None:
    print("| set | " + " | ".join(KEEP) + " |")
    print("|---|" + "---:|" * len(KEEP))
    for name in SETS:
        shares = [resample(HERE / name, keep=keep)["perfect_pick"]["clause_held"] for keep in KEEP.values()]
        print(f"| `{name}` | " + " | ".join(f"{s:.0%}" for s in shares) + " |")


if __name__ == "__main__":
    main()
