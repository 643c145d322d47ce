"""`serve --k auto --max-batch N`: the goodput policy chooses every decoding request's k each
step from the batch as it is (the batch profile read at start-up), responses stay those of each
request alone, and /metrics shows the k's; without a batch profile, each request keeps its own
adaptive k and the log says how to make one."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from draftwise import generate, load_model  # noqa: E402
from draftwise.core.engine import PassRows  # noqa: E402
from draftwise.policy.batch import BatchSlotPolicy  # noqa: E402
from draftwise.errors import ConfigError  # noqa: E402
from draftwise.server.app import ServerSettings, create_app  # noqa: E402
from draftwise.server.live import LiveServer  # noqa: E402
from draftwise.server.speculation import Speculation  # noqa: E402

from .test_goodput_policy import KNEE4, Costs, knee_profile  # noqa: E402
from .test_server_batch import run_all  # noqa: E402

PROMPTS = ["Count to five and back: one two three", "List the colours: red green blue red green",
           "a b c d e f g a b c d", "The numbers: 1 2 3 4 5 1 2 3"]


@pytest.fixture()
def slow_model(tiny_chat_folder: Any, one_thread: None) -> Any:
    """A fresh tiny model (the engine splits its cache) whose batched passes take >= 15 ms, so
    concurrent requests share passes."""
    model = load_model(str(tiny_chat_folder))
    forward_batch = model.runtime.forward_batch

    def slow(*a: Any, **kw: Any) -> Any:
        time.sleep(0.015)
        return forward_batch(*a, **kw)

    model.runtime.forward_batch = slow
    return model


def serve(model: Any, monkeypatch: Any, batch_profile: Any, capacity: Any = None) -> tuple[Any, LiveServer]:
    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: Costs())

    def load(self: Speculation) -> Any:
        if batch_profile is None:
            raise ConfigError("no batch profile at /nowhere/tiny-batch.json")
        return batch_profile

    monkeypatch.setattr(Speculation, "_load_batch_profile", load)
    spec = Speculation(model, draft="lookup", k="auto", plan=None, allow=["suffix"], capacity=capacity)
    app = create_app(model, spec, ServerSettings(model_name="tiny", max_tokens_cap=64, max_batch=4,
                                                 prefill_chunk=8, context=160))
    return app, LiveServer(app)


def ask_all(server: LiveServer, cases: list[tuple[str, dict[str, Any], int]]) -> list[Any]:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    return run_all([
        (lambda p=p, spec=spec, n=n: c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": p}], temperature=0, max_tokens=n,
            extra_body={"return_token_ids": True, "speculative": spec}))
        for p, spec, n in cases
    ])


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_k_auto_at_batch_follows_the_goodput_of_the_batch(slow_model: Any, tiny: Any, monkeypatch: Any) -> None:
    app, server = serve(slow_model, monkeypatch, KNEE4)  # a pass flat to 4 rows, then steep
    cases = [(p, {"draft": d, "k": "auto"}, n) for p, d, n in
             zip(PROMPTS, ["suffix", "lookup", "suffix", "lookup"], [16, 24, 32, 40])]
    with server:
        coord = app.state.worker.speculation.coordinator
        assert coord is not None  # the batch profile was read at start-up
        seen: list[tuple[int, int, int, list[int]]] = []
        choose = coord.goodput.choose

        def spy(states: Any, *, prefill_rows: int = 0, prefilling: int = 0) -> list[int]:
            ks = choose(states, prefill_rows=prefill_rows, prefilling=prefilling)
            seen.append((len(states), prefill_rows, prefilling, list(ks)))
            return ks

        monkeypatch.setattr(coord.goodput, "choose", spy)
        got = ask_all(server, cases)
        text = httpx.get(server.url + "/metrics").text
    want = [generate(tiny, p, max_new_tokens=n).token_ids for p, _, n in cases]
    assert [r.choices[0].token_ids for r in got] == want
    assert max(n for n, *_ in seen) >= 2, seen  # requests shared passes, and chose together
    full = [ks for n, rows, _, ks in seen if n + rows >= 4]
    assert full and all(ks == [0] * len(ks) for ks in full)  # the flat part of the pass is taken: plain
    roomy = [ks for n, rows, _, ks in seen if n == 2 and rows == 0]
    assert all(sum(ks) == 2 for ks in roomy)  # two rows of room: spent on proposals
    assert metric(text, "draftwise:spec_decode_num_plain_choices_total") > 0
    assert metric(text, "draftwise:spec_decode_chosen_k_count") > metric(text, "draftwise:spec_decode_num_plain_choices_total")
    outside = coord.goodput.outside  # the worker told the policy what each step cost outside its pass
    assert outside is not None and outside.steps >= len(seen) // 2 and all(x >= 0 for x in outside.estimate())
    assert coord.goodput.cost.per_sequence == outside.estimate()
    assert coord.goodput.factors() and set(coord.goodput.factors()) <= {"suffix", "lookup"}


def test_the_policy_prices_a_prompt_s_chunk_at_the_profile_s_share(slow_model: Any, monkeypatch: Any) -> None:
    """The engine tells its scheduler the coming pass's plain rows, prompt rows and sequences; the
    prompt rows (no logits) count at the batch profile's prompt_share."""
    import dataclasses
    from types import SimpleNamespace

    monkeypatch.setattr(Speculation, "_resolve_profile", lambda self, drafts: Costs())
    monkeypatch.setattr(Speculation, "_load_batch_profile", lambda self: dataclasses.replace(KNEE4, prompt_share=0.5))
    spec = Speculation(slow_model, draft="lookup", k="auto", plan=None)
    spec.warm_up()
    engine = SimpleNamespace(max_batch=4, scheduler=None, wait_for_schedule=lambda member: None)
    spec.follow_batch(engine)
    assert spec.coordinator is not None and engine.scheduler is spec.coordinator
    assert spec.coordinator.price(PassRows(decode_rows=3, prompt_rows=16, sequences=4)) == 11.0


