"""What gathering EAGLE head steps saves: one head step for N sequences in one call
(:func:`draftwise.eagle.drafter.head_steps`, what the batched engine runs once every sequence
waits) against N calls of one sequence each (what each slot's drafter would run on its own),
timed by :func:`time_head_steps`: each sequence's head cache holds
``--context`` positions, one row each, the two ways interleaved ``--rounds`` times, medians.
The head is the one that ships for the default model, drafting as serve drafts (int8 where the
CPU's kernel works).

    python benchmarks/head_gather.py --out OUT

Writes ``head_gather.json`` and ``head_gather.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import draftwise
from draftwise.eagle.drafter import EagleDrafter, eagle_drafter, head_steps
from draftwise.eagle.head import HeadCache


def time_head_steps(drafter: EagleDrafter, sizes: Sequence[int], *, context: int = 256, rounds: int = 7,
                    alone: bool = False) -> dict[int, tuple[float, float | None]]:
    """What one gathered head step costs: per n in ``sizes``, the median seconds of one
    :func:`head_steps` call over n sequences of one row each (each its own cache of ``context``
    positions, filled from random features first), and with ``alone`` the median of n calls of
    one (else None), the two interleaved over ``rounds`` rounds."""
    head, parts = drafter.head, drafter.parts
    d = head.cfg.hidden_size
    width = len(head.cfg.feature_layers or (0,)) * d
    gen = torch.Generator().manual_seed(0)
    out: dict[int, tuple[float, float | None]] = {}
    for n in sizes:
        caches = [HeadCache(head.cfg, context + 2) for _ in range(n)]
        with torch.inference_mode():
            for cache in caches:  # a prompt's catch-up: the context's real rows
                feats = head.lift(torch.randn(context, width, generator=gen))
                tokens = torch.randint(0, parts.vocab_size, (context,), generator=gen).tolist()
                head_steps(head, parts, [(tokens, feats, 0, cache)])
        items = [([7], torch.randn(1, d, generator=gen), context, cache) for cache in caches]
        together: list[float] = []
        each: list[float] = []
        for _ in range(rounds):
            for cache in caches:
                cache.rollback(context)
            t0 = time.perf_counter()
            head_steps(head, parts, items)
            together.append(time.perf_counter() - t0)
            if alone:
                for cache in caches:
                    cache.rollback(context)
                t0 = time.perf_counter()
                for item in items:
                    head_steps(head, parts, [item])
                each.append(time.perf_counter() - t0)
        out[n] = (statistics.median(together), statistics.median(each) if alone else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = draftwise.load_model(args.model)
    drafter = eagle_drafter("default", model)
    sizes = [int(x) for x in args.sizes.split(",")]
    timed = time_head_steps(drafter, sizes, context=args.context, rounds=args.rounds, alone=True)
    rows = []
    for n, (g, a) in timed.items():
        assert a is not None
        rows.append({"sequences": n, "gathered_ms": g * 1e3, "one_by_one_ms": a * 1e3, "saving": a / g})
        print(f"N={n}: gathered {g * 1e3:.2f} ms, one by one {a * 1e3:.2f} ms, {a / g:.2f}x", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {"model": model.name, "head": drafter.name, "weights": drafter.weights, "context": args.context,
              "rounds": args.rounds, "command": "python benchmarks/head_gather.py " + " ".join(
                  f"--{k} {v}" for k, v in vars(args).items() if k != "out") + " --out OUT"}
    (args.out / "head_gather.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1))
    lines = [f"# Gathered head steps ({model.name}, {drafter.name}, {drafter.weights} weights, {args.context} "
             f"positions each, median of {args.rounds})", "", f"Command: `{config['command']}`", "",
             "| sequences | one call for all (ms) | one call each (ms) | saving |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['sequences']} | {r['gathered_ms']:.2f} | {r['one_by_one_ms']:.2f} | {r['saving']:.2f}x |"
              for r in rows]
    (args.out / "head_gather.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
