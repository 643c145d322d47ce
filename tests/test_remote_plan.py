"""``plan --engine vllm``: the served-step model (pure), vLLM's /metrics, and the load generator end
to end against fake OpenAI-compatible streaming servers whose step times are known (no model)."""

from __future__ import annotations

import asyncio
import json
import math
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from draftwise.bench import remote
from draftwise.capacity.remote_plan import (
    Line,
    ServedModel,
    default_measure_at,
    describe_speculation,
    fit_line,
    fit_served,
    plan_from_measurements,
    predict_rows,
    recommend,
    render_markdown,
)
from draftwise.errors import ConfigError

# -- the model, pure ----------------------------------------------------------------------------


def _phase(n: int, a: float, b: float, c: float, d: float, m: float = 1.0, requests: int = 10,
           tokens_each: int = 129, drafts: bool = False) -> dict[str, Any]:
    """A phase as the model reads it, made from known step and TTFT lines and m tokens a step."""
    tokens = requests * tokens_each
    decode = tokens - requests
    accepted = decode - decode / m  # D / (D - A) = m
    spec = describe_speculation({"drafts": round(decode / m), "draft_tokens": 3 * round(decode / m),
                                 "accepted": accepted, "accepted_per_pos": []}, tokens, requests) if drafts else None
    return {"n": n, "seconds_per_token": (a + b * n) / m, "ttft_mean_s": c + d * n, "tokens": tokens,
            "requests": requests, "aggregate_tps": n * tokens_each / (c + d * n + (tokens_each - 1) * (a + b * n) / m),
            "per_request_tps": tokens_each / (c + d * n + (tokens_each - 1) * (a + b * n) / m),
            "speculation": spec}


def test_fit_recovers_known_step_and_ttft_lines() -> None:
    phases = [_phase(n, 0.020, 0.001, 0.050, 0.010) for n in (1, 4, 16)]
    model = fit_served(phases, speculative=False)
    assert model.step.intercept == pytest.approx(0.020) and model.step.slope == pytest.approx(0.001)
    assert model.ttft.intercept == pytest.approx(0.050) and model.ttft.slope == pytest.approx(0.010)
    assert model.tokens_per_step == 1.0 and model.answer_tokens == 129
    spec = fit_served([_phase(n, 0.036, 0.003, 0.050, 0.010, m=2.0, drafts=True) for n in (1, 4, 16)],
                      speculative=True)
    # the step is a token's time times m: the fit sees the speculative step, not the token
    assert spec.tokens_per_step == pytest.approx(2.0)
    assert spec.step.intercept == pytest.approx(0.036) and spec.step.slope == pytest.approx(0.003)


def test_fit_line_least_squares_and_non_negative_slope() -> None:
    got = fit_line([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.8])  # y = 0.15 + 0.94 x by least squares
    assert got.slope == pytest.approx(0.94) and got.intercept == pytest.approx(0.15)
    assert fit_line([1, 4], [5.0, 3.0]) == Line(4.0, 0.0)  # a step never gets faster with N
    assert fit_line([8], [2.0]) == Line(2.0, 0.0)


def test_tokens_per_step_counts_draftless_steps() -> None:
    # 100 decode tokens, 40 accepted in 20 drafts: 60 steps, of which 40 had no draft
    got = describe_speculation({"drafts": 20, "draft_tokens": 60, "accepted": 40, "accepted_per_pos": [20, 15, 5]},
                               tokens=110, requests=10)
    assert got["tokens_per_step"] == pytest.approx(100 / 60)  # not 1 + 40 / 20 = 3
    assert got["accepted_per_draft"] == 2.0 and got["acceptance"] == pytest.approx(40 / 60)


def test_prediction_is_littles_law_on_the_worked_example() -> None:
    plain = ServedModel(Line(0.020, 0.001), Line(0.050, 0.010), 1.0, 129.0, (1, 4, 16))
    spec = ServedModel(Line(0.036, 0.003), Line(0.050, 0.010), 2.0, 129.0, (1, 4, 16))
    assert plain.aggregate_tps(4) == pytest.approx(4 * 129 / (0.09 + 128 * 0.024))
    assert plain.per_request_tps(4) == pytest.approx(129 / (0.09 + 128 * 0.024))
    rows = predict_rows(plain, spec, [1, 2, 4, 8, 16])
    assert [r["speculate"] for i, r in enumerate(rows) if i != 2] == [True, True, False, False]
    assert rows[2]["ratio"] == pytest.approx(1.0)  # the break-even, N = 4
    assert rows[0]["ratio"] > 1.05 and rows[-1]["ratio"] < 0.9


