"""Measure ``serve --k auto`` at batch (the goodput policy) against plain batching and against
every fixed k of the plan's draft, at each concurrency N, on the real model (issue 27, item 4).

    python benchmarks/goodput_policy.py --plan benchmarks/results/planner/greedy/plan.json \
        --concurrency 1,2,4,8,16 --requests 2 --max-tokens 64 --fixed-ks 1,2,4,8 \
        --out benchmarks/results/goodput-policy/run

For each N and each policy, one fresh server (never two model processes at once; a fresh one so
the suffix draft's cross-request cache never holds another phase's answers to the same
prompts): ``draftwise serve --draft auto --plan PLAN --k auto --max-batch N`` (``--max-batch``
to fix one value for every N). Policies: ``plain`` (requests with ``draft: none``), ``goodput``
(each request's category, k ``auto``: the goodput policy at N > 1 when the server found a batch
profile, see its log; at max batch 1, the single-stream adaptive k) and ``k=K`` (the plan's
overall draft at fixed k, K from ``--fixed-ks``). N clients send R units each, greedy, from dev
questions the plan did not trace, spread over the categories: a unit is a question's first
turn, or with ``--turns all`` every turn of it, one after the other with the earlier answers in
its history (the plan's workload); every answer is compared with the same conversation decoded
alone. Goals: goodput >= 0.97x plain at every
N, >= 1.3x plain at N = 1, and >= 1.05x the best fixed k at some N. After each phase the
server's ``/metrics`` is saved as ``metrics-nN-POLICY.txt`` (the k's the policy chose are
``draftwise:spec_decode_chosen_k``; the counts include the one warm-up request).

``--rounds R`` (default 1) runs every policy R times at each N, in R rounds: each round runs
every policy once, in an order that rotates from round to round, so each policy's phases come
minutes apart from the others' and none is always first. One phase's tok/s varies by 10-25% on
these shared 2-core machines, as much as the 5% the goal asks to resolve; a policy's figure is
the median over its rounds, and ``goodput / best fixed`` is also given per round (the same
round's phases, minutes apart), with its median and range.

Needs a batch profile for the goodput policy at N > 1 (``draftwise plan --concurrency
1,2,4,8,16 --out DIR`` measures one, about a minute, cached beside the model's profile).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from draftwise.api import generate
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.loaders import load_model


def prompts_unseen(plan: dict[str, Any], count: int, turns: str = "first") -> list[dict[str, Any]]:
    """``count`` units from dev questions the plan did not trace, spread over the categories: a
    unit is a question's first turn, or (``turns="all"``) every turn of it, sent one after the
    other with the earlier answers in the history, as the plan traced them."""
    seen = {str(p.get("question_id")) for p in plan.get("prompts", [])}
    fresh = [q for q in read_questions(DEFAULT_QUESTIONS) if str(q.question_id) not in seen]
    if len(fresh) < count:
        raise SystemExit(f"only {len(fresh)} dev questions are not in the plan; lower --requests or --concurrency")
    return [{"question_id": q.question_id, "category": q.category,
             "users": list(q.turns if turns == "all" else q.turns[:1])}
            for q in spread_questions(fresh, count)]


def references(args: argparse.Namespace, prompts: list[dict[str, Any]]) -> None:
    """Each unit's turns decoded alone (greedy): the token ids every answer must equal, and the
    answers' text, which the later turns carry in their history."""
    model = load_model(args.model, dtype=args.dtype, quant=args.quant)
    for p in prompts:
        p["requests"] = []
        answers: list[str] = []
        for j in range(len(p["users"])):
            ids = encode_conversation(model.tokenizer, p["users"][: j + 1], answers, chat=True)
            ref = generate(model, ids, max_new_tokens=args.max_tokens).token_ids
            p["requests"].append({"users": p["users"][: j + 1], "answers": list(answers), "reference": ref})
            answers.append(model.tokenizer.decode(ref, skip_special_tokens=True))
    del model
    gc.collect()


