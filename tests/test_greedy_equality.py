"""Speculative greedy output equals plain greedy output, token for token, on SmolLM2-135M in
float32, for the drafts that only the real model can run (the shipped distilled draft,
``model:default``, and the shipped EAGLE head, ``eagle:default``, as a chain and as a tree) and
for lookup and self-speculation, on dev-set prompts from three categories.

Every draft kind is also checked token for token on tiny random models (test_spec_rollback, test_tree_*,
test_hybrid, test_suffix); a model draft of the target's own tokenizer is ``model:default`` here.
"""

from __future__ import annotations

import json

import pytest

from draftwise import generate
from draftwise.questions import DEFAULT_QUESTIONS as DEV_QUESTIONS

pytestmark = pytest.mark.real_model
NEW_TOKENS = 20  # enough that every draft proposes and has proposals rejected (asserted below)
# code (repeats identifiers: lookup hits), extraction (copies from a long prompt) and math
CATEGORIES = ("coding", "extraction", "math")


@pytest.fixture(scope="module")
def dev_prompts() -> list[str]:
    """The first question (first turn) of each of CATEGORIES."""
    seen: dict[str, str] = {}
    for line in DEV_QUESTIONS.read_text().splitlines():
        row = json.loads(line)
        seen.setdefault(row["category"], row["turns"][0])
    return [seen[c] for c in CATEGORIES]


@pytest.fixture(scope="module")
def baseline(default_model, dev_prompts):
    return [generate(default_model, p, max_new_tokens=NEW_TOKENS, draft="none").token_ids for p in dev_prompts]


@pytest.mark.parametrize("draft", ["lookup", "self:exit=15", "model:default", "eagle:default", "eagle:default,topk=4"])
def test_speculative_greedy_equals_plain_greedy(default_model, dev_prompts, baseline, draft):
    from draftwise.drafters import make_drafter

    drafter = make_drafter(draft, default_model)  # built once, reused across prompts
    proposed = accepted = 0
    for prompt, expected in zip(dev_prompts, baseline):
        res = generate(default_model, prompt, max_new_tokens=NEW_TOKENS, draft=drafter, k=4)
        assert res.token_ids == expected, f"{draft} diverged on {prompt[:60]!r}"
        proposed += res.stats.proposed
        accepted += res.stats.accepted
    # the draft was really exercised: it proposed, and some proposals were rejected
    assert proposed > 0 and 0 < accepted < proposed
