"""Requests that arrive together with one new prompt start: one prefills it, the others wait a
step at a time until its blocks are cached and reuse them (``PrefixCache.in_flight``,
``Engine.wait_step``), with the answers they get alone."""

from __future__ import annotations

from typing import Any

import pytest

from draftwise import load_model
from draftwise.core import decode
from draftwise.core.engine import Engine
from draftwise.runtime.prefix_cache import PrefixCache

N = 6


@pytest.fixture(scope="module")
def model(tiny_chat_folder: Any, one_thread: Any) -> Any:
    return load_model(str(tiny_chat_folder))


def _prompts(model: Any) -> tuple[list[int], list[list[int]]]:
    shared = model.encode_prompt("one two three four five six seven eight nine ten " * 6, chat=False)
    tails = [model.encode_prompt(f" question {i}: what follows {i}?", chat=False) for i in range(4)]
    return shared, [shared + t for t in tails]


def _run(engine: Engine, prompts: list[list[int]], cache: PrefixCache | None) -> list[Any]:
    results: dict[int, Any] = {}
    todo = list(range(len(prompts)))

    def job(i: int) -> Any:
        def run(slot_model: Any) -> None:
            results[i] = decode.generate(slot_model, prompts[i], max_new_tokens=N, prefix_cache=cache)
        return run

    engine.run(lambda free, idle: [job(todo.pop(0)) for _ in range(min(free, len(todo)))] if todo else None)
    return [results[i] for i in range(len(prompts))]


def test_requests_that_arrive_together_prefill_their_shared_start_once(model: Any) -> None:
    shared, prompts = _prompts(model)
    assert len(shared) >= 64
    alone = [decode.generate(model, p, max_new_tokens=N).token_ids for p in prompts]
    engine = Engine(model, max_batch=4, context=512)
    without = _run(engine, prompts, None)
    rows_without = engine.stats.rows
    engine = Engine(model, max_batch=4, context=512)
    cache = PrefixCache(max_bytes=16 << 20)
    got = _run(engine, prompts, cache)
    assert [r.token_ids for r in got] == [r.token_ids for r in without] == alone
    cached = sorted(r.cached_tokens for r in got)
    whole = len(shared) // cache.block_tokens * cache.block_tokens
    assert cached[0] == 0 and all(c >= whole for c in cached[1:])  # one prefilled it, three reused it
    assert rows_without - engine.stats.rows >= 3 * whole  # the shared start's rows ran once, not four times


def test_a_prompt_that_shares_little_does_not_wait(model: Any) -> None:
    cache = PrefixCache(max_bytes=16 << 20)
    ids = list(range(10, 90))
    ticket = cache.prefilling(ids)
    assert cache.in_flight(ids[:40] + [5] * 40)  # two whole blocks more than the cache holds
    assert not cache.in_flight(ids[:20] + [5] * 60)  # one block: prefilling it beats waiting
    assert not cache.in_flight([5] + ids[1:])  # shares nothing from the start
    cache.done(ticket)
    assert not cache.in_flight(ids)
