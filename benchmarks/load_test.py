"""Load test of ``draftwise serve``: N concurrent streaming clients x R requests each on the
dev-question mix, speculation ``none`` against ``auto``, against one server.

    python benchmarks/load_test.py --clients 64 --requests 4 --max-tokens 64 --k auto \
        --plan benchmarks/results/trees-plan/plan.json --out benchmarks/results/serve

1. Prompts: every request of a phase asks a different question (``--prompts``, default
   clients x requests). First turns of the dev questions come first, spread over the
   categories; past the first turns, second turns of the multi-turn (MT-bench) questions, as a
   conversation whose first answer is the reference answer to the first turn. No request
   repeats another, so the suffix draft's cross-request cache cannot learn an answer it is
   asked again.
2. References: each prompt is decoded greedily in this process with ``draftwise.api.generate``
   on the same token ids the server builds, exactly what ``draftwise generate -n MAX_TOKENS``
   runs.
3. One server is started (``draftwise serve --draft auto --plan PLAN``, with ``--k auto`` when
   asked) unless ``--url`` names a running one. Each phase sends every client's R requests
   (client i's j-th request is prompt ``(i * R + j) % P``): phase ``none`` with
   ``"speculative": {"draft": "none"}``, phase ``auto`` with ``"speculative": {"category":
   CATEGORY}`` (the plan's draft and k for it; with ``--k auto``, the plan's draft and the
   adaptive k). Whole phases run one after the other, so each phase's aggregate tokens/s is
   its own.
4. Per request: time to first token (client-side, queue included), end-to-end latency, the
   server's own prefill time (``timings.prompt_ms``: TTFT without the queue), tokens, errors.
   A request is *lost* if its stream ends without a final chunk or an error. Per phase: all
   tokens / its wall time (aggregate) and the mean of tokens / end-to-end (per request).

Batching: ``--max-batch 1,16`` starts one server per value, one after the other (never two at
once), each with ``serve --max-batch N``, and runs the phases against each; ``--phases none``
runs plain decoding only (the throughput of batching itself), e.g. ``--clients 16 --requests 1
--phases none --max-batch 1,16``. ``--dtype`` and ``--quant`` go to the server and to the
references, so "equal" checks each mode against its own plain decoding.

Writes ``run.json`` (every request), ``summary.json``, ``summary.md`` and ``load_test.png``.
"""

from __future__ import annotations

import argparse
import asyncio
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

from draftwise.capacity.simulate import client_units
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    read_questions,
    spread_questions,
)
from draftwise.runtime.loaders import load_model

# the parts this shares with `draftwise plan --concurrency --validate`, which drives the server in process
from draftwise.server.validate import MODES, WARM_UP, messages, pct, summarize  # noqa: F401  (re-exported)
from draftwise.server.validate import references as reference_answers


def make_prompts(questions: list[Question], count: int) -> list[dict[str, Any]]:
    """``count`` distinct prompts: first turns spread over the categories, then second turns of
    the multi-turn questions (their answers are filled in by :func:`references`)."""
    firsts = spread_questions(questions, min(count, len(questions)))
    prompts = [{"question_id": q.question_id, "category": q.category, "turn": 1, "users": [q.turns[0]]}
               for q in firsts]
    multi = [q for q in questions if len(q.turns) > 1]
    if count > len(questions) + len(multi):
        raise SystemExit(f"--prompts {count}: the dev questions give only {len(questions) + len(multi)} "
                         "distinct prompts (first turns and MT-bench second turns)")
    if count > len(questions):
        prompts += [{"question_id": q.question_id, "category": q.category, "turn": 2, "users": list(q.turns[:2])}
                    for q in spread_questions(multi, count - len(questions))]
    return prompts


def references(model_name: str, prompts: list[dict[str, Any]], max_tokens: int, *, dtype: str = "float32",
               quant: str = "none") -> float:
    """Each prompt's greedy answer (token ids) and its prompt's length in tokens, on the model
    loaded here (:func:`draftwise.server.validate.references`: a later turn's history holds the
    earlier turns' answers as bench and the planner put them there); the seconds it took."""
    return reference_answers(load_model(model_name, dtype=dtype, quant=quant), prompts, max_tokens)