def test_recommendation_turns_speculation_off_where_it_loses() -> None:
    rows = [{"n": n, "speculate": n <= 2} for n in (1, 2, 4, 8, 16)]
    rec = recommend(rows, 3, {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}, "/models/q")
    assert rec["schedule"] == [[1, 2, 3], [3, 16, 0]]
    assert rec["speculate_up_to"] == 2
    words = shlex.split(rec["command"])
    assert words[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/q"]
    cfg = json.loads(words[words.index("--speculative-config") + 1])
    assert cfg == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                   "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 16, 0]]}
    off = recommend([{"n": n, "speculate": False} for n in (1, 4)], 3, {"method": "ngram"}, "/m")
    assert off["schedule"] == [] and "--speculative-config" not in off["command"]
    assert "without" in off["note"]
    on = recommend([{"n": n, "speculate": True} for n in (1, 4)], 3, None, "/m")
    cfg = json.loads(shlex.split(on["command"])[-1])
    assert cfg == {"num_speculative_tokens": 3}  # a fixed k: no table
    assert "method" in on["note"]  # without --spec-config the command misses the method, and says so


def test_plan_from_measurements_predicts_held_out_n_and_scores() -> None:
    grid = [1, 2, 4, 8, 16]
    measured = {"plain": {n: _phase(n, 0.020, 0.001, 0.050, 0.010) for n in grid},
                "spec": {n: _phase(n, 0.034, 0.003, 0.050, 0.010, m=2.0, drafts=True) for n in grid}}
    measured["recommended"] = {n: dict(measured["spec" if n < 4 else "plain"][n]) for n in grid}
    result = plan_from_measurements(measured, grid, [1, 4, 16], k=3, model="/m", spec_config={"method": "ngram"})
    by_n = {r["n"]: r for r in result["rows"]}
    assert by_n[8]["plain_tps"] == pytest.approx(measured["plain"][8]["aggregate_tps"])  # held out, exact data
    v = result["validation"]
    assert v["held_out"]["max_error"] == pytest.approx(0.0, abs=1e-9)
    assert {(r["n"], r["fitted"]) for r in v["rows"] if r["phase"] == "plain"} == {
        (1, True), (2, False), (4, True), (8, False), (16, True)}
    assert v["recommended"]["rows"][0]["vs_plain"] > 1.05 and v["recommended"]["meets_goal"]
    assert result["recommendation"]["schedule"] == [[1, 4, 3], [5, 16, 0]]
    text = render_markdown(result)
    assert "| 2 | " in text and "| 4* | " in text and "num_speculative_tokens_per_batch_size" in text
    # a phase measured wrongly far off is scored as such
    measured["plain"][8] = dict(measured["plain"][8], aggregate_tps=measured["plain"][8]["aggregate_tps"] / 2)
    v = plan_from_measurements(measured, grid, [1, 4, 16], k=3, model="/m")["validation"]
    assert v["held_out"]["max_error"] == pytest.approx(1.0) and not v["goals"]["max_within_20pct"]


def test_measure_at_defaults_and_checks() -> None:
    assert default_measure_at([1, 2, 4, 8, 16]) == [1, 4, 16]
    with pytest.raises(ConfigError, match="--measure-at 3 is not in --concurrency"):
        remote.plan_vllm("http://a:1", "http://b:1", prompts=["x"], concurrency=[1, 2, 4], measure_at=[1, 3])
    with pytest.raises(ConfigError, match="two N or more"):
        remote.plan_vllm("http://a:1", "http://b:1", prompts=["x"], concurrency=[1, 2, 4], measure_at=[4])
    with pytest.raises(ConfigError, match="--measure-at 0"):
        remote.parse_measure_at("0,4")
    with pytest.raises(ConfigError, match="different servers"):
        remote.plan_vllm("http://a:1/v1", "http://a:1", prompts=["x"], concurrency=[1])
    with pytest.raises(ConfigError, match="not a server's address"):
        remote.plan_vllm("localhost:8000", "http://a:1", prompts=["x"], concurrency=[1])


# -- Prometheus ---------------------------------------------------------------------------------
METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 21.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


@pytest.mark.parametrize("small", [False, True])
def test_spec_counters_from_vllm_metrics(small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if small:  # the fallback parser, as without prometheus_client
        monkeypatch.setattr(remote, "parse_samples", remote.parse_samples_small)
    got = remote.spec_counters(METRICS)
    assert got == {"drafts": 15.0, "draft_tokens": 45.0, "accepted": 21.0, "accepted_per_pos": [12.0, 7.0, 2.0]}
    assert remote.spec_counters('vllm:num_requests_running{engine="0"} 3.0\n') is None  # a plain server
    before = remote.spec_counters(METRICS.replace("10.0", "4.0").replace("12.0", "10.0"))
    assert remote.counter_delta(before, got) == {"drafts": 6, "draft_tokens": 0, "accepted": 0,
                                                 "accepted_per_pos": [2, 0, 0]}
    assert remote.counter_delta(None, got)["drafts"] == 15


def test_small_parser_reads_escaped_labels_and_skips_junk() -> None:
    text = 'a_total{l="x\\"y",position="3"} 2\nnot a sample\n# c 1\nb 4.5 1700000000\n'
    assert remote.parse_samples_small(text) == [("a_total", {"l": 'x"y', "position": "3"}, 2.0), ("b", {}, 4.5)]


# -- the phase's figures --------------------------------------------------------------------------
def _record(start: float, ttft: float, per_token: float, tokens: int, client: int = 0) -> remote.Record:
    r = remote.Record(start=start, client=client)
    r.samples = [(start + ttft + i * per_token, float(i + 1)) for i in range(tokens)]
    r.first, r.last, r.tokens = r.samples[0][0], r.samples[-1][0], tokens
    r.end = r.last + 0.001
    return r


def test_summary_uses_the_window_where_every_client_is_busy() -> None:
    # one client, back to back: 11 tokens in 0.1 + 10 x 0.05 = 0.6 s each
    recs, t = [], 0.0
    for _ in range(5):
        recs.append(_record(t, 0.1, 0.05, 11))
        t = recs[-1].end
    got = remote.summarize_phase(recs, 1, 0.0, t)
    assert got["seconds_per_token"] == pytest.approx(0.05)
    assert got["ttft_mean_s"] == pytest.approx(0.1)
    assert got["steady_requests"] == 3  # the first and the last request are outside the window
    assert got["aggregate_tps"] == pytest.approx(11 / 0.601, rel=0.02)
    # a slow tail (the last request alone, say) does not drag the steady aggregate down
    recs[-1] = _record(recs[-2].end, 0.1, 0.5, 11)
    tail = remote.summarize_phase(recs, 1, 0.0, recs[-1].end)
    assert tail["aggregate_tps"] == pytest.approx(got["aggregate_tps"], rel=0.02)
    assert tail["aggregate_total_tps"] < 0.8 * got["aggregate_total_tps"]


# -- end to end against fake servers ----------------------------------------------------------
class FakeVLLM:
    """An OpenAI-compatible streaming server whose every request sleeps ``ttft(active)`` to its
    first token, then ``step(active)`` a step committing ``per_step(active)`` tokens (``active``:
    requests in flight), counting drafts as vLLM's /metrics does when a step commits more than one."""

    def __init__(self, step: Callable[[int], float], ttft: Callable[[int], float],
                 per_step: Callable[[int], int], k: int | None = None, continuous: bool = True) -> None:
        self.step, self.ttft, self.per_step, self.k, self.continuous = step, ttft, per_step, k, continuous
        self.active = 0
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.per_pos = [0] * (k or 0)

    def _chunk(self, text: str | None, so_far: int, body: dict[str, Any]) -> str:
        chunk: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": text} if text is not None
                                              else {"role": "assistant", "content": ""}}]}
        if self.continuous and body.get("stream_options", {}).get("continuous_usage_stats"):
            chunk["usage"] = {"completion_tokens": so_far}
        return f"data: {json.dumps(chunk)}\n\n"

    async def _stream(self, body: dict[str, Any]) -> Any:
        self.active += 1
        try:
            yield self._chunk(None, 0, body)
            await asyncio.sleep(self.ttft(self.active))
            done = 1
            yield self._chunk("w", done, body)
            while done < body["max_tokens"]:
                await asyncio.sleep(self.step(self.active))
                step = min(self.per_step(self.active), body["max_tokens"] - done)
                if self.k:
                    self.counts["drafts"] += 1
                    self.counts["draft_tokens"] += self.k
                    self.counts["accepted"] += step - 1
                    for i in range(step - 1):
                        self.per_pos[i] += 1
                done += step
                yield self._chunk("w" * step, done, body)
            yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': done}})}\n\ndata: [DONE]\n\n"
        finally:
            self.active -= 1

    def metrics(self) -> str:
        if self.k is None:
            return 'vllm:num_requests_running{engine="0"} 0.0\n'
        lines = [f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="fake"}} {v}.0'
                 for name, v in (("drafts", self.counts["drafts"]), ("draft_tokens", self.counts["draft_tokens"]),
                                 ("accepted_tokens", self.counts["accepted"]))]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}.0'
                  for i, v in enumerate(self.per_pos)]
        return "\n".join(lines) + "\n"

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import (
            JSONResponse,
            PlainTextResponse,
            StreamingResponse,
        )
        from starlette.routing import Route

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "fake", "root": "/models/fake"}]})

        async def chat(request: Request) -> StreamingResponse:
            body = await request.json()
            assert body["temperature"] == 0 and body["stream"] and body["model"] == "fake"
            return StreamingResponse(self._stream(body), media_type="text/event-stream")

        async def metrics(request: Request) -> PlainTextResponse:
            return PlainTextResponse(self.metrics())

        return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"]),
                                 Route("/metrics", metrics)])


