"""What the prefix cache buys ``draftwise serve``: time to first token and throughput with a shared
system prompt, time to first token of a conversation's second turn, and the server's memory under
many distinct prefixes, with the cache (``--prefix-cache-mb N``) and without (``--prefix-cache-mb 0``).

    python benchmarks/prefix_cache.py --model default --out benchmarks/results/prefix-cache

One server at a time (never two at once): for each round, a server without the cache, then one
with it (``--rounds 2``: off, on, off, on), each started as ``draftwise serve --model M
--prefix-cache-mb N --max-batch B --draft D``, warmed up with one request that shares no prefix
with the workloads, then sent three workloads, streamed and greedy, each request asking
``return_token_ids``:

1. ``shared_system``: one request with a system prompt of about ``--system-tokens`` tokens (the
   dev questions' text, cut to length on the first server's own count) and a dev question (cold:
   nothing is cached yet), then ``--clients`` requests at once with the same system prompt and a
   question each, ``--max-tokens`` new tokens each. Goals: their TTFT p50 >= 5x lower with the
   cache, their aggregate tokens/s >= 2x.
2. ``multi_turn``: ``--conversations`` two-turn conversations (the dev set's mt_bench questions),
   one request at a time, each conversation's second turn right after its first, with the
   server's own first answer (``--turn-tokens`` tokens at most) in its history. Goal: the second
   turns' TTFT p50 >= 3x lower with the cache. ``--second-turn-tokens`` caps the second answers
   alone (their TTFT does not depend on it): first answers in full, at less run time.
3. ``distinct``: ``--distinct`` prompts of about ``--prefix-tokens`` tokens, each with text of its
   own from the chat template's opening on (more K/V than the cache holds, to fill it past its
   bound), one at a time; after each, the server's resident memory (``VmRSS``) and
   ``draftwise:prefix_cache_bytes``. Goals: the cache never holds more than N MiB, and the
   server's peak RSS with the cache is at most the peak without + N MiB + 10% of the peak without.

Every answer is compared between the servers (greedy: the cache must not change a token), and each
record keeps the server's ``usage.prompt_tokens_details.cached_tokens`` and ``timings.prompt_ms``.
Writes ``run.json`` (every request), ``summary.json`` and ``summary.md`` into ``--out``, and each
server's log as ``server-<label>.log``.

A quick functional check on a tiny model folder (not a measurement)::

    python benchmarks/prefix_cache.py --model /path/to/tiny-folder --system-tokens 120 --clients 3 \\
        --conversations 2 --distinct 4 --prefix-tokens 80 --max-tokens 4 --turn-tokens 4 \\
        --prefix-cache-mb 1 --context 512 --out /tmp/prefix-cache-check
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from load_test import launch  # benchmarks/, this script's folder

from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions
from draftwise.runtime.prefix_cache import DEFAULT_PREFIX_CACHE_MB

FOLLOW_UPS = ["Say more about that.", "Give one example.", "Now summarise it in one sentence.",
              "What would change if the numbers doubled?", "List the key words you used.",
              "Answer again, more briefly."]
WARM_UP = [{"role": "user", "content": "Warm-up: say hi."}]


# -- the server --------------------------------------------------------------------------------
def start_server(args: argparse.Namespace, cache_mb: int, label: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("draftwise", path=str(Path(sys.executable).parent)) or "draftwise"
    cmd = [exe, "serve", "--model", args.model, "--port", str(args.port), "--draft", args.draft,
           "--max-batch", str(args.max_batch), "--prefix-cache-mb", str(cache_mb), "--dtype", args.dtype,
           "--max-tokens-cap", str(max(args.max_tokens, args.turn_tokens, args.second_turn_tokens or 0)), "--request-timeout", "3600", "--context", str(args.context)]
    cmd += ["--plan", args.plan] if args.plan else []
    url = f"http://127.0.0.1:{args.port}"
    return launch(cmd, Path(args.out) / f"server-{label}.log", url), url


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux ``/proc``; NaN elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    found = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) / 1024 if found else float("nan")


def metric(url: str, name: str) -> float:
    """One sample of ``name`` from ``/metrics`` (NaN when absent: the cache is off)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


