"""What gathering EAGLE head steps saves: one head step for N sequences in one call
(:func:`draftwise.eagle.drafter.head_steps`, what the batched engine runs once every sequence
waits) against N calls of one sequence each (what each slot's drafter would run on its own).

Each sequence has its own head cache holding ``--context`` positions (filled by one call from
random features, as a prompt's catch-up would), then each round times one step of one row per
sequence, both ways, interleaved, ``--rounds`` times; the median is kept. The head is the one
that ships for the default model, drafting as serve drafts (int8 where the CPU's kernel works).

    python benchmarks/head_gather.py --out OUT

Writes ``head_gather.json`` and ``head_gather.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import draftwise
from draftwise.eagle.drafter import eagle_drafter, head_steps
from draftwise.eagle.head import HeadCache


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
    head, parts = drafter.head, drafter.parts
    d = head.cfg.hidden_size
    width = len(head.cfg.feature_layers or (0,)) * d
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        caches = [HeadCache(head.cfg, args.context + 4) for _ in range(n)]
        with torch.inference_mode():
            for cache in caches:  # the catch-up: the context's real rows
                feats = head.lift(torch.randn(args.context, width, generator=gen))
                tokens = torch.randint(0, int(model.runtime.vocab_size), (args.context,), generator=gen).tolist()
                head_steps(head, parts, [(tokens, feats, 0, cache)])
        hidden = torch.randn(1, d, generator=gen)
        items = [([7], hidden, args.context, cache) for cache in caches]
        gathered, alone = [], []
        for _ in range(args.rounds):
            for cache in caches:
                cache.rollback(args.context)
            t0 = time.perf_counter()
            head_steps(head, parts, items)
            gathered.append(time.perf_counter() - t0)
            for cache in caches:
                cache.rollback(args.context)
            t0 = time.perf_counter()
            for item in items:
                head_steps(head, parts, [item])
            alone.append(time.perf_counter() - t0)
        g, a = statistics.median(gathered), statistics.median(alone)
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
