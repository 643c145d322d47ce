"""`draftwise serve` end to end: the real `openai` client against a live server on loopback
(the tiny random chat model: greedy output is deterministic, so equality is exact)."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from draftwise import SamplingConfig, generate, load_model  # noqa: E402
from draftwise.errors import ConfigError  # noqa: E402
from draftwise.planner.plan import Plan  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.protocol import Speculative  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

MSG = [{"role": "user", "content": "Count to five and back: one two three"}]
TEXT = MSG[0]["content"]


class FlatCosts:
    """A flat machine profile: the policy's choices, not the timing, are under test."""

    max_n = 9

    def step_time(self, n, context=None):
        return 0.01 + 0.001 * n

    def draft_time(self, draft, k):
        return 1e-6


def start(model, *, draft="lookup", k=4, plan=None, **settings):
    settings.setdefault("max_tokens_cap", 48)
    app = create_app(model, Speculation(model, draft=draft, k=k, plan=plan),
                     ServerSettings(model_name="tiny", **settings))
    return app, LiveServer(app)


def client(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def live(tiny):
    app, server = start(tiny)
    with server:
        yield app, server, client(server)


@pytest.mark.parametrize("spec", [None, {"draft": "none"}, {"draft": "lookup", "k": 2}, {"k": 8}])
def test_greedy_chat_equals_generate_token_for_token(tiny, live, spec):
    _, _, c = live
    body = {"return_token_ids": True, **({"speculative": spec} if spec else {})}
    r = c.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=40, extra_body=body)
    ref = generate(tiny, TEXT, max_new_tokens=40)
    assert r.choices[0].token_ids == ref.token_ids
    assert r.choices[0].message.content == ref.text
    assert r.usage.completion_tokens == ref.new_tokens
    want = "none" if spec == {"draft": "none"} else "lookup"
    assert r.speculative["draft"] == want
    assert r.speculative["chosen_by"] == ("server" if spec is None else "request")
    if want == "lookup":
        assert r.speculative["proposed"] > 0 and r.timings["draft_n"] == r.speculative["proposed"]


def test_completion_text_and_token_prompts_equal_generate(tiny, live):
    _, _, c = live
    ref = generate(tiny, "The numbers: 1 2 3", max_new_tokens=24, chat=False)
    r = c.completions.create(model="tiny", prompt="The numbers: 1 2 3", temperature=0, max_tokens=24,
                             extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == ref.token_ids and r.choices[0].text == ref.text
    ids = tiny.encode_prompt("The numbers: 1 2 3", chat=False)
    r2 = c.completions.create(model="tiny", prompt=ids, temperature=0, max_tokens=24)
    assert r2.choices[0].text == ref.text and r2.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_stream_chunks_concatenate_to_the_full_text(live, kind):
    _, _, c = live
    args = dict(model="tiny", temperature=0, max_tokens=40)
    if kind == "chat":
        full = c.chat.completions.create(messages=MSG, **args).choices[0].message.content
        chunks = list(c.chat.completions.create(messages=MSG, stream=True, stream_options={"include_usage": True},
                                                **args))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    else:
        full = c.completions.create(prompt=TEXT, **args).choices[0].text
        chunks = list(c.completions.create(prompt=TEXT, stream=True, stream_options={"include_usage": True}, **args))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full and len(chunks) > 3
    final, usage_only = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason == "length"
    assert final.speculative["committed"] >= 40 and final.timings["predicted_n"] == 40
    assert usage_only.choices == [] and usage_only.usage.completion_tokens == 40


def test_sampling_seed_and_stop_are_honoured(tiny, live):
    _, _, c = live
    args = dict(model="tiny", messages=MSG, max_tokens=30, temperature=0.9, top_p=0.9, seed=7)
    a = c.chat.completions.create(**args, extra_body={"top_k": 20, "return_token_ids": True})
    b = c.chat.completions.create(**args, extra_body={"top_k": 20, "return_token_ids": True})
    assert a.choices[0].token_ids == b.choices[0].token_ids  # same seed, same tokens
    cfg = SamplingConfig(temperature=0.9, top_p=0.9, top_k=20, seed=7)
    ref = generate(tiny, TEXT, max_new_tokens=30, sampling=cfg, draft="lookup", k=4)  # the server's default
    assert a.choices[0].token_ids == ref.token_ids  # the server samples as the library does
    greedy = generate(tiny, TEXT, max_new_tokens=30).text
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 3]
    r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == greedy[:greedy.index(stop)]


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"extra_body": {"mirostat": 2}}, "mirostat"),
    ({"max_tokens": 49}, "max_tokens"),
    ({"max_completion_tokens": 1000}, "max_completion_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"extra_body": {"speculative": {"draft": "lokup"}}}, "speculative.draft"),
    ({"extra_body": {"speculative": {"k": 0}}}, "speculative.k"),
    ({"extra_body": {"speculative": {"draft": "model:/etc"}}}, "speculative.draft"),
    ({"extra_body": {"speculative": {"draft": "auto"}}}, "speculative.draft"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
])
def test_unsupported_or_invalid_parameters_get_400_naming_them(live, kwargs, param):
    _, _, c = live
    args = {"model": "tiny", "messages": MSG, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(**args)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split(".")[-1].split("[")[0] in err["message"] or "speculative" in param


def test_context_wrong_model_json_and_body_size(tiny, live):
    app, server, c = live
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="tiny", prompt=[5] * 500, max_tokens=40)  # 540 > 512 positions
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as info:
        c.chat.completions.create(model="/etc/passwd", messages=MSG)
    assert info.value.body["code"] == "model_not_found"
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * (2 << 20)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert app.state.worker.alive