@functools.cache
def client() -> httpx.Client:
    """One connection pool for the run, as an application's client keeps (the OpenAI SDK's): a new
    ``httpx`` client per request spends ~25 ms building itself (its TLS context), which a time to
    first token measured around it would count."""
    return httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


def ask(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One streamed greedy chat request: TTFT (client side), the answer and the server's usage."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    rec: dict[str, Any] = {"error": None}
    t0 = time.perf_counter()
    final: dict[str, Any] | None = None
    text: list[str] = []
    with client().stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            rec["error"] = f"HTTP {r.status_code}: {r.read()[:200]!r}"
            return rec
        for line in r.iter_lines():
            data = line[5:].strip() if line.startswith("data:") else ""
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                rec["error"] = chunk["error"]["message"]
                break
            choice = chunk["choices"][0] if chunk["choices"] else {}
            if choice.get("delta", {}).get("content"):
                rec.setdefault("ttft_s", time.perf_counter() - t0)
                text.append(choice["delta"]["content"])
            if choice.get("finish_reason"):
                final = chunk
    rec["e2e_s"] = time.perf_counter() - t0
    if final is not None:
        usage = final["usage"]
        rec.update(text="".join(text), token_ids=final["choices"][0].get("token_ids", []),
                   prompt_tokens=usage["prompt_tokens"],
                   cached_tokens=usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                   prefill_s=final["timings"]["prompt_ms"] / 1000)
        rec.setdefault("ttft_s", rec["e2e_s"])
    elif rec["error"] is None:
        rec["error"] = "the stream ended without a final chunk"
    return rec


# -- the workloads -----------------------------------------------------------------------------
def corpus() -> tuple[str, list[str], list[list[str]]]:
    """The dev questions' text (for system prompts and prefixes), their first turns, and the
    two-turn conversations (mt_bench)."""
    questions = read_questions(DEFAULT_QUESTIONS)
    return ("\n".join(t for q in questions for t in q.turns), [q.turns[0] for q in questions],
            [list(q.turns) for q in questions if len(q.turns) >= 2])


def text_of_tokens(url: str, text: str, tokens: int, context: int) -> str:
    """A cut of ``text`` that the server's chat template makes about ``tokens`` tokens, from one
    calibration request of about ``context / 2`` tokens or fewer (a prefix of its own: it warms
    nothing the workloads use)."""
    sample = "[calibration]\n" + text[: min(20000, context * 2)]
    probe = ask(url, [{"role": "system", "content": sample}, {"role": "user", "content": "Hi."}], 1)
    if probe.get("error"):
        raise SystemExit(f"calibration failed: {probe['error']}")
    per_char = probe["prompt_tokens"] / len(sample + "Hi.")
    return text[: max(1, int(tokens / per_char))]


def shared_system(url: str, system: str, questions: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One request with the system prompt alone (cold: nothing cached yet), then ``--clients``
    requests at once, each with the same system prompt and a question of its own (``--cold-burst``:
    no request alone first, so the burst finds nothing cached)."""
    def one(i: int) -> dict[str, Any]:
        rec = ask(url, [{"role": "system", "content": system}, {"role": "user", "content": questions[i]}],
                  args.max_tokens)
        return {"workload": "shared_system", "index": i, **rec}

    out = [] if args.cold_burst else [one(0)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        batch = list(pool.map(one, range(1, args.clients + 1)))
    wall = time.perf_counter() - t0
    for r in batch:
        r["batch_wall_s"] = wall
    return out + batch


def multi_turn(url: str, conversations: list[list[str]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each two-turn conversation in turn, one request at a time: its first turn, then its second
    with the server's own first answer in the history."""
    out = []
    for c, turns in enumerate(conversations[: args.conversations]):
        history: list[dict[str, str]] = []
        for t, user in enumerate(turns[:2]):
            history.append({"role": "user", "content": user})
            rec = ask(url, history, args.turn_tokens if t == 0 or args.second_turn_tokens is None else args.second_turn_tokens)
            history.append({"role": "assistant", "content": rec.get("text", "")})
            out.append({"workload": "multi_turn", "conversation": c, "turn": t + 1, **rec})
    return out


def distinct(url: str, pid: int, text: str, args: argparse.Namespace, prefix_chars: int) -> list[dict[str, Any]]:
    out = []
    for i in range(args.distinct):
        start = (i * 997) % max(1, len(text) - prefix_chars)
        body = f"[document {i}]\n" + text[start : start + prefix_chars]  # its own first tokens: no shared prefix
        rec = ask(url, [{"role": "user", "content": body + "\nSummarise this."}], args.distinct_tokens)
        out.append({"workload": "distinct", "index": i, "rss_mib": rss_mib(pid),
                    "cache_bytes": metric(url, "draftwise:prefix_cache_bytes"), **rec})
    return out


def run_server(args: argparse.Namespace, cache_mb: int, label: str, texts: dict[str, Any]) -> dict[str, Any]:
    """Start one server, run the three workloads, stop it; its records and memory figures."""
    proc, url = start_server(args, cache_mb, label)
    try:
        ask(url, WARM_UP, 4)
        if "system" not in texts:  # calibrated once, on the first server
            texts["system"] = text_of_tokens(url, texts["corpus"], args.system_tokens, args.context)
            texts["prefix_chars"] = len(text_of_tokens(url, texts["corpus"], args.prefix_tokens, args.context))
        base = rss_mib(proc.pid)
        records = shared_system(url, texts["system"], texts["questions"], args)
        records += multi_turn(url, texts["conversations"], args)
        records += distinct(url, proc.pid, texts["corpus"], args, texts["prefix_chars"])
        for r in records:
            r["server"] = label
        return {"label": label, "cache_mb": cache_mb, "records": records, "rss_base_mib": base,
                "rss_peak_mib": max([base] + [r["rss_mib"] for r in records if "rss_mib" in r]),
                "hits": metric(url, "draftwise:prefix_cache_hits_total"),
                "queries": metric(url, "draftwise:prefix_cache_queries_total")}
    finally:
        proc.terminate()
        proc.wait(60)


# -- the summary -------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _answers(server: dict[str, Any]) -> dict[tuple[Any, ...], Any]:
    """Each request's answer (token ids) by what it asked, to compare between servers."""
    return {(r["workload"], r.get("index"), r.get("conversation"), r.get("turn")): r.get("token_ids")
            for r in server["records"] if r.get("error") is None}


def summarize(servers: list[dict[str, Any]], cache_mb: int) -> dict[str, Any]:
    """Per setting (cache on / off, over its rounds): the workloads' TTFT, throughput, reuse and
    memory; the goals' ratios; how many answers were the same with and without the cache."""
    out: dict[str, Any] = {}
    for on in (False, True):
        runs = [s for s in servers if (s["cache_mb"] > 0) == on]
        recs = [r for s in runs for r in s["records"] if r.get("error") is None]
        shared = [r for r in recs if r["workload"] == "shared_system"]
        batch = [r for r in shared if r["index"] > 0]
        walls = {(r["server"], r["batch_wall_s"]) for r in batch}
        turns = sorted({r["turn"] for r in recs if r["workload"] == "multi_turn"})
        out["on" if on else "off"] = {
            "servers": len(runs), "errors": sum(r.get("error") is not None for s in runs for r in s["records"]),
            "shared_cold_ttft_s": _median([r["ttft_s"] for r in shared if r["index"] == 0]),
            "shared_ttft_p50_s": _median([r["ttft_s"] for r in batch]),
            "shared_tokens_per_s": (sum(len(r["token_ids"]) for r in batch) / sum(w for _, w in walls)
                                    if walls else float("nan")),
            "shared_cached": _median([r["cached_tokens"] for r in batch]),
            "shared_prompt_tokens": _median([r["prompt_tokens"] for r in batch]),
            "turn_ttft_s": {t: _median([r["ttft_s"] for r in recs if r.get("turn") == t]) for t in turns},
            "turn_cached": {t: _median([r["cached_tokens"] for r in recs if r.get("turn") == t]) for t in turns},
            "turn_prompt_tokens": {t: _median([r["prompt_tokens"] for r in recs if r.get("turn") == t]) for t in turns},
            "rss_peak_mib": max((s["rss_peak_mib"] for s in runs), default=float("nan")),
            "rss_growth_mib": max((s["rss_peak_mib"] - s["rss_base_mib"] for s in runs), default=float("nan")),
            "cache_bytes_peak": max((r["cache_bytes"] for r in recs if r["workload"] == "distinct"),
                                    default=float("nan")),
            "hit_rate": _median([s["hits"] / s["queries"] for s in runs if s["queries"] and s["queries"] > 0]),
        }
    on, off = out["on"], out["off"]
    answers = [_answers(s) for s in servers]
    first = answers[0]
    compared = [(key, ids) for a in answers[1:] for key, ids in a.items() if key in first]
    out["equal_answers"] = sum(first[key] == ids for key, ids in compared)
    out["compared_answers"] = len(compared)
    out["equal"] = bool(compared) and out["equal_answers"] == len(compared) and \
        all(set(a) == set(first) for a in answers[1:])
    last = max(on["turn_ttft_s"], default=None)
    rss_allowed = off["rss_peak_mib"] + cache_mb + 0.10 * off["rss_peak_mib"]
    out["goals"] = {
        "shared_system_ttft_lower": off["shared_ttft_p50_s"] / on["shared_ttft_p50_s"],
        "shared_system_throughput": on["shared_tokens_per_s"] / off["shared_tokens_per_s"],
        "later_turn_ttft_lower": off["turn_ttft_s"][last] / on["turn_ttft_s"][last] if last else float("nan"),
        "cache_bytes_under_bound": on["cache_bytes_peak"] <= cache_mb * 2**20,
        "rss_allowed_mib": rss_allowed,
        "rss_within": on["rss_peak_mib"] <= rss_allowed,
    }
    return out


def render(summary: dict[str, Any], config: dict[str, Any]) -> str:
    on, off, goals = summary["on"], summary["off"], summary["goals"]
    lines = [f"# Prefix cache: `serve --prefix-cache-mb {config['prefix_cache_mb']}` against `0`", "",
             f"Model `{config['model']}` ({config['dtype']}), max batch {config['max_batch']}, draft "
             f"`{config['draft']}`, {config['rounds']} round(s), {config['date']}, {config['cpus']} CPUs. "
             f"Answers the same with and without the cache: **{summary['equal_answers']}/"
             f"{summary['compared_answers']}**.", "",
             "| | without | with | gain |", "|---|---|---|---|"]

    def row(name: str, a: float, b: float, unit: str = "s", digits: int = 3, higher: bool = False) -> None:
        gain = (b / a if a else float("nan")) if higher else (a / b if b else float("nan"))
        lines.append(f"| {name} | {a:.{digits}f} {unit} | {b:.{digits}f} {unit} | {gain:.2f}x |")

    row(f"shared system prompt ({on['shared_prompt_tokens']:.0f} prompt tokens), first request alone: TTFT",
        off["shared_cold_ttft_s"], on["shared_cold_ttft_s"])
    row(f"then {config['clients']} requests at once: TTFT p50 ({on['shared_cached']:.0f} tokens cached)",
        off["shared_ttft_p50_s"], on["shared_ttft_p50_s"])
    row(f"those {config['clients']} requests: aggregate tokens/s", off["shared_tokens_per_s"],
        on["shared_tokens_per_s"], "tok/s", 1, higher=True)
    for t in on["turn_ttft_s"]:
        row(f"conversations' turn {t}: TTFT p50 ({on['turn_prompt_tokens'][t]:.0f} prompt tokens, "
            f"{on['turn_cached'][t]:.0f} cached)", off["turn_ttft_s"][t], on["turn_ttft_s"][t])
    lines.append(f"| peak RSS over {config['distinct']} distinct prompts | {off['rss_peak_mib']:.0f} MiB | "
                 f"{on['rss_peak_mib']:.0f} MiB | |")
    lines += ["", "Gain: how many times lower the time, or higher the throughput, with the cache."]
    lines += ["", "Goals (the issue's): shared system prompt TTFT p50 "
              f"{goals['shared_system_ttft_lower']:.2f}x lower (>= 5x), aggregate throughput "
              f"{goals['shared_system_throughput']:.2f}x (>= 2x); later turns' TTFT p50 "
              f"{goals['later_turn_ttft_lower']:.2f}x lower (>= 3x); peak RSS {on['rss_peak_mib']:.0f} MiB against "
              f"{goals['rss_allowed_mib']:.0f} MiB allowed (the server without the cache + the bound + 10%): "
              f"{'within' if goals['rss_within'] else 'OVER'}.",
              "", f"Prefix cache: peak {on['cache_bytes_peak'] / 2**20:.1f} MiB held (bound "
              f"{config['prefix_cache_mb']} MiB: {'kept' if goals['cache_bytes_under_bound'] else 'EXCEEDED'}), "
              f"hit rate {on['hit_rate']:.2f}. Errors: {off['errors']} without, {on['errors']} with.",
              "", f"Command: `{config['command']}`", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft", default="none", help="serve's --draft (auto: the --plan's drafts)")
    ap.add_argument("--plan", default=None, help="serve's --plan (a plan folder), for --draft auto")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_MB,
                    help="the bound of the server with the cache (default: serve's)")
    ap.add_argument("--rounds", type=int, default=1, help="off then on, this many times")
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--clients", type=int, default=16, help="requests sent at once with the shared system prompt")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens of each shared-system-prompt request")
    ap.add_argument("--conversations", type=int, default=40, help="two-turn conversations (the dev mt_bench ones)")
    ap.add_argument("--turn-tokens", type=int, default=128, help="new tokens of each conversation turn")
    ap.add_argument("--second-turn-tokens", type=int, default=None,
                    help="new tokens of each second turn (default: --turn-tokens)")
    ap.add_argument("--distinct", type=int, default=500, help="prompts with prefixes of their own")
    ap.add_argument("--prefix-tokens", type=int, default=300, help="about how long each distinct prompt is")
    ap.add_argument("--distinct-tokens", type=int, default=4, help="new tokens of each distinct prompt")
    ap.add_argument("--cold-burst", action="store_true", help="send the shared-system-prompt requests with none "
                    "alone first: the burst arrives to an empty cache")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "prefix-cache"))
    args = ap.parse_args()
    if min(args.prefix_cache_mb, args.rounds, args.clients, args.conversations, args.distinct, args.max_tokens,
           args.turn_tokens, args.distinct_tokens, args.system_tokens, args.prefix_tokens,
           1 if args.second_turn_tokens is None else args.second_turn_tokens) < 1:
        ap.error("every count and --prefix-cache-mb must be >= 1 (the other server runs with 0)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text, questions, conversations = corpus()
    texts: dict[str, Any] = {"corpus": text, "questions": questions, "conversations": conversations}
    servers = []
    for round_ in range(args.rounds):
        for mb in (0, args.prefix_cache_mb):
            label = f"{'on' if mb else 'off'}-{round_ + 1}"
            print(f"server {label} (--prefix-cache-mb {mb}) ...", flush=True)
            servers.append(run_server(args, mb, label, texts))
    config = {**{k: v for k, v in vars(args).items() if k != "out"},
              "command": "python benchmarks/prefix_cache.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count()}
    summary = summarize(servers, args.prefix_cache_mb)
    write_json_atomic(out / "run.json", {"config": config, "servers": servers})
    write_json_atomic(out / "summary.json", {"config": config, **summary})
    write_text_atomic(out / "summary.md", render(summary, config))
    print(render(summary, config))
    return 0 if summary["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
