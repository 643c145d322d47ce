"""The target's answers for training data (distill, train-head): made on the batched engine, each
exactly what ``generate`` gives it alone, greedy or sampled with its own seed; cached and resumed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from draftwise import generate
from draftwise.training import data as data_module
from draftwise.training.data import make_sequences
from draftwise.errors import ConfigError
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig

PROMPTS = [Question(i, "qa", (text,)) for i, text in enumerate(
    ["Name a colour.", "What is two plus two?", "Write a line about the sea and the wind at night.",
     "Hi", "List three fruits, please, one per line.", "Why is the sky blue?"])]
GEN = 12


def _alone(model, question, temperature, seed):
    cfg = SamplingConfig(temperature=temperature, seed=seed)
    # plain decoding, as the training data is made: a seeded sample depends on what a draft proposed
    res = generate(model, model.encode_prompt(question.prompt), max_new_tokens=GEN, sampling=cfg, draft="none")
    return list(model.encode_prompt(question.prompt)) + res.token_ids + ([res.eos_token] if res.eos_token is not None else [])


def test_each_answer_is_what_the_prompt_gets_alone_greedy_and_sampled(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "ENGINE_BATCH", 4)  # 6 prompts x 2 temperatures through 4 slots
    seqs = make_sequences(tiny, PROMPTS, tmp_path, gen_tokens=GEN, gen_temperatures=[0.0, 0.8], seed=5,
                          backend="engine")
    assert len(seqs) == 2 * len(PROMPTS)
    for i, q in enumerate(PROMPTS):  # the seed make_sequences gives prompt i at temperature j
        assert seqs[2 * i] == _alone(tiny, q, 0.0, 5 + i)
        assert seqs[2 * i + 1] == _alone(tiny, q, 0.8, 5 + i + 100_003)
    assert any(a != b for a, b in zip(seqs[::2], seqs[1::2]))  # sampling changed something
    assert tiny.runtime.slots == 1  # back to one sequence for whatever runs next


def test_an_answer_that_ends_keeps_its_end_token(tiny, tmp_path):
    first = generate(tiny, tiny.encode_prompt(PROMPTS[0].prompt), max_new_tokens=GEN).token_ids
    end = first[2]
    cut = first.index(end)  # the greedy answer ends at its first such token
    ends = dataclasses.replace(tiny, eos_token_ids=frozenset({end}))
    alone = generate(ends, ends.encode_prompt(PROMPTS[0].prompt), max_new_tokens=GEN)
    assert alone.finish_reason == "eos" and alone.eos_token == end and alone.token_ids == first[:cut]
    seq = make_sequences(ends, PROMPTS[:1], tmp_path, gen_tokens=GEN, backend="engine")[0]
    assert seq == list(ends.encode_prompt(PROMPTS[0].prompt)) + first[: cut + 1]


def test_answers_are_saved_as_they_end_and_a_resumed_run_makes_only_the_missing(tiny, tmp_path, monkeypatch):
    seen = []
    make_sequences(tiny, PROMPTS, tmp_path, gen_tokens=GEN, backend="engine", on_progress=lambda d, t: seen.append(d))
    assert seen == list(range(len(PROMPTS) + 1))  # one answer saved at a time, not all at the end
    path = tmp_path / "sequences.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1] + [lines[-1][:10]]) + "\n")  # the last line cut short
    made = []
    real = data_module._generate_engine
    monkeypatch.setattr(data_module, "_generate_engine", lambda target, jobs, **kw: (made.extend(jobs), real(target, jobs, **kw)))
    again = make_sequences(tiny, PROMPTS, tmp_path, gen_tokens=GEN, backend="auto")
    assert len(made) == 1 and again == [_alone(tiny, q, 0.0, i) for i, q in enumerate(PROMPTS)]


def test_a_prompt_with_no_room_gets_no_answer_and_the_others_do(tiny, tmp_path):
    long = Question(9, "qa", (" ".join(["word"] * (tiny.runtime.max_context - 4)),))
    seqs = make_sequences(tiny, [long, PROMPTS[1]], tmp_path, gen_tokens=GEN, backend="engine")
    assert seqs[0] == list(tiny.encode_prompt(long.prompt)) and seqs[1] == _alone(tiny, PROMPTS[1], 0.0, 1)


def test_hf_backend_still_makes_answers(tiny, tmp_path):
    seqs = make_sequences(tiny, PROMPTS[:2], tmp_path, gen_tokens=GEN, backend="hf")
    for q, seq in zip(PROMPTS[:2], seqs):
        prompt = list(tiny.encode_prompt(q.prompt))
        assert seq[: len(prompt)] == prompt and 0 < len(seq) - len(prompt) <= GEN
    rows = [json.loads(x) for x in (tmp_path / "sequences.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in rows] == [0, 1]


def test_bad_backend_is_one_line(tiny, tmp_path):
    with pytest.raises(ConfigError, match="backend='gpu' must be one of auto, engine, hf"):
        make_sequences(tiny, PROMPTS, tmp_path, gen_tokens=GEN, backend="gpu")
    one = dataclasses.replace(tiny, runtime=object())
    with pytest.raises(ConfigError, match="backend='engine' needs the native runtime"):
        make_sequences(one, PROMPTS, tmp_path, gen_tokens=GEN, backend="engine")
