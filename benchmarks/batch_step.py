"""How long one batched decoding step takes: N sequences at scattered contexts, one new token each.

    python benchmarks/batch_step.py --sequences 16 --contexts 180-450 --out OUT

The default model (float32 unless ``--dtype``) holds ``--sequences`` sequences in consecutive
slots, each prefilled with random tokens to a context drawn uniformly from ``--contexts``
(``--seed``), then the step (one token per sequence, as plain decoding runs at batch) is timed
``--rounds`` times after a warm-up, each round restoring every slot's length. The script uses only
the runtime's public batched interface, so the same file times an older commit's runtime too:
run it with ``PYTHONPATH=that-worktree/src``. ``--cut`` overrides how the pass is cut into
attention groups (``runtime/batch_plan.py``; ``one``: a single group, ``each``: a group per
sequence; the result is the same bits either way, only the time changes).

Prints the median and writes ``result.json`` and ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.loaders import load_model
from draftwise.runtime import batch_plan
from draftwise.runtime.base import Rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--contexts", default="180-450", help="LO-HI: each sequence's context, drawn uniformly")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--cut", default="default", choices=["default", "one", "each"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    lo, _, hi = args.contexts.partition("-")
    if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        ap.error("--contexts must be LO-HI with 1 <= LO <= HI")
    if args.sequences < 1 or args.rounds < 1:
        ap.error("--sequences and --rounds must be at least 1")
    if args.cut != "default":
        if not hasattr(batch_plan, "CALL_COST"):
            ap.error("--cut needs a runtime that cuts passes into runs (batch_plan.CALL_COST)")
        setattr(batch_plan, "CALL_COST" if args.cut == "one" else "KEY_COST", 1e30)
    torch.set_num_threads(args.threads)
    rt = load_model("default", dtype=args.dtype).runtime
    rng = random.Random(args.seed)
    contexts = [rng.randint(int(lo), int(hi)) for _ in range(args.sequences)]
    rt.allocate_slots(args.sequences, min(rt.max_context, int(hi) + 64))
    for slot, n in enumerate(contexts):
        ids = [rng.randrange(100, 20000) for _ in range(n)]
        for c in range(0, n, 256):
            rt.forward_batch([Rows(slot, ids[c : c + 256], logits=False)])

    def step() -> float:
        for slot, n in enumerate(contexts):
            rt.rollback_slot(slot, n)
        t0 = time.perf_counter()
        rt.forward_batch([Rows(slot, [1234]) for slot in range(args.sequences)])
        return time.perf_counter() - t0

    step()
    times = [step() for _ in range(args.rounds)]
    median_ms = statistics.median(times) * 1e3
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=Path(batch_plan.__file__).parent).stdout.strip()
    command = "python benchmarks/batch_step.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"sequences": args.sequences, "contexts": contexts, "dtype": args.dtype, "cut": args.cut,
              "threads": args.threads, "runtime_commit": commit, "seconds": times, "median_ms": median_ms,
              "command": command}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "result.json", result)
    write_text_atomic(
        args.out / "summary.md",
        f"# One decoding step of {args.sequences} sequences ({args.dtype}, contexts {args.contexts}, cut {args.cut})\n\n"
        f"Runtime from commit {commit}; median of {args.rounds} steps after a warm-up: **{median_ms:.1f} ms**.\n\n"
        f"    {command}\n")
    print(f"{args.sequences} sequences, contexts {args.contexts}, cut {args.cut}, runtime {commit}: {median_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
