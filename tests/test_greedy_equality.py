"""Speculative greedy output equals plain greedy output, token for token, on SmolLM2-135M in
float32, for every kind of draft (the shipped distilled draft, ``model:default``, and the shipped EAGLE
head, ``eagle:default``, as chains and as trees, included), on
dev-set prompts from ten categories."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from draftwise import generate

from draftwise.questions import DEFAULT_QUESTIONS as DEV_QUESTIONS

pytestmark = pytest.mark.real_model
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def dev_prompts() -> list[str]:
    """The first question of each of ten categories (first turn)."""
    seen: dict[str, str] = {}
    for line in DEV_QUESTIONS.read_text().splitlines():
        row = json.loads(line)
        seen.setdefault(row["category"], row["turns"][0])
    prompts = list(seen.values())[:10]
    assert len(prompts) == 10
    return prompts


@pytest.fixture(scope="module")
def truncated_draft(tmp_path_factory, default_folder):
    """A real, different model with the same tokenizer: SmolLM2's first 8 of 30 layers."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("smol-8-layers")
    hf = AutoModelForCausalLM.from_pretrained(default_folder, dtype=torch.float32)
    hf.model.layers = hf.model.layers[:8]
    hf.config.num_hidden_layers = 8
    hf.save_pretrained(folder)
    for f in default_folder.iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def baseline(default_model, dev_prompts):
    return [generate(default_model, p, max_new_tokens=NEW_TOKENS).token_ids for p in dev_prompts]


@pytest.mark.parametrize("draft", ["lookup", "self:exit=15", "model", "model:default", "eagle:default", "eagle:default,topk=4"])
def test_speculative_greedy_equals_plain_greedy(default_model, dev_prompts, baseline, truncated_draft, draft):
    spec = f"model:{truncated_draft}" if draft == "model" else draft
    from draftwise.drafters import make_drafter

    drafter = make_drafter(spec, default_model)  # built once, reused across prompts
    proposed = accepted = 0
    for prompt, expected in zip(dev_prompts, baseline):
        res = generate(default_model, prompt, max_new_tokens=NEW_TOKENS, draft=drafter, k=4)
        assert res.token_ids == expected, f"{draft} diverged on {prompt[:60]!r}"
        proposed += res.stats.proposed
        accepted += res.stats.accepted
    # the draft was really exercised: it proposed, and some proposals were rejected
    assert proposed > 0 and 0 < accepted < proposed
