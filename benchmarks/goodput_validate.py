"""Measure what ``draftwise plan --concurrency`` predicts, on the workload the plan measured:
aggregate and per-request tokens/s at each N, plain batching against the server's speculation.

    python benchmarks/goodput_validate.py --plan out/plan.json --concurrency 1,2,4,8,16 \
        --requests 2 --out out/load --measured out/measured.json

A command-line front for :func:`draftwise.server.validate.measure_concurrency` (its docstring
says what is measured and what ``--measured`` holds), which ``draftwise plan --concurrency
--validate`` runs itself: this loads the model, measures and writes the files; score them
against a prediction with :func:`draftwise.capacity.plan.score_load`. Needs the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import draftwise  # noqa: F401  first: the OpenMP defaults before torch loads (draftwise.threads)
from draftwise.api import share_cores_while_decoding
from draftwise.capacity.plan import parse_concurrency
from draftwise.errors import ConfigError
from draftwise.planner.plan_file import load_plan
from draftwise.runtime.loaders import load_model
from draftwise.server.validate import measure_concurrency


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=2,
                    help="units (questions, every turn of each) a client: at the largest N by default, at every N with --units 0")
    ap.add_argument("--units", type=int, default=None,
                    help="units every N sends, client i the i-th, (i + N)-th, ... (default: the largest N x "
                         "--requests, so each N does the same work); 0: N x --requests at each N")
    ap.add_argument("--max-tokens", type=int, default=None, help="per turn; default and only value: the plan's")
    ap.add_argument("--k", choices=("plan", "auto"), default="plan")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--out", default="benchmarks/results/goodput-validate")
    ap.add_argument("--measured", default=None, help="where to write the measurements (default: OUT/measured.json)")
    args = ap.parse_args()
    try:  # before the model loads
        parse_concurrency(args.concurrency)
        load_plan(args.plan)
    except ConfigError as exc:
        ap.error(str(exc))
    share_cores_while_decoding()  # as `draftwise serve` runs
    model = load_model(args.model, dtype=args.dtype, quant=args.quant)
    try:
        raw = measure_concurrency(model, args.plan, args.concurrency, out_dir=Path(args.out),
                                  measured_path=args.measured, requests_per_client=args.requests, units=args.units,
                                  max_tokens=args.max_tokens, k=args.k, status=lambda line: print(line, flush=True))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if raw["equal"][0] == raw["equal"][1] and not raw["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
