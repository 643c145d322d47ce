"""T(n): how long one pass of n new rows takes for one sequence, per weight mode, through the
runtime's single-sequence interface only, so the same file times an older commit's runtime too.

    python benchmarks/pass_time.py --out OUT
    PYTHONPATH=OLD_WORKTREE/src python benchmarks/pass_time.py --out OUT_OLD

Per mode (``--modes``): the default model is loaded, a ``--context``-token prompt prefilled, then
each size of ``--sizes`` is timed ``--rounds`` times (sizes interleaved round by round, the
sequence rolled back to the prompt before each pass) after one warm-up pass each. Old and new
commits compare when their processes alternate in one session (the machine's speed drifts).

Prints the medians and writes ``result.json`` and ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.loaders import load_model

MODES = {"float32": ("float32", "none"), "bfloat16": ("bfloat16", "none"), "q4": ("float32", "q4"),
         "int8": ("float32", "int8")}


def measure(mode: str, *, context: int, sizes: list[int], rounds: int, model: str = "default") -> dict[str, Any]:
    """One mode's T(n) for each n of ``sizes``: medians (ms) and every pass's seconds."""
    dtype, quant = MODES[mode]
    rt = load_model(model, dtype=dtype, quant=quant).runtime
    rt.prefill(list(range(1000, 1000 + context)))
    base = rt.length
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds + 1):
        for n in sizes:
            rt.rollback(base)
            t0 = time.perf_counter()
            rt.forward(list(range(2000, 2000 + n)))
            if r:  # round 0 warms up
                times[n].append(time.perf_counter() - t0)
    rt.rollback(0)
    return {"mode": mode, "median_ms": {str(n): statistics.median(times[n]) * 1e3 for n in sizes},
            "seconds": {str(n): times[n] for n in sizes}}


def commit() -> str:
    import draftwise

    src = Path(draftwise.__file__).resolve().parent
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="float32,bfloat16,q4,int8")
    ap.add_argument("--sizes", default="1,8,16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or args.rounds < 1 or args.context < 1:
        ap.error(f"unknown modes {bad} (modes are {', '.join(MODES)}), or rounds or context below 1")
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [measure(m, context=args.context, sizes=sizes, rounds=args.rounds) for m in modes]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": commit(), "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "context": args.context, "rounds": args.rounds}
    write_json_atomic(out / "result.json", {**meta, "results": results}, indent=1)
    lines = [f"# T(n) of one sequence after {args.context} tokens, commit {meta['commit']}", "",
             f"Medians of {args.rounds} passes, {meta['threads']} threads.", "",
             "| mode | " + " | ".join(f"T({n}) ms" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for r in results:
        lines.append(f"| {r['mode']} | " + " | ".join(f"{r['median_ms'][str(n)]:.2f}" for n in sizes) + " |")
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