@contextmanager
def serving(**fakes: FakeVLLM) -> Iterator[dict[str, str]]:
    """The fakes under one uvicorn server on a free port, on its own thread: ``{name: url}``."""
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = Starlette(routes=[Mount(f"/{name}", app=fake.app()) for name, fake in fakes.items()])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the fake server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield {name: f"http://127.0.0.1:{port}/{name}" for name in fakes}
    finally:
        server.should_exit = True
        thread.join(10)


# plain: a step of 15 ms + 7.5 ms x N, one token; speculating (k = 2): 6 ms + 30 ms x N, two tokens.
# A token costs 22.5 / 30 / 45 ms plain and 18 / 33 / 63 ms speculating at N = 1 / 2 / 4: speculation
# wins at N = 1 only. TTFT 20 ms + 10 ms x N on both.
def _plain() -> FakeVLLM:
    return FakeVLLM(lambda n: 0.015 + 0.0075 * n, lambda n: 0.020 + 0.010 * n, lambda n: 1)


def _spec(**kw: Any) -> FakeVLLM:
    return FakeVLLM(lambda n: 0.006 + 0.030 * n, lambda n: 0.020 + 0.010 * n, lambda n: 2, k=2, **kw)


def _timed(check: Callable[[], None], tries: int = 2) -> None:
    """``check()``, once more if a timing assertion fails: the fakes sleep real milliseconds on a
    shared machine, where another process can stall a whole phase (wrong code fails every try)."""
    for i in range(tries):
        try:
            return check()
        except AssertionError:
            if i == tries - 1:
                raise


