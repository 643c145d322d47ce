"""EAGLE drafts through `draftwise serve` end to end (issue 25, item 8).

One server for the module, started through the CLI as an operator would start it (``draftwise
serve --threads 1 --draft lookup --k 4 --allow-draft eagle:A,suffix+eagle:A,eagle:A,topk=3,depth=3,
eagle:C``, with ``uvicorn.run`` replaced by a :class:`LiveServer` on loopback), on the tiny random
chat model and heads saved for it with ``save_head``. Head A (EAGLE-1) is wired to mostly copy its
input feature, so on this model's repetitive output some of its proposals are accepted and some
rejected: equality with plain decoding is earned, not trivially met. Head C (EAGLE-3, random)
reads three other layers of the same runtime.

- Each allowed EAGLE draft (A's chain and tree, C, and the ``suffix+eagle:A`` hybrid) named by a
  request gives, greedy, exactly the tokens of plain ``draftwise.generate``, through chat and
  text completions, with the draft reported and its proposals counted. For A's chain and tree
  and for C the statistics equal, number for number, those of the library run with a fresh
  drafter, although the server's drafter had just run on another prompt and the other head,
  plain and lookup decoding had just run on the runtime (a drafter that kept state from an
  earlier generation, or a head reading the other head's layers, fails this). The hybrid's
  suffix cache lasts across requests: a repeated request needs fewer target passes.
- A request naming any other head (a valid head in another folder, ``eagle:/etc``, a path that
  walks from A's folder to the other, A with other options; chain, tree or hybrid; streamed or
  not) gets 400 ``speculative.draft`` listing the allowed drafts, and neither the head loader
  nor the drafter factory runs for it: heads are loaded at start-up, the allowed ones only.
- Streaming with an EAGLE draft sends SSE ``data:`` chunks ending ``data: [DONE]`` whose text
  equals the non-streamed text, and whose final chunk carries the same statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402

from draftwise import generate  # noqa: E402
from draftwise import threads as threads_module  # noqa: E402
from draftwise.cli import app as cli  # noqa: E402
from draftwise.eagle import drafter as eagle_module  # noqa: E402
from draftwise.core.engine import DEFAULT_MAX_BATCH  # noqa: E402
from draftwise.server import speculation as speculation_module  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402

from .eagle_heads import head_folder as _head_folder  # noqa: E402

TEXT = "one two three four five one two three four five"  # completions: chat=False
CHAT = "The numbers: 1 2 3"  # chat completions: the chat template
N = 40  # tokens per request (the server's cap is 48)
K = 4  # the server's --k
STATS = ("proposed", "accepted", "committed", "target_passes", "acceptance_by_position", "mean_committed_per_pass")


@dataclass
class Served:
    server: LiveServer
    app: Any
    a: Path  # the allowed EAGLE-1 head
    c: Path  # the allowed EAGLE-3 head (random: proposes, is never accepted)
    b: Path  # a valid head the server was not started with
    allowed: list[str]  # the allowed drafts, in the server's order
    loads: list[str]  # every load_head call (folder), start-up and library references included
    built: list[str]  # every spec the server's Speculation asked the factory for
    at_start: tuple[list[str], list[str]]  # (loads, built) when the server had started
    output: str  # what `draftwise serve` printed


@pytest.fixture(scope="module")
def served(tiny, tiny_chat_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    a = _head_folder(tiny, root / "head-a", arch="eagle1", seed=0, copy_feature=True)
    b = _head_folder(tiny, root / "head-b", arch="eagle1", seed=1)
    c = _head_folder(tiny, root / "head-c", arch="eagle3", seed=2)
    # two heads reading different layers of one runtime: each must switch the capture back to its own
    drafts = [f"eagle:{a}", f"suffix+eagle:{a}", f"eagle:{a},topk=3,depth=3", f"eagle:{c}"]
    loads: list[str] = []
    built: list[str] = []
    captured: dict[str, Any] = {}
    load_head, make_drafter = eagle_module.load_head, speculation_module.make_drafter

    def recording_load(folder: Any, **kwargs: Any) -> Any:
        loads.append(str(folder))
        return load_head(folder, **kwargs)

    def recording_make(spec: Any, model: Any, **kwargs: Any) -> Any:
        slot = getattr(model.runtime, "slot", None)  # a batched worker's slot, or None
        built.append(str(spec) if slot is None else f"{spec} in slot {slot}")
        return make_drafter(spec, model, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eagle_module, "load_head", recording_load)
        mp.setattr(speculation_module, "make_drafter", recording_make)
        mp.setattr("uvicorn.run", lambda app, **kw: captured.update(app=app, **kw))
        mp.setattr("draftwise.cli.serve._setup_logging", lambda level: None)  # no handler on the runner's stderr
        mp.setitem(threads_module._state, "pinned", threads_module._state["pinned"])  # --threads pins it; restored
        res = CliRunner().invoke(cli, ["serve", "--model", str(tiny_chat_folder), "--threads", "1", "--draft", "lookup",
                                       "--k", str(K), "--allow-draft", ",".join(drafts), "--max-tokens-cap", "48",
                                       # the statistics below are a fresh library drafter's: with a cached
                                       # prefix a head starts at the copy's end (tests/test_engine_eagle.py)
                                       "--prefix-cache-mb", "0"])
        assert res.exit_code == 0, res.output
        app = captured["app"]
        with LiveServer(app) as server:
            yield Served(server, app, a, c, b, ["none", "lookup", *drafts], loads, built, (list(loads), list(built)),
                         res.output)
            assert app.state.worker.alive


def post(served: Served, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(served.server.url + path, json=body, timeout=60)


def request(prompt_kind: str, draft: str | None, **extra: Any) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"max_tokens": N, "temperature": 0, "return_token_ids": True, **extra}
    if draft is not None:
        body["speculative"] = {"draft": draft}
    if prompt_kind == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": CHAT}]}
    return "/v1/completions", {**body, "prompt": TEXT}


def text_of(body: dict[str, Any]) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def reference(model: Any, prompt_kind: str, draft: str | None = None) -> Any:
    chat = prompt_kind == "chat"
    return generate(model, CHAT if chat else TEXT, max_new_tokens=N, chat=chat, draft=draft, k=K)


def test_the_server_loaded_the_allowed_heads_at_start_up_and_nothing_else(served):
    loads, built = served.at_start
    assert list(served.app.state.worker.speculation.allowed) == served.allowed
    # one drafter per allowed draft, made at start-up, and for the hybrid, whose suffix part learns
    # across requests, one without its cache for seeded sampled requests (speculation.without_learning);
    # then the same in each of the batched worker's slots (each generation its own head state)
    alone = [*served.allowed, f"suffix:cache=0+eagle:{served.a}"]
    slots = served.app.state.worker.max_batch
    assert slots == DEFAULT_MAX_BATCH > 1  # EAGLE drafts batch
    assert [b for b in built if " in slot " not in b] == alone
    assert sorted(b for b in built if " in slot " in b) == sorted(f"{d} in slot {s}" for s in range(slots) for d in alone)
    # eagle:A, the hybrid's head and the tree share head A's one load (drafters of one head share
    # its weights, in every slot), then eagle:C
    assert loads == [str(served.a), str(served.c)]


def test_the_start_up_line_says_eagle_drafts_batch(served):
    line = " ".join(served.output.split())  # as one line, however the terminal wrapped it
    assert f"max batch {DEFAULT_MAX_BATCH}, KV cache" in line
    assert "prefix cache off; requests may name" in line


OTHER = {"text": "chat", "chat": "text"}


@pytest.mark.parametrize("prompt_kind", ["text", "chat"])
@pytest.mark.parametrize("which", ["eagle", "eagle-tree", "eagle3"])
def test_an_allowed_eagle_draft_equals_plain_generate_with_the_librarys_statistics(tiny, served, which, prompt_kind):
    a, c = served.a, served.c
    draft = {"eagle": f"eagle:{a}", "eagle-tree": f"eagle:{a},topk=3,depth=3", "eagle3": f"eagle:{c}"}[which]
    other_head = f"eagle:{c}" if which != "eagle3" else f"eagle:{a}"
    plain = reference(tiny, prompt_kind)
    library = reference(tiny, prompt_kind, draft)  # a fresh drafter of the same head, in this process
    assert library.token_ids == plain.token_ids and len(plain.token_ids) == N
    # the server keeps one drafter per draft: before each checked request, the same drafter or
    # another head ran on another prompt, plain and lookup decoding ran on this one
    runs = [(prompt_kind, None), (OTHER[prompt_kind], draft), (prompt_kind, draft), (prompt_kind, "none"),
            (OTHER[prompt_kind], other_head), (prompt_kind, "lookup"), (prompt_kind, draft)]
    for kind, name in runs:
        path, body = request(kind, name)
        r = post(served, path, body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["choices"][0]["finish_reason"] == "length" and got["usage"]["completion_tokens"] == N
        spec = got["speculative"]
        assert spec["draft"] == (name or "lookup")
        if kind != prompt_kind:
            continue
        assert got["choices"][0]["token_ids"] == plain.token_ids
        assert text_of(got) == plain.text
        if name != draft:
            continue
        assert (spec["k"], spec["chosen_by"]) == (K, "request")
        assert {key: spec[key] for key in STATS} == {key: getattr(library.stats, key) for key in STATS}
        if which == "eagle3":  # a random head: it proposes every step, and nothing is accepted
            assert spec["proposed"] > N and (spec["accepted"], spec["target_passes"]) == (0, N)
        else:
            assert 0 < spec["accepted"] < spec["proposed"]  # some accepted, some not: equality is earned
        assert got["timings"]["draft_n"] == spec["proposed"] and got["timings"]["draft_n_accepted"] == spec["accepted"]


@pytest.mark.parametrize("prompt_kind", ["text", "chat"])
def test_the_suffix_eagle_hybrid_equals_plain_generate_and_learns_across_requests(tiny, served, prompt_kind):
    draft = f"suffix+eagle:{served.a}"
    plain = reference(tiny, prompt_kind)
    path, body = request(prompt_kind, draft)
    runs = []
    for _ in range(2):
        r = post(served, path, body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["choices"][0]["token_ids"] == plain.token_ids and text_of(got) == plain.text
        spec = got["speculative"]
        assert (spec["draft"], spec["k"], spec["chosen_by"]) == (draft, K, "request")
        assert spec["proposed"] > 0 and spec["committed"] == N
        runs.append(spec)
    # the server's hybrid keeps its suffix cache across requests: the repeated answer is copied
    # (measured: text 15 accepted in 25 passes, then 31 in 9; chat 24 in 16, then 30 in 10)
    assert runs[1]["accepted"] > runs[0]["accepted"]
    assert runs[1]["target_passes"] < runs[0]["target_passes"]
    assert runs[0]["target_passes"] + runs[0]["accepted"] == runs[1]["target_passes"] + runs[1]["accepted"] == N


def _clip(text: str) -> str:  # how an error message quotes a client's spec (cut at 60 characters)
    return repr(text if len(text) <= 60 else text[:60] + "...")


@pytest.mark.parametrize("which", ["b", "b-hybrid", "b-tree", "etc", "etc-hybrid", "a-to-b", "a-other-options"])
def test_a_head_the_server_was_not_started_with_gets_400_and_is_never_loaded(served, which):
    a, b = served.a, served.b
    draft = {"b": f"eagle:{b}", "b-hybrid": f"suffix+eagle:{b}", "b-tree": f"eagle:{b},topk=3,depth=3",
             "etc": "eagle:/etc", "etc-hybrid": "suffix+eagle:/etc", "a-to-b": f"eagle:{a}/../{b.name}",
             "a-other-options": f"eagle:{a},topk=4"}[which]
    loads, built = len(served.loads), len(served.built)
    message = (f"the draft {_clip(draft)} is not one this server runs; allowed: {', '.join(served.allowed)} "
               "(the server's operator adds drafts with --allow-draft)")
    for prompt_kind in ("text", "chat"):
        for stream in (False, True):
            path, body = request(prompt_kind, draft, stream=stream)
            r = post(served, path, body)
            assert r.status_code == 400, r.text
            assert r.json()["error"] == {"message": message, "type": "invalid_request_error",
                                         "param": "speculative.draft", "code": "draft_not_allowed"}
    assert served.loads[loads:] == [] and served.built[built:] == []  # nothing loaded or built for it
    assert str(b) not in served.loads and "/etc" not in served.loads


def _sse(served: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one streamed response, checked to be SSE ``data:`` lines ending ``[DONE]``."""
    with httpx.stream("POST", served.server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.strip()]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    return [json.loads(line[6:]) for line in lines[:-1]]


@pytest.mark.parametrize("prompt_kind", ["text", "chat"])
def test_streaming_with_the_eagle_draft_equals_the_whole_response(tiny, served, prompt_kind):
    draft = f"eagle:{served.a}"
    path, body = request(prompt_kind, draft)
    r = post(served, path, body)
    assert r.status_code == 200, r.text
    whole = r.json()
    plain = reference(tiny, prompt_kind)
    assert whole["choices"][0]["token_ids"] == plain.token_ids
    chunks = _sse(served, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    content = [c for c in chunks if c["choices"]]
    if prompt_kind == "chat":
        assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        pieces = [c["choices"][0]["delta"].get("content", "") for c in content]
    else:
        pieces = [c["choices"][0]["text"] for c in content]
    assert "".join(pieces) == text_of(whole) == plain.text
    assert sum(1 for p in pieces if p) > 3  # streamed in pieces, not in one chunk
    final, usage = content[-1], chunks[-1]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert final["choices"][0]["token_ids"] == plain.token_ids
    assert final["speculative"]["draft"] == draft
    assert {key: final["speculative"][key] for key in STATS} == {key: whole["speculative"][key] for key in STATS}
    assert final["speculative"]["proposed"] > 0
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"] != whole["id"]
