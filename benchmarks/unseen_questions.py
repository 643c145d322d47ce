"""Write dev questions that ``draftwise plan`` (``--per-category N``, the first N of each category
in file order) does not see: the next ``--take`` of each category, as Spec-Bench JSONL. The
planner's checks run on these, so a plan is never scored on the questions it was made on.

    python benchmarks/unseen_questions.py --skip 2 --take 2 --out benchmarks/data/unseen_2_2.jsonl

A category with too few questions past ``--skip`` (MT-Bench's have 5 in the dev half) takes its
``--take`` from ``--or-skip`` instead, when given:

    python benchmarks/unseen_questions.py --skip 5 --take 1 --or-skip 3 --out benchmarks/data/unseen_5_1.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.questions import DEFAULT_QUESTIONS, read_questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", type=int, default=2, help="questions per category the plan takes (its --per-category)")
    ap.add_argument("--take", type=int, default=2, help="questions per category to write")
    ap.add_argument("--or-skip", type=int, default=None,
                    help="for a category with fewer than --skip + --take questions, skip this many instead")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.skip < 0 or args.take < 1 or (args.or_skip is not None and args.or_skip < 0):
        raise SystemExit("--skip and --or-skip must be >= 0 and --take >= 1")
    questions = read_questions(DEFAULT_QUESTIONS)
    counts: dict[str, int] = {}
    for q in questions:
        counts[q.category] = counts.get(q.category, 0) + 1
    seen: dict[str, int] = {}
    rows = []
    for q in questions:
        i = seen.get(q.category, 0)
        seen[q.category] = i + 1
        skip = args.skip
        if args.or_skip is not None and counts[q.category] < args.skip + args.take:
            skip = args.or_skip
        if skip <= i < skip + args.take:
            rows.append({"question_id": q.question_id, "category": q.category, "turns": list(q.turns)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
