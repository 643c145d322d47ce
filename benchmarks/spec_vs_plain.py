"""Speculative decoding (each draft at each k) against plain draftwise decoding, per Spec-Bench
group, through the ``draftwise bench`` harness (:func:`draftwise.bench.run_bench`).

    python benchmarks/spec_vs_plain.py --per-category 1 --max-new-tokens 128 --drafts lookup,self --ks 4,8

Methods are named ``DRAFT@k=K``; answers, summary.json, summary.md and plots go to --out. A
folder that already holds a run is refused unless --resume (continue it, with the same
settings) or --overwrite (replace it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftwise.bench import render_markdown, run_bench
from draftwise.drafters.spec import split_draft_list
from draftwise.errors import DraftwiseError
from draftwise.questions import DEFAULT_QUESTIONS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="Spec-Bench JSONL or one prompt a line")
    ap.add_argument("--drafts", default="lookup,self", help="comma-separated draft specs")
    ap.add_argument("--ks", default="4,8", help="comma-separated k values")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--peers", default="", help="comma-separated peers (hf)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "spec_vs_plain"))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args()
    drafts = [(d, k.strip()) for d in split_draft_list(args.drafts) for k in args.ks.split(",") if k.strip()]
    try:
        summary = run_bench(
            args.model, args.questions, drafts=drafts, limit_per_category=args.per_category,
            max_new_tokens=args.max_new_tokens, dtype=args.dtype, out_dir=args.out, resume=args.resume,
            overwrite=args.overwrite, peers=args.peers,
        )
    except DraftwiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
