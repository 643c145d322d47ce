"""The attention kernel of two revisions, side by side: one layer's call, and a whole pass of the
default model, with each build swapped into the same process and the builds interleaved.

    python benchmarks/attention_kernel.py --against 85a59bc --out benchmarks/results/attention-kernel

``--against REV`` builds that revision's ``attention.c`` with that revision's compiler flags (read
from its ``kernels/__init__.py``); the working tree's kernel runs beside it. Both must compute the
same thing: the script reports the largest difference between their outputs too (the bits may
differ: a build with FMA contraction rounds otherwise). Writes ``attention_kernel.json`` and
``attention_kernel.md``.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from draftwise.runtime import kernels

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DIR = "src/draftwise/runtime/kernels"
#: (sequences, rows each, keys each): one sequence as a decode or verification pass, and a batch
LAYER_SHAPES = [(1, 1, 128), (1, 1, 512), (1, 1, 1024), (1, 2, 512), (1, 2, 1024), (1, 3, 1024), (1, 5, 1024),
                (1, 9, 1024), (16, 1, 700), (16, 3, 700)]
PASS_CONTEXTS = (128, 512, 1024)
PASS_ROWS = (1, 2, 3, 5, 9)
TORCH = "torch path"


def _build(source: str, flags: list[str], out: Path) -> ctypes.CDLL:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", *flags, str(src), "-o", str(out)], check=True, capture_output=True)
    return kernels.bind(ctypes.CDLL(str(out)))


def _revision_kernel(rev: str) -> tuple[str, list[str]]:
    """``rev``'s attention.c and the flags its kernels module compiled it with."""
    show = lambda path: subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,  # noqa: E731
                                       capture_output=True, text=True).stdout
    module = ast.parse(show(f"{KERNEL_DIR}/__init__.py"))
    flags = next(ast.literal_eval(n.value) for n in module.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FLAGS")
    return show(f"{KERNEL_DIR}/attention.c"), list(flags)


def _median_us(times: list[float]) -> float:
    return statistics.median(times[len(times) // 10:]) * 1e6


def layer_calls(libs: dict[str, ctypes.CDLL], repeats: int) -> list[dict]:
    """One layer of the default model's shape (9 query heads, 3 KV heads of 64), 2 threads."""
    H, KV, hd = 9, 3, 64
    torch.manual_seed(0)
    slots = max(n for n, _, _ in LAYER_SHAPES)
    k_cache, v_cache = torch.randn(slots, KV, 2048, hd), torch.randn(slots, KV, 2048, hd)
    trees = torch.zeros(1, dtype=torch.uint8)
    rows_out = []
    for sequences, rows, keys in LAYER_SHAPES:
        q = torch.randn(sequences * rows, H, hd)
        seq = torch.tensor([[s, keys, rows, s * rows, -1] for s in range(sequences)], dtype=torch.int64)
        outs, times = {}, {name: [] for name in libs}
        for _ in range(repeats):
            for name, lib in libs.items():
                kernels._state["lib"] = lib
                t = time.perf_counter()
                outs[name] = kernels.attend(q, k_cache, v_cache, seq, trees, hd ** -0.5, 2)
                times[name].append(time.perf_counter() - t)
        first, second = list(outs.values())
        rows_out.append({"sequences": sequences, "rows": rows, "keys": keys, **{name: _median_us(t) for name, t in times.items()},
                         "max_abs_diff": float((first - second).abs().max())})
    return rows_out


def model_passes(libs: dict[str, ctypes.CDLL], repeats: int) -> list[dict]:
    """A whole pass of the default model: ``rows`` new rows after ``context`` tokens, with each
    build, and with the runtime's torch path (:mod:`draftwise.runtime.attention`) beside them."""
    from draftwise.runtime.loaders import load_model

    runtime = load_model("default").runtime
    ids = [1000 + (i * 7919) % 20000 for i in range(max(PASS_CONTEXTS) + max(PASS_ROWS))]
    out = []
    for context in PASS_CONTEXTS:
        runtime.prefill(ids[:context])
        names = [*libs, TORCH]
        times = {(name, n): [] for name in names for n in PASS_ROWS}
        for _ in range(repeats):
            for name in names:
                runtime.kernel_attention = name != TORCH
                if name != TORCH:
                    kernels._state["lib"] = libs[name]
                for n in PASS_ROWS:
                    runtime.rollback(context)
                    t = time.perf_counter()
                    runtime.forward(ids[context:context + n])
                    times[name, n].append(time.perf_counter() - t)
        for n in PASS_ROWS:
            out.append({"context": context, "rows": n,
                        **{name: _median_us(times[name, n]) / 1e3 for name in names}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the git revision whose kernel to compare with")
    ap.add_argument("--repeats", type=int, default=200, help="calls per layer shape and build")
    ap.add_argument("--pass-repeats", type=int, default=25, help="passes per context, row count and build")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if kernels.library() is None:
        raise SystemExit(f"the working tree's kernel is not built here: {kernels.why_not()}")
    source, flags = _revision_kernel(args.against)
    with tempfile.TemporaryDirectory() as tmp:
        old = _build(source, flags, Path(tmp) / "before.so")
        libs = {args.against: old, "working tree": kernels.library()}
        layers = layer_calls(libs, args.repeats)
        passes = model_passes(libs, args.pass_repeats)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags_now = " ".join(kernels.FLAGS)
    result = {"against": args.against, "against_flags": " ".join(flags), "flags": flags_now, "cpu": cpu,
              "avx512": "avx512f" in Path("/proc/cpuinfo").read_text(), "layer_calls_us": layers,
              "model_passes_ms": passes}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_kernel.json").write_text(json.dumps(result, indent=1) + "\n")
    a, b = args.against, "working tree"
    lines = [f"# The attention kernel: {a} against the working tree", "",
             f"{cpu} (AVX-512: {'yes' if result['avx512'] else 'no'}), 2 threads; builds interleaved in one "
             f"process. {a}: `cc {' '.join(flags)}`; working tree: `cc {flags_now}`.", "",
             "## One layer (9 query heads, 3 KV heads of 64), microseconds", "",
             f"| sequences | rows each | keys each | {a} | working tree | ratio | max abs diff |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['sequences']} | {r['rows']} | {r['keys']} | {r[a]:.1f} | {r[b]:.1f} | {r[a] / r[b]:.2f}x | {r['max_abs_diff']:.1e} |"
              for r in layers]
    lines += ["", "## A pass of the default model, milliseconds (and against one row at that context)", "",
              f"| context | rows | {a} | working tree | {a} / working tree | {TORCH} (no kernel) |",
              "|---:|---:|---:|---:|---:|---:|"]
    one = {(r["context"], name): r[name] for r in passes if r["rows"] == 1 for name in (a, b, TORCH)}
    cell = lambda r, name: f"{r[name]:.1f} ({r[name] / one[r['context'], name]:.2f})"  # noqa: E731
    lines += [f"| {r['context']} | {r['rows']} | {cell(r, a)} | {cell(r, b)} | {r[a] / r[b]:.2f}x | {cell(r, TORCH)} |"
              for r in passes]
    lines += ["", f"Command: `python benchmarks/attention_kernel.py --against {a} --out {args.out}`", ""]
    (args.out / "attention_kernel.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
