"""What a hostile client (or a careless operator) can do to `draftwise serve`, and what it gets.

- A request may only name drafts the server was started with (``--draft``, the plan's drafts,
  ``--allow-draft``, and ``none``): anything else, ``eagle:/etc`` first, is a 400 listing the
  allowed drafts, and no loader ever runs for it (so no client path is opened, and no loader's
  error tells a client whether a path exists).
- The server's drafters and profile are made at start-up for the allowed drafts only, so they
  are bounded by that list; a request never starts a profile measurement.
- The bad-input table: every row is one request the probe found answered badly (a lone
  surrogate, ``true`` as a number, a draft option invalid for this model, a prompt over the
  context), sent raw, streamed and not, and answered 400 naming its parameter before any
  response starts.
- An empty API key refuses to start instead of turning authentication off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402

from draftwise import generate  # noqa: E402
from draftwise.cli import app as cli  # noqa: E402
from draftwise.drafters.spec import DraftSpec  # noqa: E402
from draftwise.errors import ConfigError  # noqa: E402
from draftwise.server import speculation as speculation_module  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.protocol import Speculative  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

USER = {"role": "user", "content": "Count to five: one two three"}
ALLOWED = "none, lookup, self:exit=2"  # the module server's: --draft lookup --allow-draft self:exit=2
NOT_ALLOWED = f"is not one this server runs; allowed: {ALLOWED} (the server's operator adds drafts with --allow-draft)"
SURROGATE = "holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode; send UTF-8 text"


class Costs:
    """A flat machine profile: the adaptive policy's choices, not the timing, are under test."""

    max_n = 9

    def step_time(self, n: int, context: Any = None) -> float:
        return 0.01 + 0.001 * n

    def draft_time(self, draft: Any, k: int) -> float:
        return 1e-6


