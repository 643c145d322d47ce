"""Write the dev questions held out of every training run (``draftwise distill`` and
``draftwise train-head`` never see them) as Spec-Bench JSONL, optionally one group only.

    python benchmarks/heldout_questions.py --group mt_bench --out benchmarks/data/heldout_mt_bench.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.training.data import split_questions
from draftwise.questions import DEFAULT_QUESTIONS, category_group, read_questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", default=None, help="a Spec-Bench group (mt_bench, qa, ...); default all")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    _, held = split_questions(read_questions(DEFAULT_QUESTIONS))
    rows = [q for q in held if args.group is None or category_group(q.category) == args.group]
    if not rows:
        raise SystemExit(f"no held-out question in group {args.group!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for q in rows:
            f.write(json.dumps({"question_id": q.question_id, "category": q.category, "turns": list(q.turns)}) + "\n")
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
