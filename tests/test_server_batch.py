"""`draftwise serve --max-batch N`: continuous batching, end to end with the real `openai` client.

Every response equals the same request run alone (greedy, and sampled with a seed), whatever else
shares its passes; a client that hangs up frees its slot; /metrics counts the batch."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from draftwise import SamplingConfig, generate, load_model  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

PROMPTS = ["Count to five and back: one two three", "List the colours: red green blue red green",
           "Say hello", "a b c d e f g a b c d", "The numbers: 1 2 3 4 5 1 2 3", "Write about the sea"]
SPECS: list[dict[str, Any] | None] = [None, {"draft": "none"}, {"draft": "lookup", "k": 2}, {"draft": "suffix", "k": 5}]


@pytest.fixture(scope="module")
def reference(tiny_chat_folder: Any, one_thread: None) -> Any:
    return load_model(str(tiny_chat_folder))


@pytest.fixture(scope="module")
def batched(tiny_chat_folder: Any, one_thread: None) -> Any:
    model = load_model(str(tiny_chat_folder))  # its own: the engine splits its cache into slots
    spec = Speculation(model, draft="lookup", k=4, plan=None, allow=["suffix"])
    app = create_app(model, spec, ServerSettings(model_name="tiny", max_tokens_cap=256, max_batch=4,
                                                 prefill_chunk=8, context=160))
    with LiveServer(app) as server:
        yield app, server, openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def run_all(jobs: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(jobs)

    def go(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_greedy_responses_equal_each_request_alone(reference: Any, batched: Any) -> None:
    app, _, c = batched
    cases = [(p, s) for p in PROMPTS for s in SPECS[:3]] + [(PROMPTS[0], SPECS[3]), (PROMPTS[3], SPECS[3])]
    want = [generate(reference, p, max_new_tokens=40).token_ids for p, _ in cases]

    def job(prompt: str, spec: dict[str, Any] | None) -> Any:
        body = {"return_token_ids": True, **({"speculative": spec} if spec else {})}
        return lambda: c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                 temperature=0, max_tokens=40, extra_body=body)

    got = run_all([job(p, s) for p, s in cases])
    assert [r.choices[0].token_ids for r in got] == want
    metrics = httpx.get(str(c.base_url).replace("/v1/", "/metrics")).text
    sizes = [line for line in metrics.splitlines() if line.startswith("draftwise:batch_size_count")]
    assert sizes and float(sizes[0].split()[-1]) > 0
    assert "draftwise:tokens_per_pass_bucket" in metrics
    assert app.state.worker.engine.stats.batch_sizes and max(app.state.worker.engine.stats.batch_sizes) > 1


def test_the_worker_says_how_much_of_its_stepping_was_passes(batched: Any, caplog: Any) -> None:
    """When the batch empties, one line: passes, their seconds, and the seconds stepping around them."""
    _, _, c = batched
    with caplog.at_level("INFO", logger="draftwise.server"):
        run_all([lambda p=p: c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                                         temperature=0, max_tokens=12) for p in PROMPTS[:3]])
        for _ in range(100):  # the line follows the step that ended the last request
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: ")]
            if lines:
                break
            time.sleep(0.02)
    assert lines, "no engine line after the batch emptied"
    passes, in_passes, stepping = (float(x) for x in re.findall(r"[\d.]+", lines[-1]))
    assert passes >= 12 and 0 < in_passes <= stepping


def test_sampled_with_a_seed_is_the_same_alone_and_batched(reference: Any, batched: Any) -> None:
    _, _, c = batched
    seeds = list(range(8))
    want = [generate(reference, PROMPTS[i % 6], max_new_tokens=24,
                     sampling=SamplingConfig(temperature=0.9, seed=s), draft="lookup", k=4).token_ids
            for i, s in enumerate(seeds)]
    got = run_all([
        (lambda i=i, s=s: c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPTS[i % 6]}], temperature=0.9, seed=s,
            max_tokens=24, extra_body={"return_token_ids": True}))
        for i, s in enumerate(seeds)
    ])
    assert [r.choices[0].token_ids for r in got] == want


def test_a_seeded_sample_with_the_suffix_draft_is_reproduced_batched(reference: Any, batched: Any) -> None:
    """The server's suffix cache learns every answer (its own first one included), so a seeded
    request drafts from its own prompt and output: the same tokens again, beside others, and the
    library's with a fresh suffix drafter."""
    _, _, c = batched

    def ask(prompt: str, seed: int | None) -> Any:
        return lambda: c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], temperature=0.9, seed=seed, max_tokens=24,
            extra_body={"return_token_ids": True, "speculative": {"draft": "suffix", "k": 5}})

    first = ask(PROMPTS[4], 11)()
    others = run_all([ask(PROMPTS[4], None), ask(PROMPTS[3], 12), ask(PROMPTS[4], 11), ask(PROMPTS[0], None)])
    again = ask(PROMPTS[4], 11)()
    want = generate(reference, PROMPTS[4], max_new_tokens=24, sampling=SamplingConfig(temperature=0.9, seed=11),
                    draft="suffix", k=5).token_ids
    assert first.choices[0].token_ids == others[2].choices[0].token_ids == again.choices[0].token_ids == want


def test_a_client_that_hangs_up_frees_its_slot(batched: Any) -> None:
    app, _, c = batched
    worker = app.state.worker
    stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[5]}],
                                       max_tokens=64, temperature=0, stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 10
    while worker.engine.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.engine.running == 0 and worker.engine.free == 4


def test_a_request_that_does_not_fit_its_slot_is_refused(batched: Any) -> None:
    _, _, c = batched
    with pytest.raises(openai.BadRequestError, match="context of 160 tokens"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x " * 200}], max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="context of 160 tokens"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}], max_tokens=150)
