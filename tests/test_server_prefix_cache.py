"""`draftwise serve --prefix-cache-mb N`: end to end with the real `openai` client.

A request whose prompt starts like an earlier one reuses its K/V and says so in
``usage.prompt_tokens_details.cached_tokens`` (streamed and not) and in llama.cpp's ``timings``;
/metrics counts ``prefix_cache_queries`` and ``prefix_cache_hits`` as vLLM names them; every
answer equals ``draftwise generate`` of the same ids, at max_batch 1 and batched; a cancelled
request leaves the cache sound; the option is on by default, 0 turns it off, and the Hugging Face
runtime has none."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402

from draftwise import generate, load_model  # noqa: E402
from draftwise.cli import app as cli  # noqa: E402
from draftwise.runtime.chat import encode_conversation  # noqa: E402
from draftwise.runtime.prefix_cache import DEFAULT_PREFIX_CACHE_MB  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

SYSTEM = "You are a careful assistant. Answer briefly and repeat the key words of the question. " * 3


@pytest.fixture(scope="module")
def reference(tiny_chat_folder: Any, one_thread: None) -> Any:
    return load_model(str(tiny_chat_folder))


def serve(folder: Any, **settings: Any) -> tuple[Any, LiveServer]:
    model = load_model(str(folder))  # its own: the engine splits its cache into slots
    settings = {"model_name": "tiny", "max_tokens_cap": 64, "prefill_chunk": 8, "context": 256, **settings}
    app = create_app(model, Speculation(model, draft="lookup", k=4, plan=None, allow=["suffix"]),
                     ServerSettings(**settings))
    return app, LiveServer(app)


def metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def ask(c: Any, question: str, **kw: Any) -> Any:
    return c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": SYSTEM + question}],
                                     temperature=0, max_tokens=24, extra_body={"return_token_ids": True}, **kw)


@pytest.mark.parametrize("max_batch", [1, 3])
def test_a_prompt_that_starts_like_an_earlier_one_reuses_its_kv(tiny_chat_folder: Any, reference: Any,
                                                                 max_batch: int) -> None:
    app, server = serve(tiny_chat_folder, max_batch=max_batch, prefix_cache_mb=1)
    ids = {q: encode_conversation(reference.tokenizer, [SYSTEM + q]) for q in ("Name a colour.", "Count to five.")}
    want = {q: generate(reference, i, max_new_tokens=24).token_ids for q, i in ids.items()}
    with server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        first, again, other = ask(c, "Name a colour."), ask(c, "Name a colour."), ask(c, "Count to five.")
        for r, q in ((first, "Name a colour."), (again, "Name a colour."), (other, "Count to five.")):
            assert r.choices[0].token_ids == want[q] and r.usage.prompt_tokens == len(ids[q])
        cached = [r.usage.prompt_tokens_details.cached_tokens for r in (first, again, other)]
        assert cached[0] == 0 and cached[1] == len(ids["Name a colour."]) - 1  # a repeat: all but one token
        assert 16 <= cached[2] < len(ids["Count to five."])  # the shared system text, to where they part
        assert again.timings["cache_n"] == cached[1] and again.timings["prompt_n"] == 1
        chunks = list(c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": SYSTEM + "Count to five."}], temperature=0,
            max_tokens=24, stream=True, stream_options={"include_usage": True}))
        final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][0]
        assert final.usage.prompt_tokens_details.cached_tokens == len(ids["Count to five."]) - 1
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ids["Count to five."]) - 1
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == other.choices[0].message.content
        text = httpx.get(server.url + "/metrics").text
    queried = sum(len(i) for i in ids.values()) + len(ids["Name a colour."]) + len(ids["Count to five."])
    assert metric(text, "draftwise:prefix_cache_queries_total") == queried
    assert metric(text, "draftwise:prefix_cache_hits_total") == sum(cached) + len(ids["Count to five."]) - 1
    assert 0 < metric(text, "draftwise:prefix_cache_bytes") <= 1 << 20  # type: ignore[operator]
    assert app.state.worker.prefix_cache.hits == metric(text, "draftwise:prefix_cache_hits_total")


def test_off_every_request_prefills_its_whole_prompt(tiny_chat_folder: Any) -> None:
    app, server = serve(tiny_chat_folder)  # ServerSettings' default: off (serve's is on)
    assert app.state.worker.prefix_cache is None
    with server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for _ in range(2):
            r = ask(c, "Name a colour.")
            assert r.usage.prompt_tokens_details.cached_tokens == 0 and r.timings["prompt_n"] == r.usage.prompt_tokens
        assert "prefix_cache" not in httpx.get(server.url + "/metrics").text


def test_a_request_cancelled_while_it_shares_a_prefill_leaves_the_cache_sound(tiny_chat_folder: Any,
                                                                             reference: Any) -> None:
    app, server = serve(tiny_chat_folder, max_batch=3, prefix_cache_mb=1)
    worker = app.state.worker
    ids = encode_conversation(reference.tokenizer, [SYSTEM * 2 + "Say hello."])
    with server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        body = {"messages": [{"role": "user", "content": SYSTEM * 2 + "Say hello."}], "max_tokens": 64,
                "temperature": 0, "stream": True}
        done = threading.Event()

        def hang_up() -> None:  # the same new prompt, sent at once; the client leaves at once
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
                next(r.iter_lines())
            done.set()

        t = threading.Thread(target=hang_up)
        t.start()
        r = c.chat.completions.create(model="tiny", messages=body["messages"], temperature=0, max_tokens=24,
                                      extra_body={"return_token_ids": True})
        t.join(30)
        assert done.is_set()
        later = c.chat.completions.create(model="tiny", messages=body["messages"], temperature=0, max_tokens=24,
                                          extra_body={"return_token_ids": True})
        want = generate(reference, ids, max_new_tokens=24).token_ids
        assert r.choices[0].token_ids == later.choices[0].token_ids == want
        assert later.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    cache = worker.prefix_cache
    assert cache.bytes <= cache.max_bytes and all(b.refs == 0 for b in cache._blocks.values())


def test_the_hugging_face_runtime_serves_without_a_prefix_cache(tiny_chat_folder: Any, one_thread: None) -> None:
    model = load_model(str(tiny_chat_folder), runtime="hf")
    app = create_app(model, Speculation(model, draft="none", k=4, plan=None),
                     ServerSettings(model_name="tiny", prefix_cache_mb=64))
    assert app.state.worker.prefix_cache is None


def invoke(args: list[str], monkeypatch: Any) -> Any:
    captured: dict[str, Any] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: captured.update(app=app))
    monkeypatch.setattr("draftwise.cli.serve._setup_logging", lambda level: None)
    result = CliRunner().invoke(cli, ["serve", *args])
    result.app = captured.get("app")
    return result


def test_serve_turns_it_on_by_default_and_0_off(tiny_chat_folder: Any, one_thread: None, monkeypatch: Any) -> None:
    bad = invoke(["--prefix-cache-mb", "-1"], monkeypatch)
    assert bad.exit_code == 2 and "--prefix-cache-mb" in bad.output and bad.app is None
    for args, bound in (([], DEFAULT_PREFIX_CACHE_MB), (["--prefix-cache-mb", "0"], None),
                        (["--prefix-cache-mb", "3", "--max-batch", "2"], 3)):
        res = invoke(["--model", str(tiny_chat_folder), "--context", "128", *args], monkeypatch)
        assert res.exit_code == 0, res.output
        cache = res.app.state.worker.prefix_cache
        line = " ".join(res.output.split())
        if bound is None:
            assert cache is None and "prefix cache off" in line
        else:
            assert cache.max_bytes == bound << 20 and f"prefix cache {bound} MiB" in line
