"""Speculation is on by default (issue 73, item 4): `draftwise generate`, `draftwise serve` and the
library run the measured winner, suffix decoding with the adaptive k, unless told `none`.

These fail if a default goes back to plain decoding or to a fixed k; they load only the tiny
random model (the first `auto` call measures its profile in the test run's own cache)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import draftwise
from draftwise import api
from draftwise.cli.generate import generate as generate_cmd
from draftwise.cli.serve import serve as serve_cmd

WINNER = ("suffix", "auto")


def _defaults(fn: Any) -> tuple[Any, Any]:
    params = inspect.signature(fn).parameters
    return params["draft"].default, params["k"].default


@pytest.mark.parametrize("fn", [api.generate, api.stream, api.Conversation, draftwise.generate, draftwise.stream,
                                draftwise.Conversation, generate_cmd, serve_cmd],
                         ids=["api.generate", "api.stream", "api.Conversation", "draftwise.generate",
                              "draftwise.stream", "draftwise.Conversation", "cli generate", "cli serve"])
def test_every_entry_point_defaults_to_suffix_with_k_auto(fn: Any) -> None:
    assert _defaults(fn) == WINNER


def test_the_library_speculates_by_default_and_none_or_None_is_plain(tiny: Any) -> None:
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    fast = draftwise.generate(tiny, prompt, max_new_tokens=12)
    assert (fast.draft, fast.k) == WINNER
    for plain_draft in ("none", None):
        plain = draftwise.generate(tiny, prompt, max_new_tokens=12, draft=plain_draft)
        assert (plain.draft, plain.k) == ("none", 0)
        assert plain.stats.proposed == 0 and plain.token_ids == fast.token_ids
    streamed = draftwise.stream(tiny, prompt, max_new_tokens=12)
    for _ in streamed:
        pass
    assert streamed.result is not None and streamed.result.draft == "suffix"
    chat = draftwise.Conversation(tiny, chat=False)
    assert chat.say("hello", max_new_tokens=4).draft == "suffix"


def test_a_drafter_object_needs_a_number_for_k(tiny: Any) -> None:
    from draftwise.drafters import make_drafter
    from draftwise.errors import ConfigError

    drafter = make_drafter("lookup", tiny)
    with pytest.raises(ConfigError, match="pass a number, e.g. k=4"):
        draftwise.generate(tiny, [5, 6, 7], max_new_tokens=2, draft=drafter)
    assert draftwise.generate(tiny, [5, 6, 7], max_new_tokens=2, draft=drafter, k=4).draft == "lookup"
