"""Measure what ``draftwise plan --concurrency`` predicts: aggregate tokens/s at each N, plain
batching against the server's speculation, with ``benchmarks/load_test.py``'s machinery.

    python benchmarks/goodput_validate.py --plan out/plan.json --concurrency 1,2,4,8,16 \
        --requests 2 --max-tokens 64 --out out/load --measured out/measured.json \
        [--predicted out/concurrency.json --policy plan]

For each N, one at a time: one server (``draftwise serve --draft auto --plan PLAN --max-batch N``,
``--k plan`` by default: each category's recommended draft and k, which the ``plan`` policy
predicts), N streaming clients x R requests, greedy, phase ``none`` (plain batching) then phase
``auto``; then the server stops. Prompts are dev questions the plan did *not* trace (its
``prompts`` list names the question ids it saw), first turns spread over the categories, none
repeated; every output is compared with the same prompt decoded alone (greedy), so "equal"
checks that batching and speculation change no token.

Writes ``--measured`` (``{"measured": {N: {"plain": tok/s, "auto": tok/s}}, "equal": [x, y],
"errors": e}``) and, with ``--predicted``, prints the comparison
(:func:`draftwise.cost.capacity.compare_measured`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load_test  # noqa: E402  (benchmarks/load_test.py, beside this script)

from draftwise.cost.capacity import compare_measured, parse_concurrency, render_validation_markdown  # noqa: E402
from draftwise.errors import ConfigError  # noqa: E402
from draftwise.fsutil import write_json_atomic  # noqa: E402
from draftwise.questions import DEFAULT_QUESTIONS, read_questions  # noqa: E402


def unseen_prompts(plan_path: str, count: int) -> list[dict[str, Any]]:
    """``count`` load-test prompts from dev questions whose ids the plan did not trace."""
    plan = json.loads(Path(plan_path).read_text())
    seen = {str(p.get("question_id")) for p in plan.get("prompts", [])}
    fresh = [q for q in read_questions(DEFAULT_QUESTIONS) if str(q.question_id) not in seen]
    if len(fresh) < count:
        raise SystemExit(f"only {len(fresh)} dev questions are not in the plan; lower --requests or --concurrency")
    return load_test.make_prompts(fresh, count)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per phase")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", choices=("plan", "auto"), default="plan")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--out", default="benchmarks/results/goodput-validate")
    ap.add_argument("--measured", default=None, help="where to write the measurements (default: OUT/measured.json)")
    ap.add_argument("--predicted", default=None, help="concurrency.json to score")
    ap.add_argument("--policy", default="plan", help="the predicted policy the auto phase runs")
    args = ap.parse_args()
    try:
        grid = parse_concurrency(args.concurrency)
    except ConfigError as exc:
        ap.error(str(exc))
    if min(args.requests, args.max_tokens) < 1:
        ap.error("--requests and --max-tokens must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = unseen_prompts(args.plan, max(grid) * args.requests)
    print(f"references: {len(prompts)} prompts the plan did not see, greedy, {args.max_tokens} tokens", flush=True)
    load_test.references(args.model, prompts, args.max_tokens, dtype=args.dtype, quant=args.quant)
    measured: dict[int, dict[str, float]] = {}
    records: list[dict[str, Any]] = []
    for n in grid:
        server_args = argparse.Namespace(model=args.model, plan=args.plan, port=args.port, clients=n,
                                         max_tokens=args.max_tokens, out=str(out), dtype=args.dtype,
                                         quant=args.quant, k=args.k)
        proc, url, _ = load_test.start_server(server_args, n)
        try:
            warm = {"question_id": "warm-up", "category": "overall", "turn": 1, "users": [load_test.WARM_UP],
                    "answers": [], "reference": []}
            asyncio.run(load_test.phase(url, [warm], "auto", 1, 1, 8, args.k == "auto"))
            mine = prompts[: n * args.requests]
            measured[n] = {}
            for mode, key in (("none", "plain"), ("auto", "auto")):
                recs, wall = asyncio.run(load_test.phase(url, mine, mode, n, args.requests, args.max_tokens,
                                                         args.k == "auto"))
                s = load_test.summarize(recs, wall)
                measured[n][key] = s["tokens_per_s"]
                for r in recs:
                    r["n"] = n
                records += recs
                print(f"N={n} {mode}: {s['tokens_per_s']:.1f} tok/s, {s['equal']}/{s['ok']} equal, "
                      f"{s['errors']} errors, {s['lost']} lost", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    ok = [r for r in records if r["error"] is None and not r["lost"]]
    equal = [sum(bool(r.get("equal")) for r in ok), len(records)]
    errors = sum(r["error"] is not None or r["lost"] for r in records)
    path = Path(args.measured) if args.measured else out / "measured.json"
    write_json_atomic(path, {"measured": {str(n): v for n, v in measured.items()}, "equal": equal, "errors": errors,
                             "config": {**vars(args), "date": time.strftime("%Y-%m-%d %H:%M")}})
    write_json_atomic(out / "run.json", {"prompts": prompts, "records": records})
    if args.predicted:
        result = json.loads(Path(args.predicted).read_text())
        print(render_validation_markdown(compare_measured(result, measured, args.policy)))
    return 0 if equal[0] == equal[1] and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