def start_server(args: argparse.Namespace, batch: int, log: Path, trace: Path | None = None) -> subprocess.Popen[bytes]:
    exe = shutil.which("draftwise", path=str(Path(sys.executable).parent)) or "draftwise"
    cmd = [exe, "serve", "--model", args.model, "--draft", "auto", "--plan", args.plan, "--k", "auto",
           "--port", str(args.port), "--max-batch", str(batch), "--max-queue", "256",
           "--max-tokens-cap", str(args.max_tokens), "--request-timeout", "3600",
           "--dtype", args.dtype, "--quant", args.quant,
           *(["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else [])]
    env = {**os.environ, "DRAFTWISE_PASS_TRACE": str(trace)} if trace else None  # each pass's shape and time
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    for _ in range(600):  # bounded: 5 minutes to load
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{args.port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"the server did not start in 5 minutes; see {log}")


async def ask(client: httpx.AsyncClient, url: str, p: dict[str, Any], spec: dict[str, Any], max_tokens: int) -> list[dict[str, Any]]:
    """One unit: its turns one after the other, each with the earlier reference answers."""
    out = []
    for turn, req in enumerate(p["requests"], start=1):
        messages = []
        for j, user in enumerate(req["users"]):
            messages.append({"role": "user", "content": user})
            if j < len(req["answers"]):
                messages.append({"role": "assistant", "content": req["answers"][j]})
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
                "speculative": spec}
        r = await client.post(url + "/v1/chat/completions", json=body)
        if r.status_code != 200:
            out.append({"question_id": p["question_id"], "turn": turn, "error": f"HTTP {r.status_code}: {r.text[:200]}"})
            continue
        data = r.json()
        ids = data["choices"][0].get("token_ids", [])
        out.append({"question_id": p["question_id"], "turn": turn, "error": None,
                    "tokens": data["usage"]["completion_tokens"],
                    "equal": req["reference"] is None or ids == req["reference"],
                    "k": data.get("speculative", {}).get("k")})
    return out


async def phase(url: str, prompts: list[dict[str, Any]], spec_of: Any, clients: int, requests: int,
                max_tokens: int) -> tuple[list[dict[str, Any]], float]:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:

        async def run_client(i: int) -> list[dict[str, Any]]:
            return [r for p in prompts[i * requests:(i + 1) * requests]  # one unit after the other
                    for r in await ask(client, url, p, spec_of(p), max_tokens)]

        t0 = time.perf_counter()
        out = await asyncio.gather(*(run_client(i) for i in range(clients)))
        return [r for rs in out for r in rs], time.perf_counter() - t0


def policies(plan: dict[str, Any], fixed_ks: list[int]) -> dict[str, Any]:
    overall = plan["recommended"]["overall"]
    draft = overall["draft"] if isinstance(overall, dict) else overall[0]
    out: dict[str, Any] = {"plain": lambda p: {"draft": "none"},
                           "goodput": lambda p: {"category": p["category"], "k": "auto"}}
    for k in fixed_ks:
        out[f"k={k}"] = lambda p, k=k: {"draft": draft, "k": k}
    return out


def rotation(names: list[str], r: int) -> list[str]:
    """The order of round ``r``: ``names`` rotated by ``r``, so that each policy runs first once
    every ``len(names)`` rounds.

    >>> rotation(["plain", "goodput", "k=1"], 1)
    ['goodput', 'k=1', 'plain']
    """
    r %= len(names)
    return names[r:] + names[:r]


def paired(rounds: dict[str, list[float]]) -> dict[str, float] | None:
    """``goodput`` over the best fixed k (by median) in each round: its median, min and max, with
    two rounds or more."""
    fixed = [k for k in rounds if k.startswith("k=")]
    if len(rounds.get("goodput", [])) < 2 or not fixed:
        return None
    best = max(fixed, key=lambda k: statistics.median(rounds[k]))
    ratios = [g / f for g, f in zip(rounds["goodput"], rounds[best], strict=True)]
    return {"best_fixed": best, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def single_k(measured: dict[str, dict[str, float]]) -> dict[str, Any] | None:
    """The fixed k a static configuration would set once for every N (as vLLM's
    ``num_speculative_tokens``): the one with the highest geometric mean of its tokens/s over
    plain batching across the grid; and goodput over it at each N. A second reading of the goal,
    beside goodput over the best fixed k at each N (chosen in hindsight per N), which is stricter.

    >>> m = {"1": {"plain": 10.0, "goodput": 15.0, "k=1": 12.0, "k=8": 15.0},
    ...      "16": {"plain": 50.0, "goodput": 60.0, "k=1": 60.0, "k=8": 40.0}}
    >>> r = single_k(m)
    >>> r["k"], [round(x, 2) for x in r["goodput_over"].values()]
    ('k=1', [1.25, 1.0])
    """
    fixed = [k for k in next(iter(measured.values()), {}) if k.startswith("k=")]
    if not fixed:
        return None

    def score(k: str) -> float:
        return statistics.geometric_mean([row[k] / row["plain"] for row in measured.values()])

    best = max(fixed, key=score)
    return {"k": best, "geomean_vs_plain": score(best),
            "goodput_over": {n: row["goodput"] / row[best] for n, row in measured.items()}}


def table(result: dict[str, Any]) -> str:
    names = list(next(iter(result["measured"].values())))
    lines = ["| N | " + " | ".join(f"{n} tok/s" for n in names) + " | goodput / plain | goodput / best fixed |",
             "|---:|" + "---:|" * (len(names) + 2)]
    for n, row in result["measured"].items():
        fixed = max((v for k, v in row.items() if k.startswith("k=")), default=float("nan"))
        lines.append(f"| {n} | " + " | ".join(f"{row[k]:.1f}" for k in names)
                     + f" | {row['goodput'] / row['plain']:.2f} | {row['goodput'] / fixed:.2f} |")
    pairs = {n: p for n, p in result.get("paired", {}).items() if p}
    if pairs:
        lines += ["", "goodput / best fixed k, round by round (each policy's median is over "
                  f"{result['config']['rounds']} rounds):", ""]
        lines += [f"- N = {n}: {p['best_fixed']}, median {p['median']:.2f}, range {p['min']:.2f}-{p['max']:.2f}"
                  for n, p in pairs.items()]
    one = result.get("single_k")
    if one:
        lines += ["", f"One k for every N (the best by geometric mean over plain across the grid: {one['k']}, "
                  f"{one['geomean_vs_plain']:.2f}x): goodput over it "
                  + ", ".join(f"{v:.2f} at N = {n}" for n, v in one["goodput_over"].items()) + "."]
    g = result["goals"]
    lines += ["", f"goodput >= 0.97x plain at every N: {g['every_n_097']}; >= 1.3x plain at N=1: {g['n1_13']}; "
              f">= 1.05x best fixed k at some N (best per N, in hindsight): {g['beats_fixed_105']}; "
              f">= 1.05x the one best k at some N: {g.get('beats_single_105')}; outputs equal: {result['equal']}"]
    return "\n".join(lines)


def rescore(out: Path) -> int:
    result = json.loads((out / "result.json").read_text())
    one = result["single_k"] = single_k(result["measured"])
    result["goals"]["beats_single_105"] = bool(one) and any(v >= 1.05 for v in one["goodput_over"].values())
    write_json_atomic(out / "result.json", result)
    write_text_atomic(out / "result.md", table(result) + "\n")
    print(table(result))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--plan", help="the plan the servers follow (required unless --rescore)")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per policy")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--turns", choices=("first", "all"), default="first",
                    help="a unit is a question's first turn, or every turn of it (the plan's workload)")
    ap.add_argument("--fixed-ks", default="1,2,4,8", help="fixed k's of the plan's overall draft")
    ap.add_argument("--max-batch", type=int, default=0, help="serve --max-batch (0: N)")
    ap.add_argument("--port", type=int, default=8767)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--prefill-chunk", type=int, default=0, help="serve --prefill-chunk (0: its default)")
    ap.add_argument("--pass-trace", action="store_true", help="each phase's passes to passes-TAG.jsonl "
                    "(DRAFTWISE_PASS_TRACE; price them with benchmarks/pass_trace_price.py)")
    ap.add_argument("--rounds", type=int, default=1, help="phases per policy at each N, in rotating order")
    ap.add_argument("--out", default="benchmarks/results/goodput-policy/run")
    ap.add_argument("--rescore", metavar="DIR", help="recompute DIR/result.json's summary (adds the one-k reading "
                    "to runs made before it) and rewrite DIR/result.md; runs nothing")
    args = ap.parse_args()
    if args.rescore:
        return rescore(Path(args.rescore))
    if not args.plan:
        ap.error("--plan is required")
    if args.rounds < 1:
        raise SystemExit("--rounds must be 1 or more")
    grid = [int(n) for n in args.concurrency.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = json.loads(Path(args.plan).read_text())
    prompts = prompts_unseen(plan, max(grid) * args.requests, args.turns)
    references(args, prompts)
    url = f"http://127.0.0.1:{args.port}"
    measured: dict[str, dict[str, float]] = {}
    by_round: dict[str, dict[str, list[float]]] = {}
    records: list[dict[str, Any]] = []
    every = policies(plan, [int(k) for k in args.fixed_ks.split(",")])
    for n in grid:
        by_round[str(n)] = {name: [] for name in every}
        for r, name in [(i, nm) for i in range(args.rounds) for nm in rotation(list(every), i)]:
            spec_of = every[name]
            batch = args.max_batch or n
            tag = f"n{n}-{name}" + (f"-r{r}" if args.rounds > 1 else "")
            proc = start_server(args, batch, out / f"server-{tag}.log",
                                out / f"passes-{tag}.jsonl" if args.pass_trace else None)
            try:
                warm = {"question_id": "warm-up", "requests": [{"users": ["Say hello."], "answers": [],
                                                                "reference": None}]}
                # warm up with the phase's own speculation (its first use builds what it needs), off the clock
                first = spec_of(prompts[0])
                asyncio.run(phase(url, [warm], lambda p: first, 1, 1, 8))
                recs, wall = asyncio.run(phase(url, prompts[: n * args.requests], spec_of, n, args.requests,
                                               args.max_tokens))
                # the k the policy chose each step (draftwise:spec_decode_chosen_k) and the rest
                (out / f"metrics-{tag}.txt").write_text(httpx.get(f"{url}/metrics", timeout=30).text)
            finally:
                proc.terminate()
                proc.wait(30)
            tokens = sum(x.get("tokens", 0) for x in recs)
            by_round[str(n)][name].append(tokens / wall)
            records += [{**x, "n": n, "policy": name, "round": r} for x in recs]
            print(f"N={n} {name} round {r}: {tokens / wall:.1f} tok/s, {sum(bool(x.get('equal')) for x in recs)}/"
                  f"{len(recs)} equal", flush=True)
        measured[str(n)] = {name: statistics.median(v) for name, v in by_round[str(n)].items()}
    ratio = {n: row["goodput"] / row["plain"] for n, row in measured.items()}
    best_fixed = {n: max(v for k, v in row.items() if k.startswith("k=")) for n, row in measured.items()}
    one = single_k(measured)
    result = {"measured": measured, "rounds": by_round, "paired": {n: paired(v) for n, v in by_round.items()},
              "single_k": one,
              "equal": [sum(bool(r.get("equal")) for r in records), len(records)],
              "goals": {"every_n_097": all(r >= 0.97 for r in ratio.values()),
                        "n1_13": ratio.get("1", 0.0) >= 1.3,
                        "beats_fixed_105": any(measured[n]["goodput"] >= 1.05 * best_fixed[n] for n in measured),
                        "beats_single_105": bool(one) and any(v >= 1.05 for v in one["goodput_over"].values())},
              "config": {**vars(args), "date": time.strftime("%Y-%m-%d %H:%M")}}
    write_json_atomic(out / "result.json", result)
    write_json_atomic(out / "records.json", records)
    write_text_atomic(out / "result.md", table(result) + "\n")
    print(table(result))
    return 0 if result["equal"][0] == result["equal"][1] else 1


if __name__ == "__main__":
    sys.exit(main())
