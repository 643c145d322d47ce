"""Incremental detokenisation: multi-byte characters come out whole; stop strings cut exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.errors import ConfigError
from draftwise.core.text import TextAssembler, decode_escapes


@pytest.fixture(scope="module")
def tokenizer(default_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_folder)


def pieces_one_by_one(tokenizer, ids, stop=()):
    asm = TextAssembler(tokenizer, stop)
    pieces = [asm.push([i]) for i in ids]
    pieces.append(asm.finish())
    return asm, [p for p in pieces if p]


@pytest.mark.real_model
def test_multibyte_characters_are_never_split(tokenizer):
    text = "naïve café: 🦙🦙 and 日本語のテキスト, ünïcödé"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # the byte-level tokenizer really does split some of these characters across tokens
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    asm, pieces = pieces_one_by_one(tokenizer, ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == asm.text == tokenizer.decode(ids)


@pytest.mark.real_model
def test_several_tokens_per_push(tokenizer):
    text = "Speculative steps commit several tokens: 🦙 at once."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    asm = TextAssembler(tokenizer)
    out = "".join(asm.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + asm.finish()
    assert out == text


@pytest.mark.real_model
def test_stop_string_across_tokens(tokenizer):
    text = "alpha beta gamma delta"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    asm, pieces = pieces_one_by_one(tokenizer, ids, stop=("a gam",))
    assert asm.stopped
    assert "".join(pieces) == asm.text == "alpha bet"


@pytest.mark.real_model
def test_text_that_only_looks_like_a_stop_string_is_released(tokenizer):
    ids = tokenizer("one two three", add_special_tokens=False)["input_ids"]
    asm, pieces = pieces_one_by_one(tokenizer, ids, stop=("threefold",))
    assert not asm.stopped
    assert "".join(pieces) == "one two three"


@pytest.mark.real_model
@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab c.é€日🦙\n")), min_size=1, max_size=30))
def test_streamed_pieces_reassemble_the_text(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    asm, pieces = pieces_one_by_one(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize(
    "typed, meant",
    [
        (r"\n\n", "\n\n"),
        (r"a\tb", "a\tb"),
        (r"\r\n", "\r\n"),
        (r"a\\nb", "a\\nb"),  # an escaped backslash, then a plain n
        (r"C:\x\y", r"C:\x\y"),  # other backslashes are kept
        ("日本\\n語", "日本\n語"),  # non-ASCII text is untouched
        ("trailing\\", "trailing\\"),
    ],
)
def test_decode_escapes(typed, meant):
    assert decode_escapes(typed) == meant


def test_an_empty_stop_string_is_a_config_error():
    with pytest.raises(ConfigError, match="non-empty"):
        TextAssembler(object(), stop=("",))
