"""Speculative decoding (each draft, k=4 and k=8) against plain draftwise decoding, per category.

    python benchmarks/spec_vs_plain.py --per-category 2 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
from pathlib import Path

from draftwise.bench.runtime import DEFAULT_QUESTIONS
from draftwise.bench.spec import render_markdown, run_spec_benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--drafts", default="lookup,self", help="comma-separated draft specs")
    ap.add_argument("--ks", default="4,8", help="comma-separated k values")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    methods = [(d, int(k)) for d in args.drafts.split(",") for k in args.ks.split(",")]
    report = run_spec_benchmark(
        model=args.model, questions=args.questions, methods=methods,
        per_category=args.per_category, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
        out_dir=args.out,
    )
    print(render_markdown(report))


if __name__ == "__main__":
    main()
