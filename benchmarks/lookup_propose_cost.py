"""Prompt lookup's propose() cost as the context grows: microseconds per step, whatever the
history length (the n-gram index is updated incrementally, so a step costs the same at 8k tokens
as at 1k). A benchmark, not a unit test: it writes JSON and a markdown line.

    python benchmarks/lookup_propose_cost.py --contexts 1024,8192 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from draftwise.drafters import PromptLookupDrafter
from draftwise.core.sampling import SamplingConfig


def tokens(n: int, seed: int) -> list[int]:
    """Text-like ids: a small vocabulary with repeats, so matches exist."""
    rng = random.Random(seed)
    return [rng.randrange(64) for _ in range(n)]


def per_step_us(context_len: int, steps: int, k: int) -> float:
    context = tokens(context_len, seed=1)
    drafter = PromptLookupDrafter()
    drafter.start(context, SamplingConfig(), torch.Generator())
    t0 = time.perf_counter()
    for token in tokens(steps, seed=2):
        context.append(token)
        drafter.propose(context, k)
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "lookup_propose_cost.json"))
    args = ap.parse_args()
    rows = [{"context": int(c), "us_per_propose": per_step_us(int(c), args.steps, args.k)} for c in args.contexts.split(",")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"k": args.k, "steps": args.steps, "rows": rows}, indent=2) + "\n")
    print("| context | µs per propose() |\n|---:|---:|")
    for r in rows:
        print(f"| {r['context']} | {r['us_per_propose']:.1f} |")


if __name__ == "__main__":
    main()
