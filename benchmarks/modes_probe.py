"""What a token's time goes to, per weight format: the matmuls against everything else (norms,
rope, attention, reshapes, dispatch).

    python benchmarks/modes_probe.py --modes float32,bfloat16,q4,int8 --out-dir benchmarks/results/modes-probe

The split (:func:`matmul_split`): a 1-token forward after the first dev question's prompt is
timed as it is and with every matmul (fused q/k/v, o, fused gate/up, down, head) replaced by a
stub that returns a preallocated zero tensor of the matmul's output shape. The stubbed forward
is "the rest"; the difference is "the matmuls". The two are timed alternately, so the noise of
a shared machine hits both alike, and the medians are reported.

A diagnostic, not a user command: it swaps the native runtime's private matmul lists
(``_qkv``, ``_o``, ``_gate_up``, ``_down``, ``_head``) for the time of the measurement and
restores them afterwards, whatever happens. The modes are ``draftwise bench-modes``'s
(:data:`draftwise.bench.modes.MODES`). Writes ``modes_probe.json`` and ``modes_probe.md`` into
``--out-dir`` where given, and prints the Markdown.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.modes import MODES, parse_modes
from draftwise.bench.plain_vs_hf import machine_info
from draftwise.bench.progress import quiet_transformers
from draftwise.errors import DraftwiseError
from draftwise.fsutil import check_writable, write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.runtime.loaders import load_model

#: the runtime attributes holding its matmuls: four per-layer lists and the head
MATMUL_LISTS = ("_qkv", "_o", "_gate_up", "_down")
HEAD = "_head"
RESULT_STEM = "modes_probe"


class _ZeroStub:
    """Stands in for a matmul: returns the same preallocated zeros of the real output's shape
    (made on the first call, from one real call; the shape depends on the rows of ``x``)."""

    __slots__ = ("real", "zeros")

    def __init__(self, real: Any) -> None:
        self.real = real
        self.zeros: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.zeros is None or self.zeros.shape[0] != x.shape[0]:
            self.zeros = torch.zeros_like(self.real(x))  # [n, out]
        return self.zeros


def can_split(runtime: Any) -> bool:
    """Whether ``runtime`` keeps its matmuls where :func:`matmul_split` can stub them (the native runtime)."""
    return all(isinstance(getattr(runtime, name, None), list) for name in MATMUL_LISTS) and callable(
        getattr(runtime, HEAD, None)
    )


def matmul_split(runtime: Any, context_ids: Sequence[int], *, repeats: int = 15) -> dict[str, float] | None:
    """Milliseconds of a 1-token forward after ``context_ids``: whole, without the matmuls, and
    their difference (medians of ``repeats`` alternating runs). None for a runtime whose matmuls
    cannot be stubbed. The runtime's matmuls are restored afterwards, whatever happens."""
    if not can_split(runtime):
        return None
    real = {name: getattr(runtime, name) for name in (*MATMUL_LISTS, HEAD)}
    stubs: dict[str, Any] = {name: [_ZeroStub(m) for m in real[name]] for name in MATMUL_LISTS}
    stubs[HEAD] = _ZeroStub(real[HEAD])
    runtime.prefill(list(context_ids))
    base, token = runtime.length, int(context_ids[-1])

    def timed(matmuls: dict[str, Any]) -> float:
        for name, value in matmuls.items():
            setattr(runtime, name, value)
        runtime.rollback(base)
        t0 = time.perf_counter()
        runtime.forward([token])
        return time.perf_counter() - t0

    whole: list[float] = []
    rest: list[float] = []
    try:
        for _ in range(2):  # warm up both (and make the stubs' zeros)
            timed(real)
            timed(stubs)
        for r in range(repeats):
            pair = (real, stubs) if r % 2 == 0 else (stubs, real)
            for which in pair:
                (whole if which is real else rest).append(timed(which))
    finally:
        for name, value in real.items():
            setattr(runtime, name, value)
        runtime.rollback(base)
    whole_ms, rest_ms = 1e3 * statistics.median(whole), 1e3 * statistics.median(rest)
    return {"forward_ms": whole_ms, "rest_ms": rest_ms, "matmul_ms": whole_ms - rest_ms, "context": base}


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one row per mode and the command line."""
    cfg, machine = report["config"], report["machine"]
    lines = [
        "# A token's time per weight format: the matmuls and the rest",
        "",
        f"Model `{cfg['model']}`, a 1-token forward after one dev prompt ({cfg['context']} tokens), medians of "
        f"{cfg['repeats']} alternating runs whole and with every matmul stubbed out. Machine: {machine['cpu_model']}, "
        f"{machine['cpu_count']} CPUs, torch {machine['torch']} with {cfg['threads']} thread(s).",
        "",
        "| mode | 1-token forward ms | matmul ms | rest ms | rest share |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, s in report["results"].items():
        if s is None:
            lines.append(f"| {mode} | - | - | - | - |")
            continue
        lines.append(f"| {mode} | {s['forward_ms']:.2f} | {s['matmul_ms']:.2f} | {s['rest_ms']:.2f} "
                     f"| {100 * s['rest_ms'] / s['forward_ms']:.0f}% |")
    lines += ["", "Matmul ms is the difference, rest ms the stubbed forward. Produced by:", "", "```",
              report["command"], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default', a built-in name, a HF folder or a .gguf")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="the context is its first question's first turn")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=15, help="alternating runs of each forward (the medians count)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write modes_probe.json and modes_probe.md here")
    args = parser.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        names = parse_modes(args.modes)
        if args.out_dir is not None:
            check_writable(args.out_dir)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        prompt = spread_questions(read_questions(args.questions), 1)[0].prompt
        results: dict[str, Any] = {}
        context = 0
        for name in names:
            print(f"{name}: loading and timing the split", file=sys.stderr)
            dtype, quant = MODES[name]
            with quiet_transformers():
                loaded = load_model(args.model, dtype=dtype, quant=quant)  # type: ignore[arg-type]
            ids = loaded.encode_prompt(prompt)
            context = len(ids)
            results[name] = matmul_split(loaded.runtime, ids, repeats=args.repeats)
            del loaded
    except DraftwiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {
        "benchmark": "a token's time per weight format: the matmuls and the rest",
        "command": command,
        "config": {"model": args.model, "questions": str(args.questions), "modes": list(names),
                   "repeats": args.repeats, "context": context, "threads": torch.get_num_threads()},
        "machine": machine_info(),
        "results": results,
    }
    md = render_markdown(report)
    if args.out_dir is not None:
        write_json_atomic(args.out_dir / f"{RESULT_STEM}.json", report)
        write_text_atomic(args.out_dir / f"{RESULT_STEM}.md", md)
        print(f"wrote {args.out_dir / (RESULT_STEM + '.json')} and {args.out_dir / (RESULT_STEM + '.md')}", file=sys.stderr)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
