"""`draftwise serve`'s options as an operator gives them: each out-of-range number refused in one
line naming that option alone; --k over --max-k refused before the model loads; --context held at
every batch size, reported as /v1/models' max_model_len, and refused over the model's maximum."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from typer.testing import CliRunner  # noqa: E402

from draftwise.cli import app as cli  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402

NUMERIC = ["--max-batch", "--prefill-chunk", "--context", "--port", "--max-queue", "--max-tokens-cap",
           "--max-body-bytes", "--max-k", "--request-timeout", "--threads"]


def invoke(args: list[str], monkeypatch: Any, *, load: bool = False) -> Any:
    """``draftwise serve ARGS``; the app it would serve in ``result.app`` (uvicorn is not run)."""
    captured: dict[str, Any] = {}
    if not load:
        monkeypatch.setattr("draftwise.cli.serve.load_with_status", lambda *a, **kw: pytest.fail("the model loaded"))
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: captured.update(app=app))
    monkeypatch.setattr("draftwise.cli.serve._setup_logging", lambda level: None)  # no handler on the runner's stderr
    result = CliRunner().invoke(cli, ["serve", *args])
    result.app = captured.get("app")
    return result


@pytest.mark.parametrize("option, value", [
    ("--max-batch", "0"), ("--prefill-chunk", "0"), ("--context", "0"), ("--port", "0"), ("--port", "65536"),
    ("--max-queue", "0"), ("--max-tokens-cap", "0"), ("--max-body-bytes", "10"), ("--max-k", "0"),
    ("--request-timeout", "0"), ("--request-timeout", "nan"), ("--threads", "0"),
])
def test_an_out_of_range_number_is_refused_naming_its_option_alone(monkeypatch: Any, option: str, value: str) -> None:
    res = invoke([option, value], monkeypatch)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # as one line, however the terminal wrapped it
    assert option in text
    assert [o for o in NUMERIC if o in text.replace(option, "")] == [], text


def test_k_over_max_k_is_refused_before_the_model_loads(monkeypatch: Any) -> None:
    res = invoke(["--k", "32"], monkeypatch)
    assert res.exit_code == 2 and res.output.strip() == "error: --k 32 is over --max-k 16; lower --k or raise --max-k"
    assert invoke(["--k", "8", "--max-k", "4"], monkeypatch).output.strip() == (
        "error: --k 8 is over --max-k 4; lower --k or raise --max-k")


def test_a_context_over_the_models_maximum_is_refused(tiny_chat_folder: Any, one_thread: None,
                                                      monkeypatch: Any) -> None:
    res = invoke(["--model", str(tiny_chat_folder), "--context", "1000000000"], monkeypatch, load=True)
    assert res.exit_code == 2 and res.app is None, res.output
    line = " ".join(res.output.split())
    assert line.endswith("error: --context 1000000000 is over this model's maximum of 512 positions; "
                         "pass --context 512 or less"), line


@pytest.mark.parametrize("max_batch", ["1", "2"])
def test_the_context_holds_at_every_batch_size(tiny_chat_folder: Any, one_thread: None, monkeypatch: Any,
                                               max_batch: str) -> None:
    res = invoke(["--model", str(tiny_chat_folder), "--max-batch", max_batch, "--context", "64"], monkeypatch,
                 load=True)
    assert res.exit_code == 0, res.output
    assert "context 64, max batch " + max_batch in " ".join(res.output.split())
    assert "(draft suffix, k=auto," in " ".join(res.output.split())  # speculating by default, batched too
    with LiveServer(res.app) as server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        served = c.models.list().data[0]
        assert served.max_model_len == 64
        for prompt, max_tokens in [([5] * 80, 4), ([5] * 40, 30)]:  # the prompt, or the prompt and its answer
            with pytest.raises(openai.BadRequestError, match="context of 64 tokens") as info:
                c.completions.create(model=served.id, prompt=prompt, max_tokens=max_tokens)
            assert info.value.body["code"] == "context_length_exceeded"
        assert c.completions.create(model=served.id, prompt=[5] * 40, max_tokens=24).usage.completion_tokens <= 24
    default = invoke(["--model", str(tiny_chat_folder), "--max-batch", max_batch], monkeypatch, load=True)
    assert default.exit_code == 0 and default.app.state.worker.context == 512  # the tiny model's, under 4096


def test_what_start_up_built_is_frozen_before_serving(tiny_chat_folder: Any, one_thread: None,
                                                      monkeypatch: Any) -> None:
    """The model, the engine and the drafters live as long as the server: the collector stops
    walking them (``gc.freeze``) once they are built and before the first request is served."""
    order: list[str] = []
    monkeypatch.setattr("gc.freeze", lambda: order.append("freeze"))  # the test process stays as it is
    monkeypatch.setattr("draftwise.server.worker.Worker.warm_up", lambda self: order.append("warm_up"))
    captured: dict[str, Any] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: (order.append("serve"), captured.update(app=app)))
    monkeypatch.setattr("draftwise.cli.serve._setup_logging", lambda level: None)
    res = CliRunner().invoke(cli, ["serve", "--model", str(tiny_chat_folder)])
    assert res.exit_code == 0, res.output
    assert order == ["warm_up", "freeze", "serve"]
