"""``draftwise plan --engine vllm``'s measurements: running OpenAI-compatible servers (vLLM),
measured through their HTTP API only, never a model loaded here.

**The load.** At each N, N closed-loop clients share one queue of chat requests (the prompts,
a whole number of times, at least ``requests_per_client`` x N requests, so every N decodes the
same mix) and each sends its next request as soon as its last one has finished: greedy
(``temperature`` 0), ``max_tokens`` the plan's ``-n``, streamed with ``stream_options:
{"include_usage": true, "continuous_usage_stats": true}``, so every chunk says how many tokens
the answer has so far (vLLM's own extension; without it chunks are counted and scaled to the
final usage).

**What one phase (one server at one N) measures.** Per request its time to first token (to the
first chunk with text), its end-to-end seconds and completion tokens, and its decode rate (its
tokens after the first over the time between its first and last token). The aggregate is taken
while all N clients are busy: from the first answer that ends (the requests that all started
at once are behind it) to the last request's start (after it clients fall idle), every token
that arrived in that window over its length; the fitted per-request figures (mean TTFT, seconds
per decoded token) come from the requests inside that window, the steady ones. The whole
phase's tokens over its wall time are kept beside it (``aggregate_total_tps``).

**Speculation** comes from the server's Prometheus ``/metrics``, read before and after each
phase: vLLM's counters ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` (one per draft position, so
their count is the server's k), summed over engines. The model
(:mod:`draftwise.capacity.remote_plan`) turns them into tokens per step.

Example::

    result = plan_vllm("http://localhost:8000", "http://localhost:8001", prompts=["Hi"],
                       concurrency=[1, 2, 4, 8, 16])
    write_remote_plan(result, Path("out"))
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import re
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwise.capacity.plan import parse_concurrency
from draftwise.capacity.remote_plan import (
    VLLM_SERVER,
    check_measure_at,
    default_measure_at,
    describe_speculation,
    plan_from_measurements,
    plot_remote_plan,
    render_markdown,
)
from draftwise.errors import ConfigError
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.plots import try_plot

#: requests a client sends at an N, at least (the prompts are sent a whole number of times)
REQUESTS_PER_CLIENT = 4
WARM_UP = "Name three primary colours."
#: seconds a request may take (a slow CPU server at a large N)
TIMEOUT_S = 600.0
#: seconds to wait after a phase before reading /metrics, for the server's last step to be counted
SETTLE_S = 0.2
COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
ROLES = {"plain": "--url", "spec": "--spec-url", "recommended": "--validate-url"}


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ConfigError("--engine measures servers over HTTP with httpx, which is not installed: "
                          "pip install httpx") from None
    return httpx


def base_url(url: str, flag: str = "--url") -> str:
    """The server's root from the address a user gives (``/v1`` and trailing slashes dropped).

    >>> base_url("http://localhost:8000/v1/")
    'http://localhost:8000'
    """
    u = url.strip().rstrip("/")
    u = u.removesuffix("/v1")
    if not re.match(r"^https?://[^/\s]+", u):
        raise ConfigError(f"{flag} {url!r} is not a server's address; give e.g. http://localhost:8000")
    return u


def parse_spec_config(text: str | None) -> dict[str, Any] | None:
    """``--spec-config``: the JSON object the speculating server was started with."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--spec-config is not JSON ({exc.msg}); give the speculating server's "
                          "--speculative-config, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                          "\"prompt_lookup_max\": 4}'") from None
    if not isinstance(value, dict):
        raise ConfigError("--spec-config must be a JSON object, the speculating server's --speculative-config")
    k = value.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(f"--spec-config num_speculative_tokens {k!r} must be an integer >= 1")
    return value


