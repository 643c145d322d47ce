"""Measure what ``draftwise plan --concurrency`` predicts, on the workload the plan measured:
aggregate and per-request tokens/s at each N, plain batching against the server's speculation,
with ``benchmarks/load_test.py``'s machinery.

    python benchmarks/goodput_validate.py --plan out/plan.json --concurrency 1,2,4,8,16 \
        --requests 2 --out out/load --measured out/measured.json

The workload is the plan's own, because its acceptance describes nothing else: a *unit* is one
question with all its turns, each turn one request whose history holds the earlier answers (as
the planner, bench and Spec-Bench run it; an MT-bench second turn copies much of the first
answer and accepts far more than a first turn), each answer up to the plan's
``max_new_tokens`` (``--max-tokens`` defaults to it and may not differ: acceptance grows along
an answer). The units are dev questions the plan did *not* trace (its ``prompts`` list names
the question ids it saw), spread over the categories, none repeated.

For each N, one at a time: one server (``draftwise serve --draft auto --plan PLAN --max-batch N``,
``--k plan`` by default: each category's recommended draft and k, which the ``plan`` policy
predicts), N streaming clients sharing the same U units at every N (``--units``, default the
largest N x R: client i sends units i, i + N, i + 2N, ..., so N = 1 and N = 16 decode the same
questions and their ratio and the crossover compare the same work; with ``--units 0`` client i
sends units i R + j, j < R, as before 2026-12-04), a unit's turns one
after the other, the next sent when the answer has arrived, greedy, phase ``none`` (plain
batching) then phase ``auto``; then the server stops. Every output is compared with the same
prompt decoded alone (greedy), so "equal" checks that batching and speculation change no token;
a later turn's history is the reference answer, which is the server's own whenever that turn
came out equal.

Writes ``--measured``: ``{"measured": {N: {"plain": tok/s, "auto": tok/s}}, "per_request": {N:
{"plain": tok/s, "auto": tok/s}}, "workload": [[{"question_id", "category", "turn",
"prompt_tokens", "new_tokens"}, ...], ...], "requests_per_client": R, "units_per_phase": U or
null, "max_tokens": M, "equal": [x, y], "errors": e}``: "workload" lists the units (indexed as
:func:`draftwise.capacity.simulate.client_units` shares them), each turn's prompt tokens with its
history and the tokens it answers with.
``draftwise plan --concurrency --validate`` (:func:`draftwise.capacity.plan.run_concurrency`)
predicts that very workload and scores it (:func:`draftwise.capacity.plan.compare_measured`).
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

from draftwise.capacity.plan import parse_concurrency  # noqa: E402
from draftwise.capacity.simulate import client_units  # noqa: E402
from draftwise.errors import ConfigError  # noqa: E402
from draftwise.fsutil import write_json_atomic  # noqa: E402
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions, spread_questions  # noqa: E402


def conversations(questions: list[Question], count: int) -> list[list[dict[str, Any]]]:
    """``count`` questions spread over the categories, each a unit of all its turns in order
    (a later turn's earlier answers are filled in by ``load_test.references``)."""
    return [[{"question_id": q.question_id, "category": q.category, "turn": t + 1, "users": list(q.turns[: t + 1])}
             for t in range(len(q.turns))] for q in spread_questions(questions, count)]


def unseen_units(plan: dict[str, Any], count: int) -> list[list[dict[str, Any]]]:
    """``count`` units (:func:`conversations`) from dev questions whose ids the plan did not trace."""
    seen = {str(p.get("question_id")) for p in plan.get("prompts", [])}
    fresh = [q for q in read_questions(DEFAULT_QUESTIONS) if str(q.question_id) not in seen]
    if len(fresh) < count:
        raise SystemExit(f"only {len(fresh)} dev questions are not in the plan; lower --units, --requests or --concurrency")
    return conversations(fresh, count)


def budget(plan: dict[str, Any], asked: int | None) -> int:
    """The tokens a turn may answer with: the plan's ``max_new_tokens``; another is refused."""
    traced = int(plan.get("config", {}).get("max_new_tokens", 128))
    if asked is not None and asked != traced:
        raise SystemExit(f"--max-tokens {asked}: the plan measured acceptance on answers of up to {traced} tokens a "
                         f"turn, and acceptance changes along an answer; drop --max-tokens, or make the plan with "
                         f"-n {asked}")
    return traced


def workload(units: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """What the clients send, unit by unit (after ``load_test.references``)."""
    return [[{"question_id": p["question_id"], "category": p["category"], "turn": p["turn"],
              "prompt_tokens": p["prompt_tokens"], "new_tokens": len(p["reference"])} for p in unit] for unit in units]


def measure(args: argparse.Namespace, grid: list[int], units: list[list[dict[str, Any]]],
            max_tokens: int) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]], list[dict[str, Any]]]:
    """Each N's server in turn: aggregate and per-request tokens/s of both phases, every record."""
    measured: dict[int, dict[str, float]] = {}
    per_request: dict[int, dict[str, float]] = {}
    records: list[dict[str, Any]] = []
    k_auto = args.k == "auto"
    for n in grid:
        server_args = argparse.Namespace(model=args.model, plan=args.plan, port=args.port, clients=n,
                                         max_tokens=max_tokens, out=str(args.out), dtype=args.dtype,
                                         quant=args.quant, k=args.k)
        proc, url, _ = load_test.start_server(server_args, n)
        try:
            warm = {"question_id": "warm-up", "category": "overall", "turn": 1, "users": [load_test.WARM_UP],
                    "answers": [], "reference": []}
            asyncio.run(load_test.phase(url, [[warm]], "auto", 1, 1, 8, k_auto))
            mine = client_units(n, len(units), requests_per_client=args.requests, per_phase=args.units or None)
            measured[n], per_request[n] = {}, {}
            for mode, key in (("none", "plain"), ("auto", "auto")):
                recs, wall = asyncio.run(load_test.phase(url, units, mode, n, args.requests, max_tokens, k_auto,
                                                         assignment=mine))
                s = load_test.summarize(recs, wall)
                measured[n][key], per_request[n][key] = s["tokens_per_s"], s["per_request_tps"]
                for r in recs:
                    r["n"] = n
                records += recs
                print(f"N={n} {mode}: {s['tokens_per_s']:.1f} tok/s ({s['per_request_tps']:.1f} a request), "
                      f"{s['requests']} requests, {s['equal']}/{s['ok']} equal, {s['errors']} errors, "
                      f"{s['lost']} lost", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    return measured, per_request, records


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
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--out", default="benchmarks/results/goodput-validate")
    ap.add_argument("--measured", default=None, help="where to write the measurements (default: OUT/measured.json)")
    args = ap.parse_args()
    try:
        grid = parse_concurrency(args.concurrency)
    except ConfigError as exc:
        ap.error(str(exc))
    if args.requests < 1 or (args.max_tokens is not None and args.max_tokens < 1):
        ap.error("--requests and --max-tokens must be >= 1")
    if args.units is None:
        args.units = max(grid) * args.requests
    if args.units and args.units < max(grid):
        ap.error(f"--units {args.units}: every client needs a question, so at least the largest N ({max(grid)})")
    plan = json.loads(Path(args.plan).read_text())
    max_tokens = budget(plan, args.max_tokens)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    units = unseen_units(plan, args.units or max(grid) * args.requests)
    prompts = [p for unit in units for p in unit]
    print(f"references: {len(units)} questions the plan did not see, {len(prompts)} turns, greedy, up to "
          f"{max_tokens} tokens a turn", flush=True)
    load_test.references(args.model, prompts, max_tokens, dtype=args.dtype, quant=args.quant)
    measured, per_request, records = measure(args, grid, units, max_tokens)
    ok = [r for r in records if r["error"] is None and not r["lost"]]
    equal = [sum(bool(r.get("equal")) for r in ok), len(records)]
    errors = sum(r["error"] is not None or r["lost"] for r in records)
    path = Path(args.measured) if args.measured else Path(args.out) / "measured.json"
    write_json_atomic(path, {
        "measured": {str(n): v for n, v in measured.items()},
        "per_request": {str(n): v for n, v in per_request.items()},
        "workload": workload(units), "requests_per_client": args.requests, "units_per_phase": args.units or None,
        "max_tokens": max_tokens,
        "equal": equal, "errors": errors, "config": {**vars(args), "date": time.strftime("%Y-%m-%d %H:%M")}})
    write_json_atomic(Path(args.out) / "run.json", {"prompts": prompts, "records": records})
    return 0 if equal[0] == equal[1] and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