@pytest.fixture(scope="class")
def guarded(tiny):
    """A live server (--draft lookup --allow-draft self:exit=2, k=4) whose loaders raise if
    called, and whose every make_drafter call is recorded (per class: the patches end with it)."""
    built: list[str] = []

    def loader(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a loader ran for {args!r}")

    def recording(spec: Any, model: Any) -> Any:
        built.append(str(spec))
        return make_drafter(spec, model)

    make_drafter = speculation_module.make_drafter
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("draftwise.eagle.drafter.load_head", loader)
        mp.setattr("draftwise.drafters.factory.load_model", loader)
        mp.setattr(speculation_module, "make_drafter", recording)
        spec = Speculation(tiny, draft="lookup", k=4, plan=None, allow=["self:exit=2"])
        app = create_app(tiny, spec, ServerSettings(model_name="tiny", max_tokens_cap=48))
        with LiveServer(app) as server:
            yield server, spec, built
            assert app.state.worker.alive


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    """The body as ASCII JSON (a lone surrogate travels as the escape ``\\ud800``, as a client's would)."""
    return httpx.post(server.url + path, content=json.dumps(body), timeout=30,
                      headers={"content-type": "application/json"})


# -- item 1: only the drafts the server was started with ---------------------------------------

CLIENT_DRAFTS = [
    "eagle:/etc", "eagle:/etc,topk=4", "suffix+eagle:/tmp/x", "lookup+eagle:/etc", "model:/x", "model:default",
    "eagle:default", "lookup:max=7", "suffix", "self", "self:exit=999", "self:layers=0-1",
]


def test_the_plans_drafts_and_allow_list_are_allowed_and_canonical():
    from draftwise.planner.plan import Plan

    plan = Plan(model="tiny", fingerprint="", dtype="float32", greedy=True, drafts=["lookup:max=4,min=2"], ks=[2],
                categories={}, recommended={"overall": ("lookup:min=2,max=4", 2), "math": ("none", 0)},
                predicted={"overall": 1.2, "math": 1.0}, routed_overall=1.1)
    spec = Speculation(None, draft="auto", k=4, plan=plan, allow=["suffix:cache=64", "lookup:max=3"])
    assert list(spec.allowed) == ["none", "lookup:max=4,min=2", "suffix", "lookup"]
    assert str(spec.choose(Speculative(draft="suffix")).draft) == "suffix"
    assert str(spec.choose(Speculative(category="coding")).draft) == "lookup:max=4,min=2"
    with pytest.raises(Exception) as info:
        spec.choose(Speculative(draft="eagle:/etc"))
    assert info.value.status == 400 and info.value.param == "speculative.draft"
    assert "allowed: none, lookup:max=4,min=2, suffix, lookup (" in info.value.message


def test_k_auto_profile_is_resolved_at_start_up_for_every_allowed_draft_and_never_in_a_request(tiny, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: calls.append(drafts) or Costs())
    spec = Speculation(tiny, draft="lookup", k="auto", plan=None, allow=["suffix"])
    app = create_app(tiny, spec, ServerSettings(model_name="tiny", max_tokens_cap=48))
    with LiveServer(app) as server:
        assert calls == [["lookup", "suffix"]]  # once, at start-up, for both
        for speculative in [{}, {"draft": "suffix"}, {"draft": "lookup", "k": "auto"}, {"draft": "suffix", "k": 3}]:
            r = post(server, "/v1/completions", {"prompt": "a b c a b c", "max_tokens": 8, "speculative": speculative})
            assert r.status_code == 200, r.text
        r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 8,
                                             "speculative": {"draft": "suffix:nodes=8", "k": "auto"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.draft"
    assert calls == [["lookup", "suffix"]]


def test_a_draft_invalid_for_this_model_stops_the_server_at_start_up(tiny):
    spec = Speculation(tiny, draft="lookup", k=4, plan=None, allow=["self:exit=999"])
    with pytest.raises(ConfigError, match="self:exit=999: layer 999 does not exist; the model has layers 0..2"):
        spec.warm_up()


# -- item 9: the bad-input table -------------------------------------------------------------

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


@dataclass(frozen=True)
class Bad:
    id: str
    path: str
    body: dict[str, Any]  # sent with max_tokens 4 unless it sets its own
    param: str | None
    message: str  # the whole error message, or a phrase of it when partial
    partial: bool = False


BAD = [
    Bad("surrogate-prompt", TEXT, {"prompt": "a\ud800b"}, "prompt", f"invalid 'prompt': {SURROGATE}"),
    Bad("surrogate-prompt-list", TEXT, {"prompt": ["\ud800"]}, "prompt", f"invalid 'prompt': {SURROGATE}"),
    Bad("surrogate-system", CHAT, {"messages": [{"role": "system", "content": "\ud800"}, USER]},
        "messages[0].content", f"invalid 'messages[0].content': {SURROGATE}"),
    Bad("surrogate-user", CHAT, {"messages": [USER, {"role": "assistant", "content": "ok"},
                                              {"role": "user", "content": "x\udfff"}]},
        "messages[2].content", f"invalid 'messages[2].content': {SURROGATE}"),
    Bad("surrogate-text-part", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        "messages[0].content", f"invalid 'messages[0].content': {SURROGATE}"),
    Bad("surrogate-stop", CHAT, {"messages": [USER], "stop": ["\ud800"]}, "stop", f"invalid 'stop': {SURROGATE}"),
    Bad("surrogate-category", TEXT, {"prompt": "x", "speculative": {"category": "\ud800"}}, "speculative.category",
        f"invalid 'speculative.category': {SURROGATE}"),
    Bad("surrogate-model", TEXT, {"prompt": "x", "model": "\ud800"}, "model", f"invalid 'model': {SURROGATE}"),
    Bad("surrogate-field-name", TEXT, {"prompt": "x", "\ud800": 1}, None, f"the body {SURROGATE}"),
    Bad("max-tokens-true", TEXT, {"prompt": "x", "max_tokens": True}, "max_tokens",
        "invalid 'max_tokens': must be a whole number, not a boolean (true)"),
    Bad("max-tokens-false", CHAT, {"messages": [USER], "max_tokens": False}, "max_tokens",
        "invalid 'max_tokens': must be a whole number, not a boolean (false)"),
    Bad("max-completion-tokens-true", CHAT, {"messages": [USER], "max_completion_tokens": True}, "max_completion_tokens",
        "invalid 'max_completion_tokens': must be a whole number, not a boolean (true)"),
    Bad("temperature-true", TEXT, {"prompt": "x", "temperature": True}, "temperature",
        "invalid 'temperature': must be a number, not a boolean (true)"),
    Bad("seed-true", TEXT, {"prompt": "x", "seed": True}, "seed", "invalid 'seed': must be a whole number, not a boolean (true)"),
    Bad("k-true", TEXT, {"prompt": "x", "speculative": {"k": True}}, "speculative.k",
        "invalid 'speculative.k': k=True must be a whole number >= 1 or 'auto'"),
    Bad("self-exit-999", TEXT, {"prompt": "x", "speculative": {"draft": "self:exit=999"}}, "speculative.draft",
        f"the draft 'self:exit=999' {NOT_ALLOWED}"),
    Bad("eagle-etc", CHAT, {"messages": [USER], "speculative": {"draft": "eagle:/etc"}}, "speculative.draft",
        f"the draft 'eagle:/etc' {NOT_ALLOWED}"),
    Bad("k-auto-on-a-fixed-k-server", TEXT, {"prompt": "x", "speculative": {"k": "auto"}}, "speculative.k",
        "k 'auto' is not available on this server: it runs a fixed k (4), so no machine profile was read at "
        "start-up; send a number, or start the server with --k auto"),
    Bad("draft-auto-without-a-plan", TEXT, {"prompt": "x", "speculative": {"draft": "auto"}}, "speculative.draft",
        "this server has no plan", partial=True),
    Bad("prompt-fills-the-context", TEXT, {"prompt": [5] * 512, "max_tokens": None}, "prompt",
        "the prompt has 512 tokens, which leaves no room for an answer in the context of 512 tokens; shorten "
        "the prompt to at most 511 tokens"),
    Bad("prompt-over-the-context", TEXT, {"prompt": [5] * 600, "max_tokens": None}, "prompt",
        "the prompt has 600 tokens, which leaves no room for an answer in the context of 512 tokens; shorten "
        "the prompt to at most 511 tokens"),
    Bad("prompt-plus-max-tokens-over-the-context", TEXT, {"prompt": [5] * 500, "max_tokens": 40}, "max_tokens",
        "the prompt has 500 tokens and max_tokens is 40: more than the context of 512 tokens; shorten the prompt "
        "or lower max_tokens to at most 12"),
]


# -- one guarded server: item 1 and the table -------------------------------------------------


class TestAServerStartedWithLookupAllowingSelfExit2:
    """Requests against one guarded server: drafts it was not started with, and the bad-input table."""

    @pytest.mark.parametrize("draft", CLIENT_DRAFTS)
    def test_a_draft_the_server_was_not_started_with_gets_400_and_no_loader_runs(self, guarded, draft):
        server, spec, built = guarded
        for path, body in [("/v1/chat/completions", {"messages": [USER]}), ("/v1/completions", {"prompt": "one two"})]:
            for stream in (False, True):
                r = post(server, path, {**body, "max_tokens": 4, "stream": stream, "speculative": {"draft": draft}})
                assert r.status_code == 400, r.text
                assert r.json()["error"] == {
                    "message": f"the draft {str(DraftSpec.parse(draft))!r} {NOT_ALLOWED}",
                    "type": "invalid_request_error", "param": "speculative.draft", "code": "draft_not_allowed",
                }
        assert built == ["none", "lookup", "self:exit=2"]  # at start-up, and never for a request

    def test_the_allowed_drafts_run_under_any_spelling_of_their_spec(self, tiny, guarded):
        server, _, built = guarded
        ref = generate(tiny, "one two three four", max_new_tokens=12, chat=False).token_ids
        for draft, canonical in [("lookup:min=1,max=3", "lookup"), ("self:layers=0-1", None), ("self:exit=2", "self:exit=2"),
                                 ("none", "none")]:
            r = post(server, "/v1/completions", {"prompt": "one two three four", "max_tokens": 12, "temperature": 0,
                                                 "return_token_ids": True, "speculative": {"draft": draft}})
            if canonical is None:  # the same layers, another spec: not the one allowed
                assert r.status_code == 400 and r.json()["error"]["code"] == "draft_not_allowed"
                continue
            assert r.status_code == 200, r.text
            assert r.json()["speculative"]["draft"] == canonical
            assert r.json()["choices"][0]["token_ids"] == ref
        assert built == ["none", "lookup", "self:exit=2"]

    def test_drafter_cache_is_bounded_by_the_allowed_list(self, guarded):
        server, spec, built = guarded
        for n in range(4, 40):  # 36 distinct specs a client might send to fill the server's memory
            r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "speculative": {"draft": f"lookup:max={n}"}})
            assert r.status_code == 400
        assert list(spec._drafters) == list(spec.allowed) == ["none", "lookup", "self:exit=2"]
        assert spec._profile is None  # k is fixed: no profile was read, none will be
        assert built == ["none", "lookup", "self:exit=2"]

    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
    @pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
    def test_bad_request_gets_400_naming_its_parameter_before_any_response(self, guarded, case, stream):
        server, _, _ = guarded
        body = {"max_tokens": 4, **case.body, "stream": stream}
        r = post(server, case.path, {k: v for k, v in body.items() if v is not None})
        assert r.status_code == 400, r.text  # never 500, and never 200 with an error event
        assert r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert error["param"] == case.param and error["type"] == "invalid_request_error"
        assert (case.message in error["message"]) if case.partial else error["message"] == case.message
        assert "None" not in error["message"]


