"""What row invariance costs where a packed kernel must run in blocks: the default model's
prefill with the blocks :func:`draftwise.runtime.quant._row_behaviour` chose, against the same
weights called whole (not row-invariant), interleaved in one process.

    python benchmarks/row_blocks.py --dtype bfloat16 --out benchmarks/results/row-blocks

Prints and writes the blocks each weight shape got (``max_rows``: ``None`` means no block) and
the median prefill seconds of ``--tokens`` tokens over ``--rounds`` rounds (the first round is a
warm-up). Where no shape is blocked, both columns time the same code. Writes ``result.json`` and
``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftwise.cost.profile import cpu_model
from draftwise.runtime.loaders import load_model
from draftwise.runtime import quant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model("default", dtype=args.dtype)
    rt = model.runtime
    blocks = {f"{tuple(k[2])}": {"pad_one": v[0], "max_rows": v[1]}
              for k, v in quant._ROW_BEHAVIOUR.items() if k[1] == getattr(torch, args.dtype)}
    blocked = quant.Linear.__call__
    whole = quant.Linear._rows  # the same kernel, every row count in one call
    ids = list(range(100, 100 + args.tokens))
    times: dict[str, list[float]] = {"blocked": [], "whole": []}
    try:
        for _ in range(args.rounds):
            for name, call in (("blocked", blocked), ("whole", whole)):
                quant.Linear.__call__ = call  # type: ignore[method-assign]
                rt.rollback(0)
                start = time.perf_counter()
                rt.prefill(ids)
                times[name].append(time.perf_counter() - start)
    finally:
        quant.Linear.__call__ = blocked  # type: ignore[method-assign]
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    result = {"cpu": cpu_model(), "dtype": args.dtype, "tokens": args.tokens, "threads": args.threads,
              "blocks": blocks, "seconds": times, "median_s": med, "ratio": med["blocked"] / med["whole"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Row blocks: {args.dtype} prefill of {args.tokens} tokens", "",
             f"Machine: {result['cpu']}, {args.threads} threads.", "",
             "| weight shape | one row padded | block (rows) |", "|---|---|---:|",
             *(f"| {s} | {b['pad_one']} | {b['max_rows'] or 'none'} |" for s, b in blocks.items()), "",
             f"Prefill, median of {args.rounds - 1} rounds after a warm-up: blocked {med['blocked']:.3f} s, "
             f"whole {med['whole']:.3f} s, ratio {result['ratio']:.2f}.", ""]
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
