"""One draft-spec parser: canonical strings, options with commas, @k suffixes, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise import DraftSpec, generate
from draftwise.drafters import PromptLookupDrafter, make_drafter, parse_draft_list
from draftwise.drafters.spec import parse_k, split_draft_list
from draftwise.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("none", "none"),
        (" lookup ", "lookup"),
        ("lookup:max=3,min=1", "lookup"),
        ("lookup:min=2,max=4", "lookup:max=4,min=2"),
        ("lookup:max=5", "lookup:max=5"),
        ("self", "self"),
        ("self:exit=12", "self:exit=12"),
        ("self:layers=9,0-3, 4", "self:layers=0-4,9"),
        ("self:skip=18,11-17", "self:skip=11-18"),
        ("model:default", "model:default"),
        ("model: /models/x ", "model:/models/x"),
    ],
)
def test_canonical_form(text, canonical):
    spec = DraftSpec.parse(text)
    assert str(spec) == canonical
    assert DraftSpec.parse(canonical) == spec  # canonical strings parse back to the same spec


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(0, 7), st.sets(st.integers(0, 40), min_size=1))
def test_round_trip_property(hi, lo_off, layers):
    lo = max(1, hi - lo_off)
    for spec in (DraftSpec("lookup", max_ngram=hi, min_ngram=lo), DraftSpec("self", skip=tuple(sorted(layers)))):
        assert DraftSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("beam", "unknown draft spec"),
        ("lookup:max=x", "whole number"),
        ("lookup:min=0", "whole number >= 1"),
        ("lookup:max=2,min=3", "1 <= min <= max"),
        ("lookup:size=3", "unknown lookup draft option"),
        ("self:exit=3,skip=1", "not several"),
        ("self:layers=a-b", "cannot read layer list"),
        ("self:layers=5-2", "not a range"),
        ("model:", "needs a path"),
        ("model:  ", "needs a path"),
        ("[/x]", "unknown draft spec"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        DraftSpec.parse(text)


def test_errors_do_not_flood_with_huge_values():
    with pytest.raises(ConfigError) as exc:
        DraftSpec.parse("lookup:max=" + "9x" * 5000)
    assert len(str(exc.value)) < 200


def test_a_list_keeps_options_with_commas_and_k_suffixes():
    assert split_draft_list("lookup:max=4,min=2,self:layers=0-3,7,model:default@k=2") == [
        "lookup:max=4,min=2", "self:layers=0-3,7", "model:default@k=2",
    ]
    parsed = parse_draft_list("none, lookup:max=4,min=2@k=6, self", 4)
    assert [(str(s), k) for s, k in parsed] == [("none", 4), ("lookup:max=4,min=2", 6), ("self", 4)]
    with pytest.raises(ConfigError, match="listed twice"):
        parse_draft_list("lookup,lookup:max=3", 4)
    with pytest.raises(ConfigError, match="at least one draft"):
        parse_draft_list(" , ", 4)
    assert parse_k(" auto ") == "auto" and parse_k("3") == 3
    for bad in ("0", "x", True, 10**6):
        with pytest.raises(ConfigError):
            parse_k(bad)


def test_self_layers_are_checked_against_the_model_briefly():
    assert DraftSpec.parse("self:skip=1-2").self_layers(4) == [0, 3]
    assert DraftSpec.parse("self:exit=2").self_layers(4) == [0, 1]
    assert DraftSpec.parse("self").self_layers(4) is None
    with pytest.raises(ConfigError) as exc:
        DraftSpec.parse("self:layers=0-1000").self_layers(30)
    assert "and 966 more" in str(exc.value) and len(str(exc.value)) < 200
    assert DraftSpec.parse("self:layers=0-3").early_exit_layer() == 4
    assert DraftSpec.parse("self:layers=1-3").early_exit_layer() is None


def test_the_factory_builds_what_the_spec_says(tiny):
    drafter = make_drafter("lookup:max=4,min=2", tiny)
    assert isinstance(drafter, PromptLookupDrafter)
    assert (drafter.max_ngram, drafter.min_ngram) == (4, 2)
    assert make_drafter(DraftSpec.parse("none"), tiny) is None
    plain = generate(tiny, "Say hello twice.", max_new_tokens=12)
    assert generate(tiny, "Say hello twice.", max_new_tokens=12, draft=DraftSpec("lookup"), k=3).token_ids == plain.token_ids


def test_a_damaged_calibration_is_a_clear_error(tiny, tmp_path, monkeypatch):
    from draftwise.drafters.factory import calibration_path

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    path = calibration_path(tiny)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\x00not json")
    with pytest.raises(ConfigError, match="damaged; delete it"):
        make_drafter("self", tiny)
    path.write_text('{"layers": "0-3"}')
    with pytest.raises(ConfigError, match="damaged"):
        make_drafter("self", tiny)


@pytest.mark.parametrize("ids", [[10**9], [-1], [1.5], ["a"], [True]])
def test_token_ids_out_of_range_or_of_the_wrong_type(tiny, ids):
    with pytest.raises(ConfigError, match="token id"):
        generate(tiny, ids, max_new_tokens=2)


def test_auto_k_needs_a_spec_not_a_drafter_object(tiny):
    with pytest.raises(ConfigError, match="needs a draft spec"):
        generate(tiny, "hi", max_new_tokens=2, draft=PromptLookupDrafter(), k="auto")
    assert generate(tiny, "hi", max_new_tokens=2, draft="none", k="auto").new_tokens == 2