# -- the API key -----------------------------------------------------------------------------

EMPTY_KEY = ("error: the API key (--api-key or DRAFTWISE_API_KEY) is empty, which would turn authentication off; "
             "give a key, or unset both to serve without one")


@pytest.mark.parametrize("args, env", [
    (["--api-key", ""], {}),
    (["--api-key", "   "], {}),
    ([], {"DRAFTWISE_API_KEY": ""}),
    ([], {"DRAFTWISE_API_KEY": " \t"}),
], ids=["flag-empty", "flag-blank", "env-empty", "env-blank"])
def test_an_empty_api_key_refuses_to_start_in_one_line(monkeypatch, args, env):
    monkeypatch.delenv("DRAFTWISE_API_KEY", raising=False)
    monkeypatch.setattr("draftwise.cli.serve.load_with_status", lambda *a, **kw: pytest.fail("the model loaded"))
    res = CliRunner().invoke(cli, ["serve", *args], env=env)
    assert res.exit_code == 2, res.output
    assert [line for line in res.output.splitlines() if line.strip()] == [EMPTY_KEY]


def test_server_settings_refuse_an_empty_api_key():
    for key in ("", "  "):
        with pytest.raises(ConfigError, match="the API key is empty"):
            ServerSettings(model_name="tiny", api_key=key)
    assert ServerSettings(model_name="tiny", api_key=None).api_key is None


@pytest.mark.parametrize("allow, phrase", [
    ("self:exit=999", "error: self:exit=999: layer 999 does not exist; the model has layers 0..2"),
    ("auto", "error: --allow-draft takes draft specs; 'auto' is --draft auto"),
    ("lokup", "error: unknown draft spec 'lokup'"),
])
def test_serve_refuses_a_bad_allow_draft_in_one_line_before_serving(tiny_chat_folder, one_thread, monkeypatch,
                                                                     allow, phrase):
    monkeypatch.setattr("uvicorn.run", lambda *a, **kw: pytest.fail("the server started"))
    monkeypatch.setattr("draftwise.cli.serve._setup_logging", lambda level: None)  # no handler on the runner's stderr
    res = CliRunner().invoke(cli, ["serve", "--model", str(tiny_chat_folder), "--allow-draft", allow])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(phrase), res.output
