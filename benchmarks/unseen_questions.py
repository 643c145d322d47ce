"""Write dev questions that ``draftwise plan`` (``--per-category N``, the first N of each category
in file order) does not see: the next ``--take`` of each category, as Spec-Bench JSONL. The
planner's checks run on these, so a plan is never scored on the questions it was made on.

    python benchmarks/unseen_questions.py --skip 2 --take 2 --out benchmarks/data/unseen_2_2.jsonl
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
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.skip < 0 or args.take < 1:
        raise SystemExit("--skip must be >= 0 and --take >= 1")
    seen: dict[str, int] = {}
    rows = []
    for q in read_questions(DEFAULT_QUESTIONS):
        i = seen.get(q.category, 0)
        seen[q.category] = i + 1
        if args.skip <= i < args.skip + args.take:
            rows.append({"question_id": q.question_id, "category": q.category, "turns": list(q.turns)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
