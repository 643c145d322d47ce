"""Draft specs, calibrate-self and the speculative CLI on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.cli import app
from draftwise.drafters import PromptLookupDrafter, SelfSpecDrafter, make_drafter
from draftwise.cost.calibrate import calibrate_self, candidate_layer_sets, save_calibration


def test_specs_build_the_named_drafters(tiny):
    assert make_drafter("none", tiny) is None
    lookup = make_drafter("lookup:max=5,min=2", tiny)
    assert isinstance(lookup, PromptLookupDrafter) and (lookup.max_ngram, lookup.min_ngram) == (5, 2)
    assert make_drafter("self:exit=2", tiny).layers == [0, 1]
    assert make_drafter("self:skip=1", tiny).layers == [0, 2]
    assert make_drafter("self:layers=0,2", tiny).layers == [0, 2]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("beam", "unknown draft spec"),
        ("lookup:max=x", "lookup:max= takes a whole number"),
        ("lookup:size=3", "unknown lookup draft option"),
        ("self:exit=0", "self:exit= takes a whole number >= 1, got 0"),
        ("self:exit=3", "whole model"),
        ("self:layers=0-9", "does not exist"),
        ("model:/nonexistent/draft", "not found"),
    ],
)
def test_bad_specs_name_the_problem(tiny, spec, match):
    with pytest.raises(Exception, match=match):
        make_drafter(spec, tiny)


def test_model_draft_with_another_tokenizer_is_refused(tiny):
    from draftwise.drafters import check_same_tokenizer

    class Other:
        def get_vocab(self):
            vocab = dict(tiny.tokenizer.get_vocab())
            vocab["<new-token>"] = len(vocab)
            return vocab

    with pytest.raises(ConfigError, match=r"first difference at id \d+"):
        check_same_tokenizer(tiny.tokenizer, Other())


def test_k_must_be_positive(tiny):
    from draftwise import generate

    with pytest.raises(ConfigError, match="k=0"):
        generate(tiny, "hi", draft="lookup", k=0)


def test_candidates_are_proper_subsets():
    for n in (2, 3, 30):
        for layers in candidate_layer_sets(n):
            assert 0 < len(layers) < n and layers == sorted(set(layers))


def test_calibration_is_saved_and_used_by_self(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    results = calibrate_self(tiny, ["hello there"], k=2, max_new_tokens=6, candidates=[[0], [0, 1]])
    assert len(results) == 2
    assert results[0].predicted_speedup >= results[1].predicted_speedup
    path = save_calibration(tiny, results[0], 2, results)
    assert json.loads(open(path).read())["layers"] == results[0].layers
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name]  # no temp file left
    drafter = make_drafter("self", tiny)
    assert isinstance(drafter, SelfSpecDrafter) and drafter.layers == results[0].layers


def test_cli_generate_with_a_draft_reports_stats(tiny_chat_folder):
    res = CliRunner().invoke(
        app,
        ["generate", "one two one two one two", "--raw", "--model", str(tiny_chat_folder), "-n", "12",
         "--draft", "lookup", "--k", "3", "--json"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    stats = payload["stats"]
    for key in ("proposed", "accepted", "recovered", "bonus", "committed", "target_passes",
                "mean_committed_per_pass", "acceptance_by_position", "draft_seconds", "verify_seconds"):
        assert key in stats
    assert payload["finish_reason"] == "length" and stats["committed"] == payload["new_tokens"] == 12
    # every pass commits what it accepted plus one token (recovered or bonus); the prefill's
    # pass proposes nothing, every other pass at most k = 3
    assert stats["committed"] == stats["accepted"] + stats["target_passes"] == sum(stats["accept_lengths"])
    assert len(stats["accept_lengths"]) == stats["target_passes"]
    assert stats["accepted"] <= stats["proposed"] == stats["depth"] <= 3 * (stats["target_passes"] - 1)
    assert stats["recovered"] + stats["bonus"] == stats["tested_by_position"][0]  # one per proposing pass
    assert stats["target_passes"] < stats["committed"]  # the look-up saved passes on a repeated prompt


def test_cli_bad_k_and_bad_draft_exit_2(tiny_chat_folder):
    runner = CliRunner()
    for args, needle in ((["--k", "0"], "k=0"), (["--draft", "beam"], "unknown draft spec")):
        res = runner.invoke(app, ["generate", "hi", "--model", str(tiny_chat_folder), *args])
        assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_layer_lists_round_trip():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from draftwise.drafters.spec import format_layers, parse_layer_list

    @settings(max_examples=200, deadline=None)
    @given(st.sets(st.integers(0, 29), min_size=1))
    def check(layers):
        assert list(parse_layer_list(format_layers(layers))) == sorted(layers)

    check()