def test_draft_auto_routes_by_category_through_the_plan(tiny):
    plan = Plan(model="tiny", fingerprint="", dtype="float32", greedy=True, drafts=["lookup"], ks=[2], categories={},
                recommended={"overall": ("lookup", 2), "writing": ("none", 0)},
                predicted={"overall": 1.2, "writing": 1.0}, routed_overall=1.1)
    _, server = start(tiny, draft="auto", plan=plan)
    ref = generate(tiny, TEXT, max_new_tokens=20).token_ids
    with server:
        c = client(server)
        for category, draft in [("writing", "none"), ("coding", "lookup"), (None, "lookup")]:
            body = {"return_token_ids": True, "speculative": {"category": category} if category else {}}
            r = c.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=20, extra_body=body)
            assert r.speculative["draft"] == draft and r.speculative["chosen_by"] == "plan"
            assert r.choices[0].token_ids == ref


def test_k_auto_runs_an_adaptive_policy(tiny, monkeypatch):
    _, server = start(tiny, k="auto")
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: FlatCosts())
    with server:
        r = client(server).chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=30,
                                                   extra_body={"return_token_ids": True})
    assert r.speculative["k"] == "auto" and r.speculative["proposed"] > 0
    assert r.choices[0].token_ids == generate(tiny, TEXT, max_new_tokens=30).token_ids


def test_requests_of_one_draft_share_what_k_auto_learns_of_tree_sizes(tiny, monkeypatch):
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: FlatCosts())
    spec = Speculation(tiny, draft="suffix", k="auto", plan=None, allow=["lookup"])
    spec.warm_up()
    (_, a), (_, b) = spec.build(spec.choose(None)), spec.build(spec.choose(None))
    (_, other) = spec.build(spec.choose(Speculative(draft="lookup")))
    assert a is not b and a.tree_sizes is b.tree_sizes and other.tree_sizes is not a.tree_sizes