# -- Prometheus -------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_samples_small(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition as ``(name, labels, value)``: comments and
    malformed lines skipped, timestamps ignored (the fallback without prometheus_client).

    >>> parse_samples_small('# TYPE x counter\\nx_total{position="0",e="a"} 3.0 1700000000\\n')
    [('x_total', {'position': '0', 'e': 'a'}, 3.0)]
    """
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not (m := _SAMPLE.match(line.strip())):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, value))
    return out


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """:func:`parse_samples_small`'s result from prometheus_client's parser where it is
    installed (the ``serve`` extra) and accepts the text; the small parser otherwise."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return parse_samples_small(text)
    try:
        return [(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        return parse_samples_small(text)


def spec_counters(text: str) -> dict[str, Any] | None:
    """vLLM's speculative-decoding counters in a ``/metrics`` text, summed over engines and
    models: ``drafts``, ``draft_tokens``, ``accepted`` and ``accepted_per_pos`` (by position);
    None where the server has none (it does not speculate)."""
    totals = dict.fromkeys(COUNTERS.values(), 0.0)
    per_pos: dict[int, float] = {}
    found = False
    for name, labels, value in parse_samples(text):
        if name.endswith("_created"):
            continue
        base = name.removesuffix("_total")
        if base in COUNTERS:
            totals[COUNTERS[base]] += value
            found = True
        elif base == PER_POS and labels.get("position", "").isdigit():
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
            found = True
    if not found:
        return None
    return {**totals, "accepted_per_pos": [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []}


def counter_delta(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``after - before`` (integers; a counter missing before counts from 0), or None without ``after``."""
    if after is None:
        return None
    before = before or {"accepted_per_pos": []}
    old = list(before["accepted_per_pos"]) + [0.0] * len(after["accepted_per_pos"])
    out: dict[str, Any] = {key: round(after[key] - before.get(key, 0.0)) for key in COUNTERS.values()}
    out["accepted_per_pos"] = [round(a - b) for a, b in zip(after["accepted_per_pos"], old)]
    return out


# -- one request, one phase -------------------------------------------------------------------
@dataclass
class Record:
    """One request as its client saw it (``perf_counter`` seconds)."""

    start: float
    client: int = 0
    prompt: int = 0
    first: float | None = None  # its first token's arrival
    last: float | None = None  # its last token's arrival
    end: float = 0.0
    tokens: int = 0
    error: str | None = None
    samples: list[tuple[float, float]] = field(default_factory=list)  # (arrival, tokens so far)

    def tokens_at(self, t: float) -> float:
        """Tokens that had arrived by ``t``."""
        i = bisect.bisect_right([s[0] for s in self.samples], t)
        return self.samples[i - 1][1] if i else 0.0


@dataclass(frozen=True)
class Server:
    role: str  # plain, spec or recommended
    url: str  # its root, http://host:port
    model: str  # the name requests send (/v1/models' id)
    root: str  # the model's folder or name (/v1/models' root: what --model was)

    @property
    def flag(self) -> str:
        return ROLES[self.role]


def _delta_text(choice: Mapping[str, Any]) -> str:
    d = choice.get("delta") or {}
    return "".join(d.get(key) or "" for key in ("content", "reasoning_content", "reasoning"))


def _read_chunk(rec: Record, chunk: Mapping[str, Any], now: float, counted: list[int]) -> None:
    """One streamed chunk into ``rec``: a new sample where tokens arrived; the final usage."""
    if chunk.get("error"):
        rec.error = f"the server streamed an error: {json.dumps(chunk['error'])[:200]}"
        return
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices") or []
    if not choices:  # the final usage chunk
        if usage.get("completion_tokens") is not None:
            rec.tokens = int(usage["completion_tokens"])
        return
    text = "".join(_delta_text(c) for c in choices)
    so_far = usage.get("completion_tokens")
    if so_far is None:  # no continuous usage: count chunks, scaled to the final usage later
        if not text:
            return
        counted[0] += 1
        so_far = counted[0]
    else:
        counted[1] = 1  # exact counts
    if so_far > (rec.samples[-1][1] if rec.samples else 0):
        rec.samples.append((now, float(so_far)))
        rec.first = rec.first if rec.first is not None else now
        rec.last = now


async def one_request(client: Any, server: Server, prompt: str, max_tokens: int) -> Record:
    """One streamed chat request; its record (an ``error`` instead of raising)."""
    httpx = _httpx()
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    rec = Record(start=time.perf_counter())
    counted = [0, 0]  # chunks with text; 1 once the server counts tokens itself
    try:
        async with client.stream("POST", server.url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status_code}: {' '.join(text.split())[:200]}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or rec.error:
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    _read_chunk(rec, json.loads(data), time.perf_counter(), counted)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.end = time.perf_counter()
    if not rec.tokens and rec.samples:
        rec.tokens = int(rec.samples[-1][1])  # no final usage: what arrived
    if counted[1] == 0 and counted[0] and rec.tokens:  # chunk counts: scale each to the final usage
        rec.samples = [(t, c * rec.tokens / counted[0]) for t, c in rec.samples]
    return rec


async def run_phase(client: Any, server: Server, prompts: Sequence[str], n: int, max_tokens: int,
                    requests_per_client: int = REQUESTS_PER_CLIENT) -> tuple[list[Record], float, float]:
    """N closed-loop clients on one shared queue: every record, the phase's start and end."""
    total = len(prompts) * max(1, math.ceil(requests_per_client * n / len(prompts)))
    queue = deque(i % len(prompts) for i in range(total))

    async def run_client(c: int) -> list[Record]:
        out = []
        while queue:  # bounded: the queue only shrinks
            i = queue.popleft()
            rec = await one_request(client, server, prompts[i], max_tokens)
            rec.client, rec.prompt = c, i
            out.append(rec)
        return out

    t0 = time.perf_counter()
    results = await asyncio.gather(*(run_client(c) for c in range(n)))
    return [r for rs in results for r in rs], t0, time.perf_counter()


def _pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN if empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _ttft(r: Record) -> float:
    return (r.first if r.first is not None else r.end) - r.start


def _decode_s(r: Record) -> float:
    """Seconds from a request's first token to its last."""
    return (r.last or r.end) - (r.first if r.first is not None else r.end)


def summarize_phase(records: Sequence[Record], n: int, t0: float, t1: float, where: str = "") -> dict[str, Any]:
    """One phase's figures (see the module's docstring): the steady window's aggregate, the
    steady requests' mean TTFT, seconds per decoded token and per-request tokens/s, and
    percentiles over every request."""
    ok = [r for r in records if r.error is None and r.tokens > 0 and r.first is not None]
    if not ok:
        raise ConfigError(f"{where}: no request returned a token")
    first_done, last_start = min(r.end for r in ok), max(r.start for r in ok)
    w0, w1 = (first_done, last_start) if last_start > first_done else (t0, t1)
    in_window = sum(r.tokens_at(w1) - r.tokens_at(w0) for r in ok)
    steady = ([r for r in ok if r.start >= first_done and r.end <= last_start]
              or [r for r in ok if r.start >= first_done] or ok)
    decoding = [r for r in steady if r.tokens >= 2 and _decode_s(r) > 0]
    if not decoding:
        raise ConfigError(f"{where}: no answer had two tokens or more to time the decoding; raise -n")
    tokens = sum(r.tokens for r in ok)
    return {
        "n": n, "requests": len(ok), "tokens": tokens, "mean_tokens": tokens / len(ok), "wall_s": t1 - t0,
        "window_s": w1 - w0, "steady_requests": len(steady),
        "aggregate_tps": in_window / (w1 - w0) if w1 > w0 else 0.0, "aggregate_total_tps": tokens / (t1 - t0),
        "per_request_tps": statistics.fmean(r.tokens / (r.end - r.start) for r in steady),
        "ttft_mean_s": statistics.fmean(_ttft(r) for r in steady),
        "seconds_per_token": sum(_decode_s(r) for r in decoding) / sum(r.tokens - 1 for r in decoding),
        "ttft_p50_s": _pct([_ttft(r) for r in ok], 50), "ttft_p99_s": _pct([_ttft(r) for r in ok], 99),
        "e2e_p50_s": _pct([r.end - r.start for r in ok], 50),
        "records": [{"client": r.client, "prompt": r.prompt, "ttft_s": _ttft(r), "e2e_s": r.end - r.start,
                     "tokens": r.tokens} for r in ok],
    }


# -- the servers ------------------------------------------------------------------------------
async def connect(client: Any, role: str, url: str) -> Server:
    """The server at ``url``, its model read from ``GET /v1/models``; one line if it does not answer."""
    httpx = _httpx()
    flag = ROLES[role]
    try:
        resp = await client.get(url + "/v1/models")
    except httpx.HTTPError as exc:
        raise ConfigError(f"{flag} {url}: no server answers ({type(exc).__name__}: {exc}); start it, e.g. "
                          f"{VLLM_SERVER} --model DIR --port 8000") from None
    if resp.status_code != 200:
        raise ConfigError(f"{flag} {url}: GET /v1/models answered HTTP {resp.status_code}; is it an "
                          "OpenAI-compatible server?")
    try:
        data = resp.json()["data"]
        card = data[0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(f"{flag} {url}: GET /v1/models lists no model") from None
    return Server(role, url, str(card["id"]), str(card.get("root") or card["id"]))


async def read_counters(client: Any, server: Server) -> dict[str, Any] | None:
    """The server's speculative-decoding counters (:func:`spec_counters`); None without /metrics."""
    try:
        resp = await client.get(server.url + "/metrics")
    except _httpx().HTTPError:
        return None
    return spec_counters(resp.text) if resp.status_code == 200 else None


async def measure_phase(client: Any, server: Server, prompts: Sequence[str], n: int, max_tokens: int,
                        requests_per_client: int, status: Callable[[str], None]) -> dict[str, Any]:
    """One server at one N: the load, its figures and the speculation counted over it."""
    before = await read_counters(client, server)
    records, t0, t1 = await run_phase(client, server, prompts, n, max_tokens, requests_per_client)
    failed = [r for r in records if r.error]
    if failed:
        raise ConfigError(f"{server.flag} {server.url} at N = {n}: {len(failed)} of {len(records)} requests "
                          f"failed; the first: {failed[0].error}")
    if before is not None:
        await asyncio.sleep(SETTLE_S)
    after = await read_counters(client, server)
    phase = summarize_phase(records, n, t0, t1, where=f"{server.flag} {server.url} at N = {n}")
    phase["speculation"] = describe_speculation(counter_delta(before, after), phase["tokens"], phase["requests"])
    if server.role == "plain" and phase["speculation"] and phase["speculation"]["drafts"] > 0:
        raise ConfigError(f"--url {server.url} speculates (its /metrics counted drafts): start the plain server "
                          "without --speculative-config")
    status(f"{server.role} N={n}: {phase['aggregate_tps']:.1f} tok/s aggregate, {phase['per_request_tps']:.1f} "
           f"a request, TTFT p50 {phase['ttft_p50_s'] * 1e3:.0f} ms ({phase['requests']} requests)")
    return phase


def _server_k(counters: Mapping[str, Any] | None, spec_config: Mapping[str, Any] | None, url: str,
              notes: list[str]) -> int:
    """The speculating server's k: its --spec-config's, else the count of /metrics' draft positions."""
    from_metrics = len(counters["accepted_per_pos"]) if counters and counters["accepted_per_pos"] else None
    given = (spec_config or {}).get("num_speculative_tokens")
    if given and from_metrics and given != from_metrics:
        notes.append(f"--spec-config says num_speculative_tokens {given}, the server's /metrics counts "
                      f"{from_metrics} draft positions; the recommendation uses {given}")
    k = given or from_metrics
    if not k:
        raise ConfigError(f"--spec-url {url}: cannot tell its num_speculative_tokens (its /metrics has no "
                          f"{PER_POS}); pass its --speculative-config with --spec-config")
    if counters is None:
        notes.append("the speculating server's /metrics has no speculative-decoding counters: one token a step assumed")
    return int(k)


async def _plan_async(urls: Mapping[str, str], prompts: Sequence[str], concurrency: Sequence[int],
                      measure_at: Sequence[int], max_tokens: int, validate: bool, spec_config: Mapping[str, Any] | None,
                      requests_per_client: int, status: Callable[[str], None]) -> dict[str, Any]:
    httpx = _httpx()
    limits = httpx.Limits(max_connections=max(concurrency) + 4, max_keepalive_connections=max(concurrency) + 4)
    notes: list[str] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0), limits=limits) as client:
        servers = {role: await connect(client, role, url) for role, url in urls.items()}
        for role, s in servers.items():
            if role != "plain" and s.root != servers["plain"].root:
                raise ConfigError(f"--url serves {servers['plain'].root}, {s.flag} serves {s.root}: plan with "
                                  "servers of one model")
        for s in servers.values():  # not counted: the first requests set up what a server caches
            warm = await one_request(client, s, WARM_UP, 8)
            if warm.error:
                raise ConfigError(f"{s.flag} {s.url}: a first request failed: {warm.error}")
        plain = await read_counters(client, servers["plain"])
        if plain and plain["drafts"] > 0:
            raise ConfigError(f"--url {servers['plain'].url} speculates (its /metrics counts drafts): start the "
                              "plain server without --speculative-config")
        k = _server_k(await read_counters(client, servers["spec"]), spec_config, servers["spec"].url, notes)
        measured: dict[str, dict[int, dict[str, Any]]] = {role: {} for role in servers}
        for n in concurrency if validate else measure_at:  # each N: every server in turn
            for role, s in servers.items():
                measured[role][n] = await measure_phase(client, s, prompts, n, max_tokens, requests_per_client, status)
    if all(not p.get("speculation") or not p["speculation"]["drafts"] for p in measured["spec"].values()):
        notes.append("the speculating server drafted nothing during the measurements: is it started with "
                     "--speculative-config?")
    result = plan_from_measurements(measured, concurrency, measure_at, k=k, model=servers["plain"].root,
                                    spec_config=spec_config)
    result.update(servers={role: s.url for role, s in servers.items()}, notes=notes,
                  config={"prompts": len(prompts), "max_tokens": max_tokens, "requests_per_client": requests_per_client,
                          "temperature": 0, "spec_config": spec_config, "served_model_name": servers["plain"].model})
    return result


def plan_vllm(url: str, spec_url: str, *, prompts: Sequence[str], concurrency: Sequence[int],
              measure_at: Sequence[int] | None = None, max_tokens: int = 128, validate: bool = False,
              validate_url: str | None = None, spec_config: Mapping[str, Any] | None = None,
              requests_per_client: int = REQUESTS_PER_CLIENT,
              status: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure a plain (``url``) and a speculating (``spec_url``) vLLM server of one model at
    ``measure_at`` (default :func:`~draftwise.capacity.remote_plan.default_measure_at`), fit,
    predict every N of ``concurrency`` and recommend
    (:func:`~draftwise.capacity.remote_plan.plan_from_measurements`). ``validate``: measure every
    N and score the predictions; ``validate_url`` (implies ``validate``): a server started with
    the recommendation, measured at every N against plain. ``spec_config``: the speculating
    server's ``--speculative-config`` (for the recommended command)."""
    if not prompts:
        raise ConfigError("no prompts to send; give --prompts with at least one")
    if max_tokens < 2:
        raise ConfigError(f"-n {max_tokens} leaves no decoding to time: give -n 2 or more")
    if requests_per_client < 1:
        raise ConfigError(f"requests_per_client {requests_per_client} must be >= 1")
    urls = {"plain": base_url(url, "--url"), "spec": base_url(spec_url, "--spec-url")}
    if validate_url is not None:
        urls["recommended"] = base_url(validate_url, "--validate-url")
    if len(set(urls.values())) < len(urls):
        raise ConfigError(f"{', '.join(ROLES[r] for r in urls)} must name different servers (got {list(urls.values())})")
    grid = sorted(concurrency)
    at = check_measure_at(measure_at if measure_at is not None else default_measure_at(grid), grid)
    return asyncio.run(_plan_async(urls, prompts, grid, at, max_tokens, validate or validate_url is not None,
                                   spec_config, requests_per_client, status or (lambda line: None)))


def write_remote_plan(result: Mapping[str, Any], out_dir: Path, warn: Callable[[str], None] | None = None) -> list[str]:
    """remote-plan.json, remote-plan.md and (with matplotlib) remote-plan.png in ``out_dir``; the names written."""
    write_json_atomic(out_dir / "remote-plan.json", result)
    write_text_atomic(out_dir / "remote-plan.md", render_markdown(result))
    png = try_plot(plot_remote_plan, result, out_dir / "remote-plan.png", label="remote-plan.png", warn=warn)
    return ["remote-plan.json", "remote-plan.md"] + (["remote-plan.png"] if png else [])


def parse_measure_at(text: str) -> list[int]:
    """``--measure-at 1,4,16``: :func:`~draftwise.capacity.plan.parse_concurrency`, its messages
    naming ``--measure-at``."""
    try:
        return parse_concurrency(text)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--concurrency", "--measure-at")) from None
