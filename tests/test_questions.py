"""One workload reader: Spec-Bench JSONL or plain text, any category, clear errors."""

from __future__ import annotations

import json

import pytest

from draftwise.runtime.chat import encode_conversation
from draftwise.errors import ConfigError
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    SPEC_BENCH_CATEGORIES,
    TEXT_CATEGORY,
    category_group,
    read_questions,
    select_questions,
    spread_questions,
)


def test_the_dev_questions_ship_with_the_package_and_their_licence():
    qs = read_questions(DEFAULT_QUESTIONS)
    assert len(qs) == 240 and {q.category for q in qs} == set(SPEC_BENCH_CATEGORIES)
    folder = DEFAULT_QUESTIONS.parent
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "Spec-Bench" in (folder / "README.md").read_text()


def test_any_category_is_its_own_group(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]} for i, c in enumerate(["code", "writing", "code"])]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    qs = read_questions(path)
    assert [category_group(q.category) for q in qs] == ["code", "mt_bench", "code"]
    assert [q.question_id for q in select_questions(qs, 1)] == [0, 1]


def test_a_text_file_is_one_prompt_a_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n")
    qs = read_questions(path)
    assert [(q.question_id, q.category, q.prompt, q.line) for q in qs] == [
        (1, TEXT_CATEGORY, "first prompt", 1), (2, TEXT_CATEGORY, "second prompt", 3),
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is empty"),
        (b"\n \n", "is empty"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
        (b'{"question_id": 1, "category": "qa", "turns": ["a"]}\x00\n', "binary"),
        (b'{"question_id": 1, "category": "qa", "turns": ["a"]}\n{oops\n', ":2 is not valid JSON"),
        (b'[1, 2]\n', "expected a JSON object"),
        (b'{"question_id": 1, "category": 5, "turns": ["a"]}\n', "'category' must be"),
        (b'{"question_id": 1, "category": "qa", "turns": "a"}\n', "'turns' must be"),
        (b'{"question_id": [1], "category": "qa", "turns": ["a"]}\n', "'question_id' must be"),
        (b'{"question_id": 1, "category": "qa", "turns": ["a"]}\n{"question_id": 1, "category": "qa", "turns": ["b"]}\n', "repeats line 1"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, content, needle):
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        read_questions(path)


def test_missing_file_and_bad_counts(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_questions(tmp_path / "nope.jsonl")
    qs = read_questions(DEFAULT_QUESTIONS)
    with pytest.raises(ConfigError, match="only 240"):
        spread_questions(qs, 241)
    with pytest.raises(ConfigError, match=">= 1"):
        select_questions(qs, 0)
    picked = spread_questions(qs, 13)
    assert len({q.category for q in picked}) == 13  # one of each category first


def test_one_chat_builder_for_single_and_multi_turn(tiny):
    tok = tiny.tokenizer
    single = encode_conversation(tok, ["Hello?"])
    assert single == tiny.encode_prompt("Hello?")
    two = encode_conversation(tok, ["Hello?", "And then?"], ["Hi."])
    assert two[: len(single) - 3] == single[: len(single) - 3] and len(two) > len(single)
    raw = encode_conversation(tok, ["a", "c"], ["b"], chat=False)
    assert raw == list(tok("a\n\nb\n\nc", add_special_tokens=True)["input_ids"])
    with pytest.raises(ConfigError, match="one more user turn"):
        encode_conversation(tok, ["a"], ["b"])
