"""Speculative decoding (each draft at each k) against plain draftwise decoding, per Spec-Bench
group, through the ``draftwise bench`` harness (draftwise.bench.harness).

    python benchmarks/spec_vs_plain.py --per-category 1 --max-new-tokens 128 --drafts lookup,self --ks 4,8

Methods are named ``DRAFT@k=K``; answers, summary.json, summary.md and plots go to --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from draftwise.bench.harness import render_markdown, run_bench
from draftwise.bench.runtime import DEFAULT_QUESTIONS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--drafts", default="lookup,self", help="comma-separated draft specs")
    ap.add_argument("--ks", default="4,8", help="comma-separated k values")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--peers", default="", help="comma-separated peers (hf)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "spec_vs_plain"))
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    drafts = [(d.strip(), k.strip()) for d in args.drafts.split(",") for k in args.ks.split(",")]
    summary = run_bench(
        args.model, args.questions, drafts=drafts, limit_per_category=args.per_category,
        max_new_tokens=args.max_new_tokens, dtype=args.dtype, out_dir=args.out, resume=args.resume,
        peers=[p for p in args.peers.split(",") if p.strip()],
    )
    print(render_markdown(summary))


if __name__ == "__main__":
    main()
