"""What row invariance costs a single sequence: T(n) of the native runtime with its row-invariant
kernels against the same weights run without them, in each runtime mode, in one process.

    python benchmarks/invariance_cost.py --out benchmarks/results/invariance-cost

A row's logits must not depend on the rows beside it (DESIGN.md section 11), so the runtime runs
attention in fixed shapes (:mod:`draftwise.runtime.attention`: query rows padded to 8, keys to
64-key blocks, the values summed block by block) and some packed matmuls padded or in blocks
(:func:`draftwise.runtime.quant._row_behaviour`). The comparator, "free", is what the runtime
would run without that promise: ``F.scaled_dot_product_attention`` over the sequence's own keys
(a causal mask where a pass holds several rows) and every linear called whole. It changes only
those two calls, so the difference is the price of invariance and nothing else (an older
commit would differ in other ways as well).

For each mode (``--modes``; float32, bfloat16, q4, int8 as ``draftwise bench-modes`` names them)
the model is loaded, a prompt of ``--context`` tokens prefilled, then passes of n tokens (``--sizes``,
the sequence's next rows: 1 is a plain decoding step, k + 1 a verification pass) are timed,
invariant and free interleaved pass by pass for ``--rounds`` rounds after a warm-up; the median
is reported. The free path's logits are checked against the invariant ones (they differ in the
last bits only). Writes ``result.json`` and ``summary.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from draftwise.bench.modes import MODES
from draftwise.cost.profile import cpu_flags, cpu_model
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.loaders import load_model
from draftwise.runtime import native, quant
from draftwise.runtime.base import Rows
from draftwise.runtime.batch_plan import Plan


def free_attention(plan: Plan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                   dtype: torch.dtype) -> torch.Tensor:
    """``attend_groups`` for one sequence's chain of rows, by ``F.scaled_dot_product_attention``
    over its own keys (not row-invariant: its summation order follows the number of rows and keys)."""
    if not plan.single:
        raise ValueError("the free comparator covers one sequence's chain")
    rows, slot = q.shape[0], plan.first_slot
    n = plan.starts[0] + rows
    keys, values = k_cache[slot, :, :n].float(), v_cache[slot, :, :n].float()  # [KV, n, hd]
    mask = None if rows == 1 else torch.ones(rows, n, dtype=torch.bool).tril(n - rows)
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
                                         scale=scale, enable_gqa=True)  # [1, H, rows, hd]
    return out[0].transpose(0, 1).reshape(rows, -1).to(dtype)


#: the runtime's own attention and linear call, saved before any switch
INVARIANT: tuple[Callable[..., Any], Callable[..., Any]] = (native.attend_groups, quant.Linear.__call__)


def switch(free: bool) -> None:
    """Route the runtime's attention and packed linears through the free path, or back."""
    native.attend_groups = free_attention if free else INVARIANT[0]  # type: ignore[assignment]
    quant.Linear.__call__ = quant.Linear._run if free else INVARIANT[1]  # type: ignore[method-assign]


def measure(mode: str, *, context: int, sizes: list[int], rounds: int, model: str = "default") -> dict[str, Any]:
    """One mode's T(n), invariant and free, and the largest logit difference between them."""
    dtype, quant_mode = MODES[mode]
    rt = load_model(model, dtype=dtype, quant=quant_mode).runtime
    rt.prefill(list(range(1000, 1000 + context)))
    base = rt.length

    def run(n: int) -> tuple[float, torch.Tensor]:
        rt.rollback(base)
        t0 = time.perf_counter()
        logits = rt.forward_batch([Rows(0, list(range(2000, 2000 + n)))])[0]
        return time.perf_counter() - t0, logits

    times: dict[str, dict[int, list[float]]] = {"invariant": {n: [] for n in sizes}, "free": {n: [] for n in sizes}}
    gap = {}
    try:
        for n in sizes:  # warm-up, and the logit check
            outs = []
            for free in (False, True):
                switch(free)
                run(n)
                outs.append(run(n)[1])
            gap[n] = float((outs[0].float() - outs[1].float()).abs().max())
        for r in range(rounds):
            for n in sizes:
                for free in ((False, True) if r % 2 == 0 else (True, False)):
                    switch(free)
                    times["free" if free else "invariant"][n].append(run(n)[0])
    finally:
        switch(False)
        rt.rollback(0)
    rows = []
    for n in sizes:
        inv, free_ = (statistics.median(times[k][n]) for k in ("invariant", "free"))
        rows.append({"n": n, "invariant_ms": inv * 1e3, "free_ms": free_ * 1e3, "cost": inv / free_ - 1,
                     "max_logit_gap": gap[n]})
    return {"mode": mode, "rows": rows, "seconds": times}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--modes", default="float32,bfloat16,q4,int8")
    ap.add_argument("--context", type=int, default=300, help="prompt tokens before the timed passes")
    ap.add_argument("--sizes", default="1,8,16", help="rows per timed pass")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: unknown {unknown or 'none given'}; choose from {', '.join(MODES)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s < 1 for s in sizes):
        ap.error("--sizes: each size must be at least 1")
    if args.rounds < 1 or args.context < 1:
        ap.error("--rounds and --context must be at least 1")
    torch.set_num_threads(args.threads)
    results = []
    for mode in modes:
        results.append(measure(mode, context=args.context, sizes=sizes, rounds=args.rounds, model=args.model))
        for row in results[-1]["rows"]:
            print(f"{mode:>8} T({row['n']:>2}): invariant {row['invariant_ms']:7.2f} ms, free {row['free_ms']:7.2f} ms, "
                  f"cost {100 * row['cost']:+5.1f}%", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                            text=True).stdout.strip()
    command = "python benchmarks/invariance_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = {"model": args.model, "machine": cpu_model(), "cpu_flags": cpu_flags(), "threads": args.threads, "context": args.context,
               "rounds": args.rounds, "commit": commit, "command": command, "modes": results}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "result.json", summary)
    lines = ["# What row invariance costs one sequence", "",
             f"{args.model}; {cpu_model()} ({', '.join(cpu_flags()) or 'no listed flags'}), {args.threads} threads; commit {commit}; "
             f"a {args.context}-token prompt, then passes of n rows; medians of {args.rounds} interleaved rounds.", "",
             f"    {command}", "",
             "| mode | n | invariant ms | free ms | cost | largest logit gap |", "|---|---:|---:|---:|---:|---:|"]
    for res in results:
        lines += [f"| {res['mode']} | {r['n']} | {r['invariant_ms']:.2f} | {r['free_ms']:.2f} | {100 * r['cost']:+.1f}% "
                  f"| {r['max_logit_gap']:.2g} |" for r in res["rows"]]
    write_text_atomic(args.out / "summary.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
