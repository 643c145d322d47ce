"""Workloads: Spec-Bench-format questions, or plain text with one prompt a line.

One reader for every command (``bench``, ``plan``, ``demo``, ``distill``, ``calibrate-self``,
``bench-runtime``). A Spec-Bench file is JSONL, one object a line::

    {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post ...", "..."]}

Any category is valid: the 13 of Spec-Bench map to its six groups (:data:`GROUPS`), any other
category is a group of its own, so a user can benchmark their own workload. A plain-text file
(any file whose first non-blank line does not start with ``{``) gives one single-turn question a
line, in category ``prompts``.

The Spec-Bench development questions ship inside the package (:data:`DEFAULT_QUESTIONS`, with
their Apache-2.0 licence and attribution beside them) and are the default wherever a command
needs questions.

>>> qs = read_questions(DEFAULT_QUESTIONS)
>>> len(qs), qs[0].category, category_group("roleplay"), category_group("code")
(240, 'writing', 'mt_bench', 'code')
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.errors import ConfigError

#: the Spec-Bench development questions (240, even question ids) shipped with draftwise
DEFAULT_QUESTIONS: Path = Path(__file__).resolve().parent / "data" / "spec_bench" / "question_dev.jsonl"

#: Spec-Bench's category groups; a category outside them is a group of its own
GROUPS: dict[str, tuple[str, ...]] = {
    "mt_bench": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"),
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
SPEC_BENCH_CATEGORIES: tuple[str, ...] = tuple(c for cats in GROUPS.values() for c in cats)
#: the category of each line of a plain-text prompt file
TEXT_CATEGORY = "prompts"


@dataclass(frozen=True)
class Question:
    """One question: its id, category, user turns and its line in the file (1-based)."""

    question_id: Any
    category: str
    turns: tuple[str, ...]
    line: int = 0

    @property
    def prompt(self) -> str:
        """The first user turn."""
        return self.turns[0]


def category_group(category: str) -> str:
    """The group a category is reported in: Spec-Bench's group, or the category itself.

    >>> category_group("stem"), category_group("rag"), category_group("humaneval")
    ('mt_bench', 'rag', 'humaneval')
    """
    for group, cats in GROUPS.items():
        if category in cats:
            return group
    return category


def parse_question(row: Any, where: str) -> Question:
    """Validate one decoded JSONL row; ``where`` (``"file:line"``) goes into the error."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "question_id" not in row:
        raise ConfigError(f"{where}: missing 'question_id'")
    qid = row["question_id"]
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise ConfigError(f"{where}: 'question_id' must be an integer or a string, got {type(qid).__name__}")
    category = row.get("category")
    if not isinstance(category, str) or not category.strip():
        raise ConfigError(f"{where}: 'category' must be a non-empty string (e.g. 'writing' or your own)")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ConfigError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    return Question(qid, category.strip(), tuple(turns))


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(
            f"questions file not found: {path}; pass a Spec-Bench-format .jsonl file "
            "(one {'question_id', 'category', 'turns': [...]} object a line) or a text file "
            "with one prompt a line"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def is_jsonl(path: Path, text: str) -> bool:
    """JSONL when the name says so or the first non-blank line opens a JSON object."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return path.suffix == ".jsonl" or first.lstrip().startswith("{")


def read_questions(path: str | Path) -> list[Question]:
    """The questions of a Spec-Bench JSONL file or a text file (one prompt a line), validated.

    Errors name the file and line. Blank lines are skipped; question ids must be unique (answers
    are keyed by them); an empty file is an error.
    """
    path = Path(path).expanduser()
    text = _read_text(path)
    if "\x00" in text:
        raise ConfigError(f"{path} looks binary (it holds NUL bytes); pass a .jsonl or text file")
    out: list[Question] = []
    if not is_jsonl(path, text):
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                out.append(Question(len(out) + 1, TEXT_CATEGORY, (line.strip(),), lineno))
    else:
        seen: dict[str, int] = {}
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where} is not valid JSON: {exc}") from None
            q = parse_question(row, where)
            key = json.dumps(q.question_id)
            if key in seen:
                raise ConfigError(f"{where}: question_id {q.question_id!r} repeats line {seen[key]}; ids must be unique")
            seen[key] = lineno
            out.append(Question(q.question_id, q.category, q.turns, lineno))
    if not out:
        raise ConfigError(f"questions file {path} is empty; it needs at least one question")
    return out


def select_questions(questions: Sequence[Question], limit_per_category: int | None) -> list[Question]:
    """The first ``limit_per_category`` questions of each category, in file order (None: all).

    >>> qs = [Question(i, c, ("q",)) for i, c in enumerate(["qa", "qa", "rag", "qa"])]
    >>> [q.question_id for q in select_questions(qs, 1)]
    [0, 2]
    """
    if limit_per_category is None:
        return list(questions)
    if isinstance(limit_per_category, bool) or not isinstance(limit_per_category, int) or limit_per_category < 1:
        raise ConfigError(f"limit_per_category={limit_per_category!r} must be an integer >= 1")
    taken: dict[str, int] = {}
    out = []
    for q in questions:
        if taken.get(q.category, 0) < limit_per_category:
            taken[q.category] = taken.get(q.category, 0) + 1
            out.append(q)
    return out


def spread_questions(questions: Sequence[Question], count: int) -> list[Question]:
    """``count`` questions spread over the categories, deterministically.

    Round-robin over the categories in the order they first appear, each category's questions
    in file order; a category that runs out is skipped.

    >>> qs = [Question(i, c, (f"q{i}",)) for i, c in enumerate("aaabcc")]
    >>> [(q.category, q.prompt) for q in spread_questions(qs, 5)]
    [('a', 'q0'), ('b', 'q3'), ('c', 'q4'), ('a', 'q1'), ('c', 'q5')]
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"the number of prompts ({count!r}) must be an integer >= 1")
    if count > len(questions):
        raise ConfigError(
            f"{count} prompts asked for but the questions file has only {len(questions)}; "
            f"ask for {len(questions)} or fewer"
        )
    queues: dict[str, list[Question]] = {}
    for q in questions:
        queues.setdefault(q.category, []).append(q)
    iters = {c: iter(qs) for c, qs in queues.items()}
    chosen: list[Question] = []
    while len(chosen) < count:
        for it in iters.values():
            q = next(it, None)
            if q is not None:
                chosen.append(q)
                if len(chosen) == count:
                    break
    return chosen