def test_load_generator_measures_a_known_server_and_the_fit_predicts_held_out_n() -> None:
    _timed(_measure_known_servers)


def _measure_known_servers() -> None:
    with serving(plain=_plain(), spec=_spec()) as urls:
        result = remote.plan_vllm(urls["plain"], urls["spec"], prompts=["a", "b", "c", "d"], concurrency=[1, 2, 4],
                                  measure_at=[1, 4], max_tokens=9, validate=True, requests_per_client=3)
    plain, spec = result["measured"]["plain"], result["measured"]["spec"]
    for n in (1, 2, 4):  # each client's decode rate is the server's step at its N
        assert plain[str(n)]["seconds_per_token"] == pytest.approx(0.015 + 0.0075 * n, rel=0.25)
        assert spec[str(n)]["seconds_per_token"] == pytest.approx((0.006 + 0.030 * n) / 2, rel=0.25)
        assert plain[str(n)]["ttft_mean_s"] == pytest.approx(0.020 + 0.010 * n, rel=0.5)
        assert plain[str(n)]["mean_tokens"] == 9
        # 9 tokens: the first, then 4 steps of 2 (one accepted each): D / (D - A) = 8 / 4
        assert spec[str(n)]["speculation"]["tokens_per_step"] == 2.0
        assert spec[str(n)]["speculation"]["acceptance"] == 0.5
    fit = result["fit"]
    assert result["k"] == 2  # from /metrics' draft positions
    assert fit["spec"]["tokens_per_step"] == 2.0 and fit["plain"]["tokens_per_step"] == 1.0
    assert fit["plain"]["step"]["slope"] == pytest.approx(0.0075, rel=0.3)
    assert fit["spec"]["step"]["slope"] == pytest.approx(0.030, rel=0.2)
    # N = 2 was left out of the fit: its prediction against its measurement
    v = result["validation"]
    held = [r for r in v["rows"] if not r["fitted"]]
    assert {r["n"] for r in held} == {2} and len(held) == 2
    assert all(abs(r["error"]) < 0.2 for r in held), held
    assert result["recommendation"]["schedule"] == [[1, 1, 2], [2, 4, 0]]
    assert [r["speculate"] for r in result["rows"]] == [True, False, False]
    # the steady aggregate is Little's law on the measured figures (N busy clients)
    for n in (1, 2, 4):
        p = plain[str(n)]
        e2e = p["ttft_mean_s"] + (p["mean_tokens"] - 1) * p["seconds_per_token"]
        assert p["aggregate_tps"] == pytest.approx(n * p["mean_tokens"] / e2e, rel=0.2)


