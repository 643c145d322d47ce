"""`draftwise serve` on the real default model (SmolLM2-135M): greedy through the server, with
speculation on, equals `draftwise generate` token for token, streamed or not."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from typer.testing import CliRunner  # noqa: E402

from draftwise.cli import app as cli  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

PROMPT = "Repeat this list twice: apples, pears, plums, cherries."


@pytest.mark.real_model
def test_real_model_greedy_through_the_server_equals_draftwise_generate(default_model, cli_shares_default_model):
    done = CliRunner().invoke(cli, ["generate", PROMPT, "-n", "48", "--json"])
    assert done.exit_code == 0, done.output
    assert cli_shares_default_model == ["default"]
    ref = json.loads(done.stdout.strip().splitlines()[-1])
    app = create_app(default_model, Speculation(default_model, draft="lookup", k=4, plan=None),
                     ServerSettings(model_name="default", max_tokens_cap=64))
    with LiveServer(app) as server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        args = dict(model="default", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=48)
        r = c.chat.completions.create(**args, extra_body={"return_token_ids": True})
        chunks = list(c.chat.completions.create(**args, stream=True))
    assert r.choices[0].token_ids == ref["token_ids"]
    assert r.choices[0].message.content == ref["text"]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ref["text"]
    spec = r.speculative
    assert spec["draft"] == "lookup" and spec["accepted"] > 0  # the list repeats: lookup hits
    assert spec["mean_committed_per_pass"] > 1.0
