"""The cross-request cache workload for suffix decoding: one category answered question after
question, in order, so that each answer can reuse what earlier answers of the same kind said.

    python benchmarks/cache_workload.py --out benchmarks/data/cache_workload.jsonl
    draftwise bench --questions benchmarks/data/cache_workload.jsonl \
        --drafts none,lookup,suffix,suffix:cache=0 --k auto --out benchmarks/results/suffix-cache

The questions are the first ``--per-category`` dev questions (shipped with draftwise) of each
category named, kept in file order. Nothing here is evaluation data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.questions import DEFAULT_QUESTIONS, read_questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", default="math_reasoning,summarization",
                    help="Comma-separated categories, each run as one block.")
    ap.add_argument("--per-category", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/data/cache_workload.jsonl"))
    args = ap.parse_args()
    questions = read_questions(DEFAULT_QUESTIONS)
    rows = []
    for cat in [c.strip() for c in args.categories.split(",") if c.strip()]:
        mine = [q for q in questions if q.category == cat][: args.per_category]
        if not mine:
            raise SystemExit(f"no dev questions in category {cat!r}")
        rows += [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in mine]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} questions to {args.out}")


if __name__ == "__main__":
    main()