def test_cli_plans_for_vllm_without_loading_a_model(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _timed(lambda: _plan_with_the_cli(tmp_path, monkeypatch))


def _plan_with_the_cli(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from draftwise.cli import app
    from draftwise.cli import plan as plan_cli

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("--engine vllm loaded a model")

    monkeypatch.setattr(plan_cli, "load_with_status", no_model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n", encoding="utf-8")
    # the recommended server: speculates alone in a step, plain with more (and no per-chunk usage)
    rec = FakeVLLM(lambda n: 0.006 + 0.030 * n if n <= 1 else 0.015 + 0.0075 * n, lambda n: 0.020 + 0.010 * n,
                   lambda n: 2 if n <= 1 else 1, k=2, continuous=False)
    with serving(plain=_plain(), spec=_spec(), rec=rec) as urls:
        res = CliRunner().invoke(app, [
            "plan", "--engine", "vllm", "--url", urls["plain"], "--spec-url", urls["spec"] + "/v1/",
            "--validate-url", urls["rec"], "--concurrency", "1,2", "-n", "7", "--per-category", "2",
            "--prompts", str(prompts), "--spec-config", '{"method": "ngram", "prompt_lookup_max": 4}',
            "--out", str(tmp_path / "out")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "out" / "remote-plan.json").read_text(encoding="utf-8"))
    assert result["config"]["prompts"] == 2 and result["config"]["max_tokens"] == 7
    assert set(result["measured"]) == {"plain", "spec", "recommended"}
    assert all(p["mean_tokens"] == 7 for p in result["measured"]["recommended"].values())
    ratios = result["validation"]["recommended"]["rows"]
    assert [r["n"] for r in ratios] == [1, 2] and ratios[0]["vs_plain"] > 1.05
    assert "python -m vllm.entrypoints.openai.api_server --model /models/fake" in res.stdout
    assert '"method": "ngram"' in result["recommendation"]["command"]
    assert (tmp_path / "out" / "remote-plan.md").read_text(encoding="utf-8").startswith("# Planning for vLLM")


@pytest.mark.parametrize("args, message", [
    (["--engine", "vllm"], "give --url PLAIN_URL"),
    (["--url", "http://localhost:1"], "add --engine vllm"),
    (["--spec-url", "http://localhost:1"], "add --engine vllm"),
    (["--engine", "sglang", "--url", "http://localhost:1"], "only vllm"),
    (["--engine", "vllm", "--url", "http://localhost:1", "--spec-url", "http://localhost:2",
      "--spec-config", "[1]"], "JSON object"),
])
def test_cli_engine_errors_are_one_line(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from draftwise.cli import app

    res = CliRunner().invoke(app, ["plan", *args], catch_exceptions=False)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_an_unreachable_server_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"--url http://127.0.0.1:9: no server answers"):
        remote.plan_vllm("http://127.0.0.1:9", "http://127.0.0.1:10", prompts=["x"], concurrency=[1])


def test_a_plain_server_that_speculates_is_refused() -> None:
    with serving(plain=_spec(), spec=_spec()) as urls:
        with pytest.raises(ConfigError, match="--url .* speculates"):
            remote.plan_vllm(urls["plain"], urls["spec"], prompts=["a"], concurrency=[1, 2], max_tokens=5,
                             requests_per_client=1)


def test_percentile_is_nearest_rank() -> None:
    assert remote._pct([3.0, 1.0, 2.0], 50) == 2.0 and remote._pct(list(range(1, 101)), 99) == 99
    assert math.isnan(remote._pct([], 50))


def test_an_extrapolation_to_no_time_is_one_line() -> None:
    model = ServedModel(Line(-0.010, 0.004), Line(0.05, 0.0), 1.0, 100.0, (4, 16))
    assert model.aggregate_tps(4) == pytest.approx(4 * 100 / (0.05 + 99 * 0.006))
    with pytest.raises(ConfigError, match="no time at N = 2"):
        model.aggregate_tps(2)
