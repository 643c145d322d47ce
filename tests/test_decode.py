"""Plain decoding: greedy equals transformers, EOS, stop strings, budget, seeds, streaming."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from draftwise import ContextLengthError, SamplingConfig, generate, stream
from draftwise.errors import ConfigError


def test_greedy_equals_transformers_generate(tiny, tiny_chat_folder):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_chat_folder, dtype=torch.float32).eval()
    prompt_ids = tiny.encode_prompt("Hello there")
    ours = generate(tiny, prompt_ids, max_new_tokens=24)
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt_ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )[0, len(prompt_ids):].tolist()
    # the random model may emit an EOS id that transformers (told eos=None) keeps going past
    assert ours.token_ids == ref[: ours.new_tokens]
    if ours.finish_reason == "length":
        assert ours.new_tokens == 24


def test_max_new_tokens_is_exact(tiny):
    eos_free = dataclasses.replace(tiny, eos_token_ids=frozenset())
    for n in (1, 7):
        res = generate(eos_free, "count", max_new_tokens=n)
        assert res.new_tokens == n and res.finish_reason == "length"


def test_eos_ends_the_generation_and_is_not_included(tiny):
    eos_free = dataclasses.replace(tiny, eos_token_ids=frozenset())
    first = generate(eos_free, "hi", max_new_tokens=5).token_ids
    stopper = dataclasses.replace(tiny, eos_token_ids=frozenset({first[2]}))
    res = generate(stopper, "hi", max_new_tokens=5)
    assert res.finish_reason == "eos"
    assert res.token_ids == first[: first.index(first[2])]


def test_stop_string_cuts_the_text(tiny):
    eos_free = dataclasses.replace(tiny, eos_token_ids=frozenset())
    full = generate(eos_free, "hi", max_new_tokens=30).text
    assert len(full) > 12
    stop = full[6:10]
    res = generate(eos_free, "hi", max_new_tokens=30, stop=[stop])
    assert res.finish_reason == "stop"
    assert res.text == full[: full.index(stop)]


def test_stream_pieces_concatenate_to_the_text(tiny):
    s = stream(tiny, "hi", max_new_tokens=20, sampling=SamplingConfig(temperature=1.0, seed=0))
    pieces = list(s)
    assert s.result is not None
    assert "".join(pieces) == s.result.text


class _TimedRuntime:
    """The tiny model's runtime on a fake clock: a prefill takes 5 s, every other pass 1 s, and
    nothing else takes any time."""

    def __init__(self, inner, clock):
        self._inner, self._clock = inner, clock

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def prefill(self, ids):
        self._clock.now += 5.0
        return self._inner.prefill(ids)

    def forward(self, ids, **kwargs):
        self._clock.now += 1.0
        return self._inner.forward(ids, **kwargs)


def test_seconds_are_the_prefill_plus_every_pass(tiny, monkeypatch):
    import time
    from types import SimpleNamespace

    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(time, "perf_counter", lambda: clock.now)
    timed = dataclasses.replace(tiny, runtime=_TimedRuntime(tiny.runtime, clock), eos_token_ids=frozenset())
    s = stream(timed, "hi", max_new_tokens=20, sampling=SamplingConfig(temperature=1.0, seed=0))
    list(s)
    # the prefill commits the first token, each of 19 plain passes one more
    assert (s.result.prefill_seconds, s.result.seconds) == (5.0, 5.0 + 19 * 1.0)
    assert (s.stats.target_passes, s.stats.verify_seconds, s.stats.draft_seconds) == (20, 24.0, 0.0)
    assert s.result.tokens_per_second == 20 / 24.0


def test_seeds_are_honoured(tiny):
    def run(seed):
        cfg = SamplingConfig(temperature=1.0, top_p=0.95, seed=seed)
        return generate(tiny, "hi", max_new_tokens=12, sampling=cfg).token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_prompt_longer_than_the_context(tiny):
    limit = tiny.runtime.max_context
    with pytest.raises(ContextLengthError, match=str(limit)):
        generate(tiny, list(range(5, 5 + limit)), max_new_tokens=1)
    with pytest.raises(ContextLengthError, match="max-new-tokens"):
        generate(tiny, [5, 6, 7], max_new_tokens=limit)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_max_new_tokens(tiny, bad):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(tiny, "hi", max_new_tokens=bad)


@pytest.mark.real_model
def test_default_model_answers_and_stops_at_eos(default_model):
    res = generate(default_model, "What is the capital of France? Answer in one word.", max_new_tokens=32)
    assert "Paris" in res.text
    assert res.finish_reason == "eos"


def test_by_step_gives_one_piece_per_pass_and_close_stops(tiny):
    eos_free = dataclasses.replace(tiny, eos_token_ids=frozenset())
    prompt = "a b c d a b c d a b c d a b c d"
    full = generate(eos_free, prompt, max_new_tokens=40, draft="lookup", k=4)
    s = stream(eos_free, prompt, max_new_tokens=40, draft="lookup", k=4)
    pieces = list(s.by_step())
    assert "".join(pieces) == full.text == s.result.text
    assert len(pieces) <= s.stats.target_passes + 1  # one piece per pass (+ the final flush)
    assert s.stats.committed > s.stats.target_passes  # passes did commit several tokens
    assert len(pieces) < len(full.token_ids)
    cut = stream(eos_free, prompt, max_new_tokens=40)
    next(iter(cut.by_step()))
    passes = cut.stats.target_passes
    cut.close()
    assert cut.result is None and cut.stats.target_passes == passes  # nothing ran after close
    with pytest.raises(StopIteration):
        next(cut)