async def one_request(client: httpx.AsyncClient, url: str, prompt: dict[str, Any], mode: str, max_tokens: int,
                      client_id: int, k_auto: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"draft": "none"} if mode == "none" else {"category": prompt["category"]}
    if mode != "none" and k_auto:
        spec["k"] = "auto"
    body = {"messages": messages(prompt), "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "return_token_ids": True, "speculative": spec}
    rec: dict[str, Any] = {"mode": mode, "phase": mode, "client": client_id, "question_id": prompt["question_id"],
                           "turn": prompt["turn"], "category": prompt["category"], "error": None, "lost": False}
    t0 = time.perf_counter()
    final = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec["error"] = chunk["error"]["message"]
                    break
                delta = chunk["choices"][0].get("delta", {}) if chunk["choices"] else {}
                if delta.get("content") and "ttft" not in rec:
                    rec["ttft"] = time.perf_counter() - t0
                if chunk["choices"] and chunk["choices"][0].get("finish_reason"):
                    final = chunk
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["e2e"] = time.perf_counter() - t0
    if final is None and rec["error"] is None:
        rec["lost"] = True
    if final is not None:
        ids = final["choices"][0].get("token_ids", [])
        rec.update(tokens=final["usage"]["completion_tokens"], equal=ids == prompt["reference"],
                   prefill_s=final["timings"]["prompt_ms"] / 1000, decode_s=final["timings"]["predicted_ms"] / 1000,
                   draft=final["speculative"]["draft"],
                   k=final["speculative"]["k"], mat=final["speculative"]["mean_committed_per_pass"])
        rec.setdefault("ttft", rec["e2e"])  # an empty answer: its first token is its end
    return rec


async def phase(url: str, units: list[list[dict[str, Any]]], mode: str, clients: int, requests: int,
                max_tokens: int, k_auto: bool, assignment: list[list[int]] | None = None,
                ) -> tuple[list[dict[str, Any]], float]:
    """Each of ``clients`` clients sends ``requests`` units one after the other (client i's j-th
    is unit ``(i * requests + j) % len(units)``), or the units ``assignment[i]`` names, a unit's
    prompts (a conversation's turns) one after the other; every phase's wall time runs from the
    first request to the last answer."""
    if assignment is None:
        assignment = client_units(clients, len(units), requests_per_client=requests)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:

        async def run_client(i: int) -> list[dict[str, Any]]:
            out = []
            for u in assignment[i]:  # bounded: its units, one after the other
                for prompt in units[u]:  # bounded: its turns
                    out.append(await one_request(client, url, prompt, mode, max_tokens, i, k_auto))
            return out

        t0 = time.perf_counter()
        results = await asyncio.gather(*(run_client(i) for i in range(clients)))
        return [r for rs in results for r in rs], time.perf_counter() - t0


def by_category(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Server-side tokens/s per category and phase (prefill included, queue excluded)."""
    rows = []
    for cat in dict.fromkeys(r["category"] for r in records):
        ok = {m: [r for r in records if r["category"] == cat and r["mode"] == m and "decode_s" in r] for m in MODES}
        if not all(ok.values()):
            continue
        tps = {m: sum(r["tokens"] for r in rs) / sum(r["prefill_s"] + r["decode_s"] for r in rs) for m, rs in ok.items()}
        drafts = sorted({r["draft"] for r in ok["auto"]})
        rows.append({"category": cat, "requests": len(ok["auto"]), "none_tps": tps["none"], "auto_tps": tps["auto"],
                     "speedup": tps["auto"] / tps["none"], "draft": ", ".join(drafts),
                     "mat": statistics.mean(r["mat"] for r in ok["auto"])})
    return rows


def render(summary: dict[str, Any]) -> str:
    s, cfg = summary["phases"], summary["config"]
    lines = [
        "# draftwise serve: load test", "",
        f"{cfg['clients']} concurrent streaming clients x {cfg['requests']} requests each per phase, greedy, "
        f"max_tokens={cfg['max_tokens']}, {cfg['prompts']} distinct prompts ({cfg['turns'][0]} dev questions' first "
        f"turns spread over the categories, {cfg['turns'][1]} MT-bench second turns; none repeated); auto phase: "
        f"the plan's draft per category with {'the adaptive k' if cfg['k'] == 'auto' else 'the plan' + chr(39) + 's k'}; "
        f"model {cfg['model']} ({cfg.get('dtype', 'float32')}, quant {cfg.get('quant', 'none')}); servers started "
        f"one at a time with --max-batch {cfg.get('max_batch', [1])}; last server `{cfg['server']}`; {cfg['date']}.",
        "",
        f"Command: `{cfg['command']}`", "",
        "| speculation | requests | errors | lost | equal to `draftwise generate` | tokens/s | TTFT p50 | "
        "TTFT p99 | e2e p50 | e2e p99 | server TTFT p50 (prefill) | tokens/pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, p in s.items():
        lines.append(
            f"| {mode} | {p['requests']} | {p['errors']} | {p['lost']} | {p['equal']}/{p['ok']} | "
            f"{p['tokens_per_s']:.1f} | {p['ttft_p50_s']:.2f} s | {p['ttft_p99_s']:.2f} s | {p['e2e_p50_s']:.2f} s | "
            f"{p['e2e_p99_s']:.2f} s | {p['prefill_p50_s'] * 1000:.1f} ms | {p['mean_committed_per_pass']:.2f} |")
    g = summary["goals"]
    for key, value in g.get("batching", {}).items():
        lines += ["", f"{key}: **{value:.2f}x** the aggregate tokens/s of the same phase at the first --max-batch."]
    if "speedup" not in g:
        return "\n".join(lines) + "\n"
    lines += ["", f"auto / none aggregate tokens/s: **{g['speedup']:.2f}x** (goal >= 1.3x). "
              f"Server-side TTFT p50 (prefill, no queue): auto {g['prefill_overhead'] * 100:+.1f}% vs none "
              f"(goal <= +5%); client TTFT p50 (queue included): auto {g['ttft_overhead'] * 100:+.1f}%.",
              f"The plan's drafts in the auto phase: {s['auto']['drafts']}.", "",
              "TTFT as clients see it is mostly queue time" + (": one request is served at a time, so a faster "
              "phase also waits less." if cfg.get("max_batch", [1]) == [1] else " (the batch was full).") +
              " The server-side TTFT isolates what speculation adds to the first token."]
    lines += ["", "Per category, server side (tokens / (prefill + decode seconds) of the requests, same prompts "
              "in both phases):", "", "| category | requests | none tok/s | auto tok/s | speedup | auto draft | "
              "tokens/pass |", "|---|---:|---:|---:|---:|---|---:|"]
    for row in summary.get("categories", []):
        lines.append(f"| {row['category']} | {row['requests']} | {row['none_tps']:.1f} | {row['auto_tps']:.1f} | "
                     f"{row['speedup']:.2f}x | {row['draft']} | {row['mat']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], records: list[dict[str, Any]], path: Path) -> None:
    try:
        from draftwise.plots import pyplot, save_figure

        plt = pyplot()
    except ImportError:
        print("no matplotlib: load_test.png not written", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = list(summary["phases"])
    tps = [summary["phases"][m]["tokens_per_s"] for m in names]
    axes[0].bar(names, tps, color=["#999999", "#2a7ab9"] * len(names))
    axes[0].set_title("aggregate tokens/s")
    for ax, key, title in ((axes[1], "ttft", "time to first token (s)"), (axes[2], "e2e", "end-to-end latency (s)")):
        for mode, colour in zip(names, ("#999999", "#2a7ab9", "#d95f02", "#1b9e77", "#7570b3", "#e7298a")):
            v = sorted(r[key] for r in records if r["phase"] == mode and key in r and r["error"] is None)
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=mode, color=colour)
        ax.set_title(title)
        ax.set_ylabel("fraction of requests")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def start_server(args: argparse.Namespace, max_batch: int) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    exe = shutil.which("draftwise", path=str(Path(sys.executable).parent)) or "draftwise"
    cmd = [exe, "serve", "--model", args.model, "--draft", "auto", "--plan", args.plan, "--port", str(args.port),
           "--max-queue", str(max(128, args.clients * 2)), "--max-tokens-cap", str(args.max_tokens),
           "--request-timeout", "3600", "--max-batch", str(max_batch), "--dtype", args.dtype, "--quant", args.quant,
           ] + (["--k", "auto"] if args.k == "auto" else [])
    url = f"http://127.0.0.1:{args.port}"
    return launch(cmd, Path(args.out) / f"server-b{max_batch}.log", url), url, cmd


def launch(cmd: list[str], log_path: Path, url: str) -> subprocess.Popen[bytes]:
    """Start a server (``cmd``, its output in ``log_path``) and wait until ``url/health`` answers
    (5 minutes at most for the model to load); SystemExit if it exits or does not answer."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the server did not start in 5 minutes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=4, help="requests per client per phase")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=None,
                    help="distinct prompts in the mix (default: clients x requests, so none repeats)")
    ap.add_argument("--plan", default="benchmarks/results/trees-plan/plan.json")
    ap.add_argument("--k", choices=("plan", "auto"), default="auto",
                    help="the auto phase's k: the plan's, or the adaptive k with the plan's draft")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--url", default=None, help="use this running server (started with --draft auto)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve"))
    ap.add_argument("--max-batch", default="1", help="comma-separated: one server per value, one at a time")
    ap.add_argument("--phases", default="none,auto", help="none (plain), auto (the plan's speculation) or both")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quant", default="none")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.max_batch.split(",")]
    except ValueError:
        ap.error(f"--max-batch {args.max_batch!r}: give comma-separated integers >= 1")
    modes = [m.strip() for m in args.phases.split(",")]
    if min(batches) < 1 or len(set(batches)) != len(batches):
        ap.error("--max-batch values must be distinct integers >= 1")
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--phases takes {', '.join(MODES)}")
    if args.prompts is None:
        args.prompts = args.clients * args.requests
    if min(args.clients, args.requests, args.max_tokens, args.prompts) < 1:
        ap.error("--clients, --requests, --max-tokens and --prompts must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(read_questions(DEFAULT_QUESTIONS), args.prompts)
    print(f"references: {len(prompts)} prompts, greedy, {args.max_tokens} tokens ...", flush=True)
    ref_s = references(args.model, prompts, args.max_tokens, dtype=args.dtype, quant=args.quant)
    records: list[dict[str, Any]] = []
    phases: dict[str, Any] = {}
    cmd: list[str] = ["(external)"]
    for batch in batches if not args.url else batches[:1]:
        proc, url, cmd = (None, args.url, ["(external)"]) if args.url else start_server(args, batch)
        try:
            # warm-up, not counted, on a prompt outside the mix: a warm-up on a measured prompt would
            # put its answer in the suffix draft's cross-request cache before the auto phase asks it
            warm = {"question_id": "warm-up", "category": "overall", "turn": 1, "users": [WARM_UP], "answers": [],
                    "reference": []}
            asyncio.run(phase(url, [[warm]], modes[-1], 1, 1, 8, args.k == "auto"))
            for mode in modes:
                label = mode if len(batches) == 1 else f"{mode}@batch{batch}"
                print(f"phase {label}: {args.clients} clients x {args.requests} requests ...", flush=True)
                recs, wall = asyncio.run(phase(url, [[p] for p in prompts], mode, args.clients, args.requests,
                                               args.max_tokens, args.k == "auto"))
                for r in recs:
                    r["phase"] = label
                records += recs
                phases[label] = summarize(recs, wall)
                print(json.dumps(phases[label]), flush=True)
            metrics = httpx.get(url + "/metrics", timeout=10).text
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    goals: dict[str, Any] = {}
    if len(batches) > 1:
        goals["batching"] = {f"{m}@batch{b}": phases[f"{m}@batch{b}"]["tokens_per_s"] /
                             phases[f"{m}@batch{batches[0]}"]["tokens_per_s"] for m in modes for b in batches[1:]}
    if len(batches) == 1 and set(modes) == set(MODES):
        none, auto = phases["none"], phases["auto"]
        goals.update(speedup=auto["tokens_per_s"] / none["tokens_per_s"] if none["tokens_per_s"] else 0.0,
                     ttft_overhead=auto["ttft_p50_s"] / none["ttft_p50_s"] - 1,
                     prefill_overhead=auto["prefill_p50_s"] / none["prefill_p50_s"] - 1)
    summary = {
        "config": {"model": args.model, "clients": args.clients, "requests": args.requests,
                   "max_tokens": args.max_tokens, "prompts": len(prompts), "plan": args.plan,
                   "max_batch": batches, "dtype": args.dtype, "quant": args.quant, "phases": modes,
                   "server": " ".join(["draftwise", *cmd[1:]]) if proc else args.url,
                   "command": "python benchmarks/load_test.py " + " ".join(sys.argv[1:]),
                   "references_s": ref_s, "k": args.k,
                   "turns": [sum(p["turn"] == 1 for p in prompts), sum(p["turn"] == 2 for p in prompts)],
                   "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count()},
        "phases": phases,
        "categories": by_category(records) if "speedup" in goals else [],
        "goals": goals,
        "server_metrics": [ln for ln in metrics.splitlines() if ln.startswith("draftwise:spec_decode")],
    }
    write_json_atomic(out / "run.json", {"prompts": prompts, "records": records})
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "summary.md", render(summary))
    plot(summary, records, out / "load_test.png")
    print(render(summary))
    bad = sum(p["errors"] + p["lost"] + (p["ok"] - p["equal"]) for p in phases.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
