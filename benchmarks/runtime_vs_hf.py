"""Plain greedy decoding, draftwise native runtime vs Hugging Face ``generate``.

    python benchmarks/runtime_vs_hf.py --num-prompts 20 --max-new-tokens 128

Writes ``runtime_vs_hf.json`` and ``runtime_vs_hf.md`` into ``benchmarks/results/`` (or
``--out-dir``) and prints the Markdown report. The memory-bandwidth roofline, which reports
before this one carried, is ``benchmarks/roofline.py``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from draftwise.bench import render_runtime_markdown, run_runtime_benchmark
from draftwise.errors import DraftwiseError
from draftwise.fsutil import check_writable
from draftwise.questions import DEFAULT_QUESTIONS

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default', a built-in name, a HF folder or a .gguf")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="Spec-Bench-format .jsonl, or a text file with one prompt a line")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16 (default both)"
    )
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per method per prompt; keeps the fastest")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = parser.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    try:
        check_writable(args.out_dir)
        report = run_runtime_benchmark(
            model=args.model,
            questions=args.questions,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            dtypes=[d.strip() for d in args.dtypes.split(",") if d.strip()],
            out_dir=args.out_dir,
            progress=not args.no_progress,
            threads=args.threads,
            repeats=args.repeats,
            command=command,
        )
    except DraftwiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_runtime_markdown(report))
    print(f"wrote {args.out_dir / 'runtime_vs_hf.json'} and {args.out_dir / 'runtime_vs_hf.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