@pytest.mark.parametrize("k", [4, "auto"])
def test_a_seeded_sample_with_a_learning_draft_is_reproduced(tiny, monkeypatch, k):
    """The suffix draft's cache learns every answer, so it proposes differently the second time,
    and sampled verification draws its random numbers per proposed token: a seeded sampled
    request drafts from its own prompt and output, and adapts k alone (docs/contract.md)."""
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: FlatCosts())
    _, server = start(tiny, draft="suffix", k=k)
    args = dict(model="tiny", messages=MSG, max_tokens=40, temperature=0.9, seed=3,
                extra_body={"return_token_ids": True})
    with server:
        c = client(server)
        first = c.chat.completions.create(**args).choices[0]
        for seed in (None, 5):  # others teach the cache its own answer and theirs
            c.chat.completions.create(**{**args, "seed": seed})
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Say hello"}], max_tokens=40)
        again = c.chat.completions.create(**args).choices[0]
    assert again.token_ids == first.token_ids and again.message.content == first.message.content
    if k == 4:  # what the library samples with a fresh suffix drafter (its cache empty)
        ref = generate(tiny, TEXT, max_new_tokens=40, sampling=SamplingConfig(temperature=0.9, seed=3),
                       draft="suffix", k=4)
        assert first.token_ids == ref.token_ids


def test_a_seeded_sampled_choice_drafts_and_adapts_alone(tiny, monkeypatch):
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: FlatCosts())
    spec = Speculation(tiny, draft="suffix", k="auto", plan=None, allow=["lookup"])
    spec.warm_up()
    shared, (_, b) = spec.build(spec.choose(None)), spec.build(spec.choose(None))
    alone = spec.build(spec.choose(None, isolated=True))
    assert alone[0] is not shared[0] and alone[0].cache is None and shared[0].cache is not None
    assert alone[1].tree_sizes is not shared[1].tree_sizes and shared[1].tree_sizes is b.tree_sizes
    lookup = spec.choose(Speculative(draft="lookup"))
    assert spec.build(lookup)[0] is spec.build(spec.choose(Speculative(draft="lookup"), isolated=True))[0]


def test_k_is_capped_by_max_k(tiny, monkeypatch):
    """A request's k over --max-k gets 400 naming the cap; k auto, the plan's k and --k stay under it."""
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: FlatCosts())
    app = create_app(tiny, Speculation(tiny, draft="lookup", k=2, plan=None, allow=["suffix"], max_k=3),
                     ServerSettings(model_name="tiny", max_tokens_cap=16))
    with LiveServer(app) as server:
        c = client(server)
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, extra_body={"speculative": {"k": 4}})
        assert info.value.body["param"] == "speculative.k"
        assert "k=4 is over this server's cap of 3 (--max-k)" in info.value.body["message"]
        r = c.chat.completions.create(model="tiny", messages=MSG, max_tokens=8, extra_body={"speculative": {"k": 3}})
        assert r.speculative["k"] == 3
    with pytest.raises(ConfigError, match="--k 4 is over --max-k 3"):
        Speculation(tiny, draft="lookup", k=4, plan=None, max_k=3)
    spec = Speculation(tiny, draft="lookup", k="auto", plan=None, allow=["suffix"], max_k=3)
    spec.warm_up()
    for draft in ("lookup", "suffix"):  # a chain and a scored tree
        assert spec.build(spec.choose(Speculative(draft=draft)))[1].k_max == 3
    plan = Plan(model="tiny", fingerprint="", dtype="float32", greedy=True, drafts=["lookup"], ks=[8], categories={},
                recommended={"overall": ("lookup", 8)}, predicted={"overall": 1.2}, routed_overall=1.2)
    assert Speculation(tiny, draft="auto", k=2, plan=plan, max_k=3).choose(None).k == 3


def test_the_context_holds_at_batch_1_and_is_what_v1_models_says(tiny):
    _, server = start(tiny, context=64)
    with server:
        c = client(server)
        assert c.models.list().data[0].max_model_len == 64
        with pytest.raises(openai.BadRequestError, match="context of 64 tokens") as info:
            c.completions.create(model="tiny", prompt=[5] * 80, max_tokens=4)
        assert info.value.body["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="context of 64 tokens"):
            c.completions.create(model="tiny", prompt=[5] * 40, max_tokens=30)
        assert c.completions.create(model="tiny", prompt=[5] * 40, max_tokens=24).usage.total_tokens <= 64
    limit = tiny.runtime.max_context
    with pytest.raises(ConfigError, match=f"--context {limit + 1} is over this model's maximum of {limit} positions"):
        start(tiny, context=limit + 1)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_sent_as_json_gets_415_saying_so(live, content_type):
    _, server, _ = live
    body = json.dumps({"messages": MSG, "max_tokens": 4}).encode()
    sent = {"content-type": content_type} if content_type else {}
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=sent)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert error["message"].startswith("the body must be JSON sent with 'Content-Type: application/json'; ")
    assert error["message"].endswith(f"this request's is '{content_type}'" if content_type else "this request has none")
    for json_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"content-type": json_type})
        assert r.status_code == 200


