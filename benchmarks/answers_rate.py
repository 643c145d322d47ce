"""How fast are train-head's answers made? The batched engine against ``transformers`` batches.

The prompts are train-head's own (the training split of the shipped dev questions, in its
order), cut to ``--prompts``; each gets one greedy answer of up to ``--gen-tokens`` tokens, as
``draftwise train-head`` asks by default. Both backends run :mod:`draftwise.training.data`'s code
(``_generate_hf``: left-padded batches of 32 with ``transformers`` generate, the way answers
were made before; ``_generate_engine``: the batched engine, 32 sequences at a time, each exactly
what it gets alone) on the same prompts, in one process, their order alternating round by round
(hf, engine, engine, hf, ...). The ``transformers`` weights load before the clock starts.

    python benchmarks/answers_rate.py --prompts 64 --gen-tokens 256 --rounds 2 --out benchmarks/results/answers-rate

Writes ``summary.json`` and ``summary.md``: per round and backend the answer tokens, seconds and
tokens/s, the ratio engine / hf, and how many greedy answers the two backends share token for
token (near-ties in float32 may part them; the engine's are checked against ``generate`` alone in
tests/test_distill_answers.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from draftwise.cost.profile import cpu_flags, cpu_model
from draftwise.training import data as data_module
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.training.data import ordered_prompts, split_questions
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions


def timed(backend: str, model: Any, hf: Any, jobs: list[Any], gen_tokens: int) -> tuple[float, dict[str, list[int]]]:
    """(seconds, key -> answer tokens) of one backend over ``jobs``."""
    out: dict[str, list[int]] = {}

    def save(job: Any, continuation: list[int]) -> None:
        out[job[0]] = list(continuation)

    t0 = time.perf_counter()
    if backend == "hf":  # its weights loaded before the clock
        data_module._generate_hf(model, jobs, gen_tokens=gen_tokens, seed=0, save=save, hf_model=hf)
    else:
        data_module._generate_engine(model, jobs, gen_tokens=gen_tokens, save=save)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    model = load_model(args.model)
    train, _ = split_questions(read_questions(DEFAULT_QUESTIONS))
    prompts = ordered_prompts(train)[: args.prompts]
    room = model.runtime.max_context - args.gen_tokens
    jobs = [(f"q{q.question_id}", list(model.encode_prompt(q.prompt)), 0.0, q.question_id, 0) for q in prompts]
    jobs = sorted((j for j in jobs if len(j[1]) <= room), key=lambda j: len(j[1]))  # as make_sequences orders them
    hf = data_module.load_hf(model)
    rows, answers = [], {}
    for r in range(args.rounds):
        for backend in (("hf", "engine") if r % 2 == 0 else ("engine", "hf")):
            seconds, got = timed(backend, model, hf, jobs, args.gen_tokens)
            tokens = sum(len(v) for v in got.values())
            rows.append({"round": r, "backend": backend, "tokens": tokens, "seconds": seconds,
                         "tokens_per_s": tokens / seconds})
            print(f"round {r} {backend:>6}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s", flush=True)
            answers.setdefault(backend, got)
    ratios = []
    for r in range(args.rounds):
        by = {row["backend"]: row["tokens_per_s"] for row in rows if row["round"] == r}
        ratios.append(by["engine"] / by["hf"])
    same = sum(answers["hf"][k] == answers["engine"][k] for k in answers["hf"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {
        "model": model.name, "prompts": len(jobs), "gen_tokens": args.gen_tokens, "rounds": rows,
        "engine_over_hf": ratios, "median_engine_over_hf": statistics.median(ratios),
        "engine_batch": data_module.ENGINE_BATCH, "hf_batch": data_module.GEN_BATCH,
        "same_greedy_answers": same, "machine": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "commit": commit,
        "command": "python benchmarks/answers_rate.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "summary.json", summary)
    lines = [
        "# train-head's answers: the batched engine against transformers batches", "",
        f"{model.name}, {len(jobs)} prompts (train-head's training split), greedy, up to {args.gen_tokens} "
        f"tokens each; commit {commit}; {summary['machine']} ({', '.join(summary['cpu_flags']) or 'no listed flags'}), "
        f"{summary['threads']} threads.", "", f"    {summary['command']}", "",
        "| round | backend | answer tokens | seconds | tok/s |", "|---:|---|---:|---:|---:|",
        *[f"| {x['round']} | {x['backend']} | {x['tokens']} | {x['seconds']:.1f} | {x['tokens_per_s']:.1f} |" for x in rows],
        "", f"engine / hf per round: {', '.join(f'{x:.2f}x' for x in ratios)}; "
        f"greedy answers equal between the two: {same}/{len(jobs)}.",
    ]
    write_text_atomic(args.out / "summary.md", "\n".join(lines) + "\n")
    print(json.dumps({"engine_over_hf": ratios, "same": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
