"""Answer files: one Spec-Bench answer line per question and method, read back on ``--resume``.

A line is what Spec-Bench's ``evaluation/speed.py`` reads (``question_id``, ``choices[0]`` with
``turns``, ``new_tokens``, ``wall_time``, ``decoding_steps``, ``accept_lengths``) plus
draftwise's ``token_ids`` (for the equality check) and per-turn ``stats``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.bench.methods import Method
from draftwise.questions import Question


@dataclass
class TurnResult:
    """What one method produced for one turn of one question."""

    text: str
    token_ids: list[int]
    seconds: float
    stats: dict[str, Any]  # target_passes, committed, proposed, accepted, draft_seconds, ...
    accept_lengths: list[int]


def question_key(q: Question | Any) -> str:
    """The key answers are stored under: the JSON of the question id (ids may be int or str)."""
    return json.dumps(q.question_id if isinstance(q, Question) else q)


def choice(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The one choice of an answer line."""
    return record["choices"][0]


def answer_record(model_name: str, method: Method, q: Question, turns: Sequence[TurnResult]) -> dict[str, Any]:
    """One Spec-Bench answer line (plus ``token_ids`` and per-turn ``stats``)."""
    hf = method.kind == "hf"
    return {
        "question_id": q.question_id,
        "category": q.category,
        "answer_id": uuid.uuid4().hex,
        "model_id": f"{model_name}-{method.name}",
        "method": method.name,
        "choices": [
            {
                "index": 0,
                "turns": [t.text for t in turns],
                "decoding_steps": [None if hf else t.stats["target_passes"] for t in turns],
                "new_tokens": [len(t.token_ids) for t in turns],
                "wall_time": [t.seconds for t in turns],
                "accept_lengths": [t.accept_lengths for t in turns],
                "token_ids": [t.token_ids for t in turns],
                "stats": [t.stats for t in turns],
            }
        ],
        "tstamp": time.time(),
    }


def read_answers(path: Path) -> dict[str, dict[str, Any]]:
    """Answers already in a method's file, keyed by :func:`question_key`; a line cut short by an
    interruption (the last one) is ignored, so that question runs again."""
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "question_id" in row and row.get("choices"):
                out[question_key(row["question_id"])] = row
    return out


def end_with_newline(path: Path) -> None:
    """Finish a line cut short by a kill, so the next answer starts on a line of its own."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            last = f.read(1)
        if last != b"\n":
            with path.open("a", encoding="utf-8") as f:
                f.write("\n")
