"""Does a long prompt stall the streams already running? Chunked prefill in the batched engine.

Eight greedy generations decode together on the default model; after ``--warm-steps`` steps a
~2,000-token prompt arrives and prefills ``--prefill-chunk`` tokens per step beside them. For
each running stream: its median gap between steps before the prompt arrived, and its largest
gap while the prompt prefilled. Goal: largest < 3x median. One engine per chunk size, one after
the other, in one process.

    python benchmarks/batch_latency.py --prefill-chunk 16,32,64,128 --out benchmarks/results/batch-latency

Writes ``summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from draftwise.core.decode import Stream
from draftwise.core.engine import Engine
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.core.sampling import SamplingConfig


def long_prompt(model: Any, tokens: int) -> list[int]:
    """About ``tokens`` tokens of dev-question text in one user turn."""
    text, questions = "", read_questions(DEFAULT_QUESTIONS)
    for q in questions:
        text += " ".join(q.turns) + "\n"
        ids = model.encode_prompt("Summarise these questions:\n" + text)
        if len(ids) >= tokens:
            return ids[:tokens]
    return ids


def run(model: Any, prompts: list[list[int]], long_ids: list[int], chunk: int, warm_steps: int) -> dict[str, Any]:
    engine = Engine(model, max_batch=len(prompts) + 1, context=4096, prefill_chunk=chunk)
    times: list[list[float]] = [[] for _ in prompts]
    marks: dict[str, float] = {}

    def stream_job(i: int) -> Any:
        def go(m: Any) -> None:
            s = Stream(m, prompts[i], max_new_tokens=100_000, sampling=SamplingConfig(), stop=())
            for _ in s.by_step():
                times[i].append(time.perf_counter())
                if marks.get("done"):
                    s.close()
                    return

        return go

    def long_job(m: Any) -> None:
        s = Stream(m, long_ids, max_new_tokens=4, sampling=SamplingConfig(), stop=())
        for _ in s.by_step():
            marks.setdefault("first", time.perf_counter())

    for i in range(len(prompts)):
        engine.start(stream_job(i))
    steps = 0
    while engine.running:
        if steps == warm_steps:
            marks["arrived"] = time.perf_counter()
            engine.start(long_job)
        if "first" in marks and steps > warm_steps + 10:
            marks["done"] = 1.0
        engine.step()
        steps += 1
    ratios = []
    for ts in times:
        gaps = [(b - a, b) for a, b in zip(ts, ts[1:])]
        before = [g for g, at in gaps if at < marks["arrived"]][-20:]
        during = [g for g, at in gaps if marks["arrived"] <= at <= marks["first"]]
        if before and during:
            ratios.append(max(during) / statistics.median(before))
    return {"prefill_chunk": chunk, "prompt_tokens": len(long_ids), "prefill_s": marks["first"] - marks["arrived"],
            "worst_ratio": max(ratios), "median_ratio": statistics.median(ratios), "ratios": ratios,
            "median_gap_before_ms": statistics.median(
                statistics.median([b - a for a, b in zip(ts, ts[1:]) if b < marks["arrived"]][-20:]) * 1000
                for ts in times)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill-chunk", default="16,32,64,128")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--warm-steps", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/results/batch-latency")
    args = ap.parse_args()
    chunks = [int(c) for c in args.prefill_chunk.split(",")]
    model = load_model("default", max_context=4096)
    prompts = [model.encode_prompt(q.turns[0]) for q in spread_questions(read_questions(DEFAULT_QUESTIONS), args.streams)]
    long_ids = long_prompt(model, args.prompt_tokens)
    rows = []
    for chunk in chunks:
        rows.append(run(model, prompts, long_ids, chunk, args.warm_steps))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "ratios"}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"command": "python benchmarks/batch_latency.py " + " ".join(sys.argv[1:]), "streams": args.streams,
               "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write_json_atomic(out / "summary.json", summary)
    lines = ["# A long prompt beside running streams (chunked prefill)", "",
             f"{args.streams} greedy streams decode on the default model (float32); after {args.warm_steps} steps a "
             f"{len(long_ids)}-token prompt arrives. Per stream: largest gap between its steps while the prompt "
             "prefilled / its median gap over the 20 steps before. Goal: < 3x.", "",
             f"Command: `{summary['command']}` ({summary['date']})", "",
             "| prefill chunk | prefill s | median gap before (ms) | worst stream | median stream |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['prefill_chunk']} | {r['prefill_s']:.1f} | {r['median_gap_before_ms']:.0f} | "
                     f"{r['worst_ratio']:.2f}x | {r['median_ratio']:.2f}x |")
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
