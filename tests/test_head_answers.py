"""benchmarks/head_answers.py and head_scaling.py --answers: the target's answers in place of a
corpus's, on the same conversations and within the same tokens."""

from __future__ import annotations

import argparse
import json

import pytest

from draftwise.eagle.data import read_corpus
from draftwise.eagle.data import conversation_ids

from .benchmark_scripts import load_benchmark
from .test_corpus import jsonl, openai, sharegpt

ha = load_benchmark("head_answers")
hs = load_benchmark("head_scaling")


def test_the_answers_keep_the_prompts_and_stay_within_the_original_tokens(tiny, tiny_chat_folder, tmp_path):
    corpus = jsonl(tmp_path / "c.jsonl", [openai(i) if i % 2 else sharegpt(i) for i in range(8)])
    out = tmp_path / "a.jsonl"
    argv = ["--target", str(tiny_chat_folder), "--corpus", str(corpus), "--holdout-percent", "0", "--seq-len", "96",
            "--out", str(out)]
    ha.main(["--size", "2", *argv])
    ha.main(["--size", "4", *argv])  # resumes: the first two are not answered again
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in recs) == [0, 1, 2, 3] and len(recs) == 4
    train = read_corpus(corpus, holdout_percent=0).train
    for r in recs:
        conv = train[r["index"]]
        assert r["key"] == conv.key
        assert r["original_tokens"] == len(conversation_ids(tiny.tokenizer, conv.messages(), 96)[0])
        if r["rounds"]:  # the last answer ends within the original's tokens (as ids; its text tokenized again may differ)
            last_prompt = ha._prompt_ids(tiny.tokenizer, r["messages"][:-1])
            assert 0 < len(last_prompt) + r["answer_tokens"][-1] <= r["original_tokens"]
        users = [m["content"] for m in r["messages"] if m["role"] == "user"]
        assert users == [m["content"] for m in conv.messages() if m["role"] == "user"][: len(users)]
        if r["rounds"]:
            answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
            assert len(answers) == r["rounds"]
            assert answers != [m["content"] for m in conv.messages() if m["role"] == "assistant"][: r["rounds"]]
    with pytest.raises(SystemExit, match="another corpus or split"):
        ha.main(["--size", "4", *argv[:-4], "--seq-len", "96", "--corpus-seed", "7", "--out", str(out)])


def test_a_later_user_turn_comes_in_after_the_answer_before_it(tiny, tmp_path):
    conv = read_corpus(jsonl(tmp_path / "c.jsonl", [openai(1)]), holdout_percent=0).train[0]
    s = ha._State(0, conv, tiny.tokenizer, 10_000)
    assert [m["role"] for m in s.messages] == ["system", "user"] and s.budget > 0
    s.messages.append({"role": "assistant", "content": "x"})
    assert s.next_user() and s.messages[-1] == {"role": "user", "content": "And what else can you say about it?"}
    s.messages.append({"role": "assistant", "content": "y"})
    assert not s.next_user()


def _args(tmp_path, corpus, answers, sizes=(3,)):
    return argparse.Namespace(corpus=str(corpus), corpus_seed=0, holdout_percent=0.0, sizes=list(sizes),
                              answers=answers, seq_len=256)


def test_scaling_trains_on_the_answers_of_its_own_conversations_only(tiny, tmp_path):
    corpus = jsonl(tmp_path / "c.jsonl", [sharegpt(i) for i in range(6)])
    train = read_corpus(corpus, holdout_percent=0).train
    answers = tmp_path / "a.jsonl"
    rows = [{"index": i, "key": c.key, "messages": [c.messages()[0], {"role": "assistant", "content": f"mine {i}"}]}
            for i, c in enumerate(train[:4])]
    jsonl(answers, rows)
    seqs = [conversation_ids(tiny.tokenizer, c.messages(), 256)[0] for c in train]
    lens = [0] * len(seqs)
    before = [list(s) for s in seqs]
    hs._use_answers(_args(tmp_path, corpus, answers), tiny.tokenizer, seqs, lens)
    for i in range(3):
        assert tiny.tokenizer.decode(seqs[i]).count(f"mine {i}") == 1 and lens[i] > 0
    assert seqs[3:] == before[3:]  # past the sizes trained, and the held-out ones: as they were
    with pytest.raises(SystemExit, match="answers 4 of the 5"):
        hs._use_answers(_args(tmp_path, corpus, answers, sizes=(5,)), tiny.tokenizer, seqs, lens)
    rows[1]["key"] = rows[2]["key"]
    jsonl(answers, rows)
    with pytest.raises(SystemExit, match="index 1 is another conversation"):
        hs._use_answers(_args(tmp_path, corpus, answers), tiny.tokenizer, seqs, lens)
