"""What an EAGLE head's drafting call costs, float32 against int8 weights, interleaved in one process.

Each round, for m = 1, 2, 3 drafted tokens and each weight format in turn (the order swapped
every round), a one-token target pass runs first, as in decoding (its weights push the head's
out of the caches), then the head's call of m tokens is timed ("after a pass"), then the same
call again ("back to back"). Medians over ``--rounds``. Writes ``cost.json`` and ``cost.md``::

    python benchmarks/head_step_cost.py --out benchmarks/results/head-step-cost-intel
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftwise.eagle.drafter import EagleDrafter, default_head_folder, fingerprint_of
from draftwise.eagle.files import load_head
from draftwise.runtime.loaders import load_model
from draftwise.core.sampling import SamplingConfig

PROMPT = "Write a short story about a robot who learns to paint. Describe its first painting in detail. " * 3
WEIGHTS = ("float32", "int8")
CASES = ("after a pass", "back to back")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/head-step-cost"))
    args = ap.parse_args()
    model = load_model("default")
    rt = model.runtime
    loaded = load_head(default_head_folder(model), fingerprint=fingerprint_of(model))
    heads = {w: EagleDrafter(rt, loaded, weights=w) for w in WEIGHTS}  # type: ignore[arg-type]
    ids = model.tokenizer.encode(PROMPT)
    for head in heads.values():
        head.start(ids, SamplingConfig(), torch.Generator())
    rt.rollback(0)
    with torch.inference_mode():
        rt.prefill(ids[:-1])
    context = list(ids)
    times: dict[tuple[str, int, str], list[float]] = {(w, m, c): [] for w in WEIGHTS for m in (1, 2, 3) for c in CASES}
    for r in range(args.rounds):
        for m in (1, 2, 3):
            for w in WEIGHTS if r % 2 == 0 else WEIGHTS[::-1]:
                with torch.inference_mode():
                    rt.forward([ids[-1]])
                    rt.rollback(len(ids) - 1)
                for case in CASES:
                    start = time.perf_counter()
                    heads[w].propose_scored(context, m)
                    times[(w, m, case)].append(time.perf_counter() - start)
    rows = [{"case": c, "m": m, **{w: statistics.median(times[(w, m, c)]) for w in WEIGHTS}} for c in CASES for m in (1, 2, 3)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost.json").write_text(json.dumps({"rounds": args.rounds, "threads": torch.get_num_threads(),
                                                   "rows": rows}, indent=1) + "\n")
    lines = [f"# An EAGLE head's drafting call: float32 against int8 weights ({args.rounds} interleaved rounds, medians)", "",
             "| case | tokens | float32 ms | int8 ms | float32 / int8 |", "|---|--:|--:|--:|--:|"]
    lines += [f"| {r['case']} | {r['m']} | {r['float32'] * 1e3:.2f} | {r['int8'] * 1e3:.2f} | {r['float32'] / r['int8']:.2f} |"
              for r in rows]
    lines += ["", "```", f"python benchmarks/head_step_cost.py --rounds {args.rounds} --out {args.out}", "```", ""]
    (args.out / "cost.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