@pytest.mark.parametrize("field, value", [
    ("max_batch", 0), ("prefill_chunk", 0), ("context", 0), ("max_queue", 0), ("max_tokens_cap", 0),
    ("max_body_bytes", 0), ("request_timeout_s", 0.0), ("request_timeout_s", float("nan")),
])
def test_server_settings_refuse_an_out_of_range_value_naming_it_alone(field, value):
    with pytest.raises(ConfigError) as info:
        ServerSettings(model_name="tiny", **{field: value})
    message = str(info.value)
    assert message.startswith(f"{field}=")
    others = {"max_batch", "prefill_chunk", "context", "max_queue", "max_tokens_cap", "max_body_bytes"} - {field}
    assert not any(other in message for other in others)


def test_api_key_guards_every_endpoint_but_health(tiny):
    _, server = start(tiny, api_key="s3cret")
    with server:
        assert httpx.get(server.url + "/health").status_code == 200
        for path in ("/v1/models", "/metrics", "/openapi.json"):
            r = httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(server, "nope").models.list()
        assert client(server, "s3cret").models.list().data[0].id == "tiny"


@pytest.fixture()
def slow(tiny_chat_folder):
    """A fresh tiny model whose every decode pass (alone or batched) takes >= 20 ms, so requests overlap."""
    model = load_model(str(tiny_chat_folder))
    forward, forward_batch = model.runtime.forward, model.runtime.forward_batch

    def slow_forward(*a, **kw):
        time.sleep(0.02)
        return forward(*a, **kw)

    def slow_forward_batch(*a, **kw):
        time.sleep(0.02)
        return forward_batch(*a, **kw)

    model.runtime.forward, model.runtime.forward_batch = slow_forward, slow_forward_batch
    return model


def _metric(server, name, **labels):
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_hung_up_stream_frees_the_worker(slow):
    app, server = start(slow, draft="none", max_tokens_cap=200)
    worker = app.state.worker
    with server:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                          json={"messages": MSG, "max_tokens": 200, "temperature": 0, "stream": True}) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen >= 3:
                    break  # hang up after a few tokens: 200 would take >= 4 s
        deadline = time.monotonic() + 2
        while (worker.running or worker.waiting) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert worker.running == 0 and worker.waiting == 0, "the generation went on after the client left"
        assert _metric(server, "draftwise:request_success_total", finished_reason="abort") == 1
        assert _metric(server, "draftwise:generation_tokens_total") < 50
        r = client(server).chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=5)
        assert r.usage.completion_tokens == 5


@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_hung_up_non_streamed_request_is_cancelled(slow, max_batch):
    """As a hung-up stream is: the job ends within a step or two, frees its place, counts as an abort."""
    app, server = start(slow, draft="none", max_tokens_cap=200, max_batch=max_batch, context=256)
    worker = app.state.worker
    body = {"messages": MSG, "max_tokens": 200, "temperature": 0}
    with server:
        with pytest.raises(httpx.ReadTimeout):  # hang up after ~0.6 s: 200 tokens would take >= 4 s
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=0.6)
        running = (lambda: worker.engine.running) if max_batch > 1 else (lambda: worker.running)
        deadline = time.monotonic() + 2
        while running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running() == 0, "the generation went on after the client left"
        assert worker.engine is None or worker.engine.free == max_batch
        assert _metric(server, "draftwise:request_success_total", finished_reason="abort") == 1
        assert _metric(server, "draftwise:generation_tokens_total") < 100
        r = client(server).chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=5)
        assert r.usage.completion_tokens == 5


