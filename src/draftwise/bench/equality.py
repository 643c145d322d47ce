"""The losslessness check of a greedy run: every method's tokens against plain decoding's.

A mismatch is reported with the first diverging position and the target's top-2 logit margin
there, so that near-ties (bf16 rounding, a different kernel order) are told apart from bugs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from draftwise.bench.answers import choice, question_key
from draftwise.bench.methods import BASELINE
from draftwise.bench.runner import build_prompt
from draftwise.questions import Question


def top2_margin(model: Any, prompt_ids: Sequence[int], prefix: Sequence[int]) -> float:
    """Top-1 minus top-2 logit of the target after ``prompt_ids + prefix`` (resets its cache)."""
    logits = model.runtime.prefill(list(prompt_ids) + list(prefix))  # [vocab]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length if one is a prefix).

    >>> first_difference([5, 6, 7], [5, 6, 9]), first_difference([5, 6], [5, 6, 7])
    (2, 2)
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_equality(
    model: Any,
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    questions: Sequence[Question],
    methods: Sequence[str],
) -> dict[str, Any]:
    """Every method's tokens against the baseline's, per turn, with top-2 margins at mismatches.

    Turn t's prompt holds the method's own earlier answers, so a mismatch in a later turn of a
    question whose earlier turn already diverged is flagged ``after_earlier_mismatch`` (its prompt
    differs from the baseline's). Margins are computed on the baseline's prompt.
    """
    counts: dict[str, dict[str, int]] = {}
    mismatches: list[dict[str, Any]] = []
    for m in methods:
        if m == BASELINE:
            continue
        equal = total = 0
        for q in questions:
            base = choice(answers[BASELINE][question_key(q)])
            mine = choice(answers[m][question_key(q)])
            diverged = False
            for t, (b_ids, m_ids) in enumerate(zip(base["token_ids"], mine["token_ids"])):
                total += 1
                if b_ids == m_ids:
                    equal += 1
                    continue
                pos = first_difference(b_ids, m_ids)
                prompt = build_prompt(model, q.turns[: t + 1], base["turns"][:t])
                mismatches.append({
                    "question_id": q.question_id,
                    "category": q.category,
                    "method": m,
                    "turn": t,
                    "position": pos,
                    "margin": top2_margin(model, prompt, b_ids[:pos]),
                    "baseline_token": b_ids[pos] if pos < len(b_ids) else None,
                    "method_token": m_ids[pos] if pos < len(m_ids) else None,
                    "after_earlier_mismatch": diverged,
                })
                diverged = True
        counts[m] = {"equal": equal, "total": total}
    return {"checked": True, "reference": BASELINE, "methods": counts, "mismatches": mismatches}