def test_without_a_batch_profile_each_request_keeps_its_own_adaptive_k(
        slow_model: Any, tiny: Any, monkeypatch: Any, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="draftwise.server")
    logger = logging.getLogger("draftwise.server")  # the CLI stops it propagating; listen to it directly
    logger.addHandler(caplog.handler)
    try:
        app, server = serve(slow_model, monkeypatch, None)
        app.state.worker.warm_up()  # as `draftwise serve` does before the server's start-up does it again
        check_own_adaptive_k(app, server, tiny, monkeypatch)
    finally:
        logger.removeHandler(caplog.handler)
    # once (the logger's handler and the root's may both hold a record: count records, not lines)
    line = list({r: r.getMessage() for r in caplog.records if "k=auto at batch" in r.getMessage()}.values())
    assert len(line) == 1 and "no batch profile" in line[0] and "draftwise plan --concurrency" in line[0]


def test_a_seeded_sampled_request_adapts_its_own_k_beside_the_batch(slow_model: Any, monkeypatch: Any) -> None:
    """The goodput policy chooses k from the batch as it is, which would make a seeded sample
    depend on what else ran: a seeded sampled request keeps its own adaptive k (docs/contract.md)."""
    app, server = serve(slow_model, monkeypatch, KNEE4)
    built: list[Any] = []
    build = Speculation.build

    def spy(self: Speculation, choice: Any, slot: Any = None) -> Any:
        drafter, k = build(self, choice, slot)
        built.append((choice.isolated, k))
        return drafter, k

    monkeypatch.setattr(Speculation, "build", spy)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def ask(seed: int | None) -> Any:
        return c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}],
                                         temperature=0.9, seed=seed, max_tokens=16,
                                         extra_body={"return_token_ids": True, "speculative": {"draft": "suffix"}})

    with server:
        assert app.state.worker.speculation.coordinator is not None
        alone = ask(3)
        run_all([lambda: ask(None), lambda: ask(4), lambda: ask(None)])
        again = ask(3)
    assert alone.choices[0].token_ids == again.choices[0].token_ids
    assert {type(k).__name__ for isolated, k in built if isolated} == {"AdaptiveK"}
    assert {type(k).__name__ for isolated, k in built if not isolated} == {"BatchSlotPolicy"}


def check_own_adaptive_k(app: Any, server: LiveServer, tiny: Any, monkeypatch: Any) -> None:
    built: list[Any] = []
    build = Speculation.build

    def spy(self: Speculation, choice: Any, slot: Any = None) -> Any:
        drafter, k = build(self, choice, slot)
        built.append(k)
        return drafter, k

    monkeypatch.setattr(Speculation, "build", spy)
    with server:
        assert app.state.worker.speculation.coordinator is None
        got = ask_all(server, [(PROMPTS[0], {"k": "auto"}, 20), (PROMPTS[2], {"k": "auto"}, 20)])
    assert [r.choices[0].token_ids for r in got] == [generate(tiny, p, max_new_tokens=20).token_ids
                                                     for p in (PROMPTS[0], PROMPTS[2])]
    assert built and not any(isinstance(k, BatchSlotPolicy) for k in built)


def test_past_the_plan_s_speculating_limit_the_server_batches_plain(slow_model: Any, tiny: Any, monkeypatch: Any) -> None:
    roomy = knee_profile(64, 0.05)  # flat to 64 rows: the policy alone would propose in every pass
    roomy.created = "2026-12-05T17:44:49"
    rows = [{"n": n, "policies": {"goodput": {"vs_plain_interval": [lo, 1.5]}}} for n, lo in [(1, 1.3), (2, 0.97)]]
    capacity = {"model": roomy.model, "batch_profile_created": roomy.created, "rows": rows, "source": "test"}
    app, server = serve(slow_model, monkeypatch, roomy, capacity)
    cases = [(p, {"draft": "lookup", "k": "auto"}, 24) for p in PROMPTS]
    with server:
        coord = app.state.worker.speculation.coordinator
        assert coord is not None and coord.goodput.speculate_up_to == 1
        seen: list[tuple[int, int, list[int]]] = []
        choose = coord.goodput.choose

        def spy(states: Any, *, prefill_rows: int = 0, prefilling: int = 0) -> list[int]:
            ks = choose(states, prefill_rows=prefill_rows, prefilling=prefilling)
            seen.append((len(states), prefilling, list(ks)))
            return ks

        monkeypatch.setattr(coord.goodput, "choose", spy)
        got = ask_all(server, cases)
    assert [r.choices[0].token_ids for r in got] == [generate(tiny, p, max_new_tokens=24).token_ids for p, _, _ in cases]
    # two or more in the batch: plain steps for real, the schedule not even asked (nor a draft made)
    assert all(n + pre < 2 or ks == [0] * n for n, pre, ks in seen), seen
    assert max(app.state.worker.engine.stats.batch_sizes) >= 2 and not any(n >= 2 for n, _, _ in seen)


def test_a_concurrency_prediction_from_another_batch_profile_is_not_used(slow_model: Any, monkeypatch: Any,
                                                                         caplog: Any) -> None:
    capacity = {"model": KNEE4.model, "batch_profile_created": "another", "rows": [], "source": "test"}
    app, server = serve(slow_model, monkeypatch, KNEE4, capacity)
    with caplog.at_level(logging.WARNING, logger="draftwise.server"), server:
        assert app.state.worker.speculation.coordinator.goodput.speculate_up_to is None
    assert "not using the concurrency prediction" in caplog.text
