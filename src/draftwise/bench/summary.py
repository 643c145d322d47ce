"""The numbers of a run, per group of categories, with Spec-Bench's conventions.

- tokens/s of a question = its new tokens over its wall time, all turns together (prefill
  included); a method's tokens/s = the mean over questions;
- speedup = mean tokens/s of the method / mean tokens/s of ``none`` over the *same* questions
  (Spec-Bench's: every question weighs alike, so a short answer that copies a lot counts as
  much as a long one, and this can exceed #MAT);
- speedup_total_time = total tokens/s of the method (all its new tokens over all its wall
  time) / the same for ``none``. When the methods commit the same tokens (greedy decoding,
  which is lossless) it is ``none``'s total time over the method's: what a user waiting for
  every answer sees. ``new_tokens`` and ``wall_s`` are those totals;
- #MAT (``mat``) = committed tokens / target passes, the recovered or bonus token included
  (so plain decoding has exactly 1);
- acceptance = accepted / proposed draft tokens; draft_time_share = draft seconds / wall time.

Groups: Spec-Bench's six (a Spec-Bench category counts in its group), then every other category
as a group of its own, in the order it first appears, then ``overall``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from draftwise.bench.answers import choice, question_key
from draftwise.bench.methods import BASELINE, is_peer
from draftwise.questions import GROUPS, Question, category_group

OVERALL = "overall"


def group_order(questions: Sequence[Question]) -> list[str]:
    """The groups of ``questions`` in report order, ``overall`` last.

    >>> group_order([Question(1, "code", ("x",)), Question(2, "qa", ("y",)), Question(3, "stem", ("z",))])
    ['mt_bench', 'qa', 'code', 'overall']
    """
    present = list(dict.fromkeys(category_group(q.category) for q in questions))
    spec_bench = [g for g in GROUPS if g in present]
    return spec_bench + [g for g in present if g not in GROUPS] + [OVERALL]


def _row(choices: Sequence[Mapping[str, Any]], method: str) -> tuple[dict[str, Any], float]:
    """The table row of one method over some questions, and its mean tokens/s."""
    peer = is_peer(method)
    per_q = [sum(c["new_tokens"]) / sum(c["wall_time"]) if sum(c["wall_time"]) > 0 else 0.0 for c in choices]
    speed = statistics.mean(per_q)
    wall = sum(sum(c["wall_time"]) for c in choices)
    stats = [s for c in choices for s in c.get("stats", [])]
    passes = sum(s.get("target_passes", 0) for s in stats)
    proposed = sum(s.get("proposed", 0) for s in stats)
    row = {
        "tokens_per_s": speed,
        "speedup": None,
        "speedup_total_time": None,
        "new_tokens": sum(sum(c["new_tokens"]) for c in choices),
        "wall_s": wall,
        "mat": None if peer or not passes else sum(s["committed"] for s in stats) / passes,
        "acceptance": None if peer or method == BASELINE or not proposed else sum(s["accepted"] for s in stats) / proposed,
        "draft_time_share": None if peer or wall <= 0 else sum(s.get("draft_seconds", 0.0) for s in stats) / wall,
        "questions": len(choices),
    }
    return row, speed


def _total_rate(row: Mapping[str, Any]) -> float:
    """All the new tokens of a row over all its wall time (0 when no time was spent)."""
    return row["new_tokens"] / row["wall_s"] if row["wall_s"] > 0 else 0.0


def _by_position(answers: Mapping[str, Mapping[str, Any]], complete: Sequence[Question]) -> dict[str, Any]:
    """Acceptance at each draft position, given the positions before it were accepted."""
    tested: list[int] = []
    accepted: list[int] = []
    for q in complete:
        for s in choice(answers[question_key(q)]).get("stats", []):
            for i, (t, a) in enumerate(zip(s.get("tested_at", []), s.get("accepted_at", []))):
                while len(tested) <= i:
                    tested.append(0)
                    accepted.append(0)
                tested[i] += t
                accepted[i] += a
    return {"tested": tested, "accepted": accepted, "rate": [a / t if t else None for a, t in zip(accepted, tested)]}


def summarise(
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    questions: Sequence[Question],
    methods: Sequence[str],
) -> tuple[dict[str, Any], dict[str, Any], list[Question]]:
    """``answers[method][question key]`` -> (groups table, per-position acceptance, complete questions).

    Only questions that every method answered count, so each speedup compares the same questions.
    """
    complete = [q for q in questions if all(question_key(q) in answers.get(m, {}) for m in methods)]
    groups: dict[str, Any] = {}
    for group in group_order(complete) if complete else []:
        qs = [q for q in complete if group == OVERALL or category_group(q.category) == group]
        table: dict[str, Any] = {}
        speeds: dict[str, float] = {}
        for m in methods:
            table[m], speeds[m] = _row([choice(answers[m][question_key(q)]) for q in qs], m)
        base = speeds.get(BASELINE, 0.0)
        base_total = _total_rate(table[BASELINE]) if BASELINE in table else 0.0
        for m in methods:
            table[m]["speedup"] = speeds[m] / base if base > 0 else None
            table[m]["speedup_total_time"] = _total_rate(table[m]) / base_total if base_total > 0 else None
        groups[group] = table
    by_position = {
        m: _by_position(answers[m], complete) for m in methods if m != BASELINE and not is_peer(m)
    }
    return groups, by_position, complete
