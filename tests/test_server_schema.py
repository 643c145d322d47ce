"""Fuzz `draftwise serve` from its own OpenAPI schema with schemathesis: valid and invalid
bodies alike must never get a 5xx (a bad request is a 4xx in OpenAI's error schema)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

#: examples per operation and generation mode: enough to hit every refusal path, ~15 s in all
EXAMPLES = 25


def test_no_input_makes_a_server_error(tiny):
    app = create_app(tiny, Speculation(tiny, draft="lookup", k=4, plan=None),
                     ServerSettings(model_name="tiny", max_tokens_cap=8, max_queue=4))
    schema = schemathesis.openapi.from_dict(app.openapi())
    seen: dict[str, set[int]] = {}
    with LiveServer(app) as server:
        for result in schema.get_all_operations():
            op = result.ok()
            for mode in schemathesis.GenerationMode:
                if mode is schemathesis.GenerationMode.NEGATIVE and op.method.upper() == "GET":
                    continue  # nothing to make invalid: no parameters, no body

                @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
                @given(case=op.as_strategy(generation_mode=mode))
                def check(case):
                    response = case.call(base_url=server.url, timeout=20)
                    assert response.status_code < 500, (case.body, response.text)
                    if response.status_code >= 400 and op.path.startswith("/v1/"):
                        error = response.json()["error"]
                        assert set(error) == {"message", "type", "param", "code"}
                    seen.setdefault(op.label, set()).add(response.status_code)

                check()
        assert app.state.worker.alive
    # the fuzzing reached the model, not only the validator
    assert 200 in seen["POST /v1/chat/completions"] and 200 in seen["POST /v1/completions"]
    assert 400 in seen["POST /v1/chat/completions"]
