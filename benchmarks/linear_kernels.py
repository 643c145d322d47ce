"""Which float32 matmul kernel the native runtime should pack for: the pass cost T(n) and batch
invariance of the default model under oneDNN, MKL and plain ``F.linear``.

    python benchmarks/linear_kernels.py --out benchmarks/results/linear-kernels

For each kernel the model is loaded once (float32, one runtime per kernel, all in this process),
a prompt of ``--context`` tokens is prefilled, then passes over n = 1, 2, 4, 8, 16 tokens are
timed with the kernels interleaved round by round (``--rounds`` rounds; the median is reported,
and T(n)/T(1), the price of verifying n tokens in units of one decoding step). Batch invariance:
the largest difference between the logits of a row of an n-token pass and those of the same
token fed alone after the same prefix (0: the verification pass computes each position exactly
as plain decoding does; the matmuls of oneDNN are invariant, attention's kernel is not).
Writes ``result.json`` and ``summary.md`` under ``--out``; about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from draftwise.runtime.loaders import load_model
from draftwise.runtime import quant

SIZES = (1, 2, 4, 8, 16)


def _load(kernel: str):  # type: ignore[no-untyped-def]
    """The default model with its float32 weights packed for ``kernel`` (mkldnn, mkl or dense)."""
    saved = dict(quant._WORKS)
    quant._WORKS["mkldnn_fp32"] = kernel == "mkldnn" and quant.kernel_works("mkldnn_fp32")
    quant._WORKS["mkl"] = kernel == "mkl" and saved.get("mkl", quant.kernel_works("mkl"))
    try:
        model = load_model("default")
    finally:
        quant._WORKS.clear()
        quant._WORKS.update(saved)
    kinds = {lin.kind for lin in model.runtime.matmuls(0)}
    return model.runtime, kinds


def _max_row_diff(rt, prompt: list[int], n: int) -> float:  # type: ignore[no-untyped-def]
    """The largest logit difference between a row of an n-token pass and that token's one-token
    pass after the same prefix (0.0: bit-identical)."""
    ids = list(range(500, 500 + n))
    rt.rollback(0)
    rt.prefill(prompt)
    base = rt.length
    wide = rt.forward(ids)
    worst = 0.0
    for j in range(n):
        rt.rollback(base)
        if j:
            rt.forward(ids[:j])
        worst = max(worst, float((rt.forward(ids[j : j + 1])[-1] - wide[j]).abs().max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=300, help="Prefilled tokens before the timed passes.")
    ap.add_argument("--rounds", type=int, default=12, help="Timing rounds (kernels interleaved).")
    ap.add_argument("--kernels", default="mkldnn,mkl,dense", help="Comma-separated: mkldnn, mkl, dense.")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels or any(k not in ("mkldnn", "mkl", "dense") for k in kernels):
        ap.error("--kernels takes mkldnn, mkl and/or dense")
    if args.context < 1 or args.rounds < 1:
        ap.error("--context and --rounds must be at least 1")
    runtimes = {}
    for k in kernels:
        rt, kinds = _load(k)
        if kinds != {k}:
            print(f"{k}: this machine cannot pack for it (got {sorted(kinds)}); skipped", flush=True)
            continue
        runtimes[k] = rt
    prompt = [(7 * i + 11) % 40000 + 100 for i in range(args.context)]
    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in SIZES} for k in runtimes}
    with torch.inference_mode():
        for rt in runtimes.values():
            rt.prefill(prompt)
        for r in range(args.rounds):
            for n in SIZES:
                for k, rt in runtimes.items():
                    ids = list(range(500, 500 + n))
                    t = time.perf_counter()
                    rt.forward(ids)
                    times[k][n].append(time.perf_counter() - t)
                    rt.rollback(args.context)
            print(f"round {r + 1}/{args.rounds}", flush=True)
        invariant = {k: {n: _max_row_diff(rt, prompt, n) for n in SIZES if n > 1} for k, rt in runtimes.items()}
    result = {
        "machine": {"processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "context": args.context,
        "rounds": args.rounds,
        "kernels": {
            k: {
                "ms": {n: round(1e3 * statistics.median(v), 2) for n, v in times[k].items()},
                "ratio_to_1": {n: round(statistics.median(v) / statistics.median(times[k][1]), 3) for n, v in times[k].items()},
                "max_logit_diff_vs_one_token": invariant[k],
            }
            for k in runtimes
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Float32 matmul kernels: pass cost T(n) of the default model",
        "",
        f"`python benchmarks/linear_kernels.py --out ...`; context {args.context}, median of {args.rounds} "
        f"interleaved rounds, {result['machine']['threads']} threads, torch {torch.__version__}.",
        "",
        "| kernel | " + " | ".join(f"T({n}) ms" for n in SIZES) + " | T(8)/T(1) | T(16)/T(1) | max logit diff, row of a wide pass vs one-token pass |",
        "|---|" + "---|" * (len(SIZES) + 3),
    ]
    for k, row in result["kernels"].items():
        inv = f"{max(row['max_logit_diff_vs_one_token'].values()):.1e}"
        lines.append(
            f"| {k} | " + " | ".join(f"{row['ms'][n]:.1f}" for n in SIZES)
            + f" | {row['ratio_to_1'][8]:.2f} | {row['ratio_to_1'][16]:.2f} | {inv} |"
        )
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