def test_full_queue_gets_429_and_timeout_504(slow):
    # the timeout here only has to outlast two queued 60-token requests (>= 2.4 s of sleeps, more
    # on a slow machine): the 504 is tested by the second server below
    app, server = start(slow, draft="none", max_queue=1, max_tokens_cap=60, request_timeout_s=10)
    worker = app.state.worker
    body = {"messages": MSG, "max_tokens": 60, "temperature": 0}
    with server:
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30).status_code)) for _ in range(2)]
        threads[0].start()
        while not worker.running:
            time.sleep(0.01)
        threads[1].start()
        while not worker.waiting:
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as info:
            client(server).chat.completions.create(**body, model="tiny")
        assert info.value.body["code"] == "queue_full"
        for t in threads:
            t.join()
        assert results == [200, 200]
    _, server = start(slow, draft="none", max_tokens_cap=60, request_timeout_s=0.3)
    with server:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                          json={"prompt": TEXT, "max_tokens": 60, "stream": True, "temperature": 0}) as s:
            events = [json.loads(x[5:]) for x in s.iter_lines() if x.startswith("data:") and x != "data: [DONE]"]
        assert events[-1].get("error", {}).get("code") == "timeout", events[-3:]


def test_a_failing_request_does_not_kill_the_worker(tiny, monkeypatch):
    app, server = start(tiny)
    calls = []

    def broken(self, choice, *slot):
        calls.append(choice)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return original(self, choice, *slot)

    original = Speculation.build
    monkeypatch.setattr(Speculation, "build", broken)
    with server:
        with pytest.raises(openai.InternalServerError):
            client(server).chat.completions.create(model="tiny", messages=MSG, max_tokens=5)
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        r = client(server).chat.completions.create(model="tiny", messages=MSG, max_tokens=5)
        assert r.usage.completion_tokens == 5
        assert _metric(server, "draftwise:request_success_total", finished_reason="error") == 1


def test_metrics_count_speculation_like_vllm(live):
    _, server, c = live
    before = _metric(server, "draftwise:spec_decode_num_drafts_total", draft="lookup")
    r = c.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=40)
    spec = r.speculative
    text = httpx.get(server.url + "/metrics").text
    assert _metric(server, "draftwise:spec_decode_num_drafts_total", draft="lookup") > before
    for name in ("draftwise:spec_decode_num_draft_tokens_total", "draftwise:spec_decode_num_accepted_tokens_total",
                 "draftwise:spec_decode_num_accepted_tokens_per_pos_total", "draftwise:time_to_first_token_seconds_bucket",
                 "draftwise:inter_token_latency_seconds_bucket", "draftwise:e2e_request_latency_seconds_count",
                 "draftwise:num_requests_waiting", "draftwise:request_generation_tokens_per_second_count"):
        assert name in text, name
    assert spec["accepted"] <= spec["proposed"] and spec["target_passes"] <= 40
    assert len(spec["acceptance_by_position"]) >= 1


def test_a_server_with_k_auto_runs_the_plans_draft_with_the_adaptive_k(monkeypatch):
    plan = Plan(model="tiny", fingerprint="", dtype="float32", greedy=True, drafts=["lookup", "suffix"], ks=[2, 5],
                categories={}, recommended={"overall": ("lookup", 2), "writing": ("suffix", 5)},
                predicted={"overall": 1.2, "writing": 1.3}, routed_overall=1.2)
    Spec = Speculative  # noqa: N806
    fixed = Speculation(None, draft="auto", k=4, plan=plan)
    adaptive = Speculation(None, draft="auto", k="auto", plan=plan)
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: "a profile")
    adaptive.warm_up()  # k auto needs the profile, read at start-up
    assert (str(fixed.choose(Spec(category="writing")).draft), fixed.choose(Spec(category="writing")).k) == ("suffix", 5)
    choice = adaptive.choose(Spec(category="writing"))
    assert (str(choice.draft), choice.k, choice.chosen_by) == ("suffix", "auto", "plan")
    choice = adaptive.choose(Spec(category="writing", k=3))  # the request's own k still wins
    assert (choice.k, choice.chosen_by) == (3, "plan+request")
