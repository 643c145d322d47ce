"""``draftwise train-head`` on a tiny random Llama with a tiny chat tokenizer and SmolLM2's chat template (tests/tiny.py).

Magpie's prefix and filters, the feature cache, the loss going down, resume, the time budget, the
saved head and the held-out metric on constructed cases.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.cli import app
from draftwise.eagle import data as head_data
from draftwise.eagle import features as feature_store
from draftwise.eagle.features import FeatureStore, extract_features
from draftwise.eagle.data import (
    filter_instructions,
    heldout_sequences,
    magpie_prompts,
    user_prefix,
)
from draftwise.eagle.run import train_head
from draftwise.eagle.train import (
    TargetParts,
    build_head,
    evaluate_head,
    greedy_acceptance,
    head_loss,
    make_head_batch,
)
from draftwise.eagle.files import load_head, target_fingerprint
from draftwise.questions import Question

PROMPTS = [
    ("writing", "Write a short poem about the sea."),
    ("qa", "What is the capital of France?"),
    ("writing", "Describe a sunrise over the mountains."),
    ("qa", "Why is the sky blue?"),
    ("writing", "Write a haiku about autumn."),
    ("qa", "Who wrote Hamlet?"),
    ("writing", "Write a limerick about a cat."),  # each category's 4th question is held out
    ("qa", "How far away is the Moon?"),
    ("writing", "Describe a storm at sea."),
    ("qa", "What is photosynthesis?"),
]
QUESTIONS = [Question(i, c, (t,)) for i, (c, t) in enumerate(PROMPTS)]
FAST = dict(questions=QUESTIONS, gen_tokens=6, gen_temperatures=[0.0], batch=2, seq_len=16, holdout_percent=30.0,
            vocab_size_draft=300)


def test_magpie_prefix_is_the_chat_template_before_the_user_text(tiny):
    prefix = user_prefix(tiny.tokenizer)
    text = tiny.tokenizer.decode(prefix)
    assert text.endswith("<|im_start|>user\n") and text.startswith("<|im_start|>system")
    assert tiny.encode_prompt("Tell me a story.")[: len(prefix)] == prefix


def test_filter_drops_repeats_short_texts_and_held_out_questions():
    held = ["Describe the history of the Roman empire in three short paragraphs for a child.", "Hello there friend"]
    texts = [
        "Tell me a joke.",
        "  tell me a JOKE!  ",  # the same once normalised
        "Why?",  # too short
        "hello there, friend",  # a held-out question
        "Please describe the history of the Roman empire in three short paragraphs for a child today.",
        "Describe the history of the Roman empire in one sentence.",  # few shared 8-grams: kept
    ]
    assert filter_instructions(texts, held) == ["Tell me a joke.", "Describe the history of the Roman empire in one sentence."]
    flags = heldout_sequences([f"q{i}" for i in range(400)], 10.0)
    assert 20 <= sum(flags) <= 60 and flags == heldout_sequences([f"q{i}" for i in range(400)], 10.0)


def test_magpie_prompts_are_cached_and_resumed(tiny, tmp_path, monkeypatch):
    texts = magpie_prompts(tiny, 5, tmp_path, held_out=[], seed=0, device=torch.device("cpu"))
    assert 0 < len(texts) <= 5 and len(set(texts)) == len(texts)
    rows = [json.loads(line) for line in (tmp_path / head_data.MAGPIE_FILE).read_text().splitlines()]
    assert rows and all(len(r["texts"]) == head_data.GEN_BATCH for r in rows)

    def no_sampling(*args, **kwargs):
        raise AssertionError("a cached batch was drawn again")

    monkeypatch.setattr(head_data, "_sample", no_sampling)
    assert magpie_prompts(tiny, len(texts), tmp_path, held_out=[], seed=0, device=torch.device("cpu")) == texts


@pytest.fixture(scope="module")
def store(tiny, tmp_path_factory):
    seqs = [tiny.encode_prompt(q.prompt) + [5, 6, 7, 2] for q in QUESTIONS[:4]]
    return extract_features(tiny, seqs, [len(s) - 4 for s in seqs], tmp_path_factory.mktemp("data")), seqs


def test_features_match_the_runtime_and_the_cache_resumes(tiny, store, tmp_path, monkeypatch):
    feats, seqs = store
    rt = tiny.runtime
    rt.capture_features(None)
    logits = rt.forward(seqs[1])
    want = rt.features(0, len(seqs[1]))
    rt.capture_features(enabled=False)
    rt.rollback(0)
    assert torch.allclose(feats.rows("feats", 1).float(), want, rtol=2e-3, atol=2e-3)
    assert torch.allclose(feats.rows("lse", 1), torch.logsumexp(logits, -1), atol=1e-4)
    assert torch.equal(feats.rows("top", 1).long(), logits.argmax(-1))
    assert torch.equal(feats.ids[1], torch.tensor(seqs[1]))
    # a resumed extraction passes over only the sequences not in the index
    calls = []
    real = feature_store._target_pass
    monkeypatch.setattr(feature_store, "_target_pass", lambda runtime, ids, aux: calls.append(1) or real(runtime, ids, aux))
    extract_features(tiny, seqs[:2], [1, 1], tmp_path)
    again = extract_features(tiny, seqs, [1] * 4, tmp_path)
    assert len(calls) == 4
    assert all(torch.equal(again.rows("feats", i), feats.rows("feats", i)) for i in range(4))
    assert not (tmp_path / "features" / "chunk-00002.safetensors").exists()


def test_a_few_steps_lower_the_loss_on_a_fixed_batch(tiny, store):
    feats, _ = store
    parts = TargetParts.of(tiny.runtime, list(range(300)), torch.device("cpu"))
    head = build_head(tiny, init="layer", seed=0)
    batch = make_head_batch(feats, [0, 1, 2], parts, window=16, eos={2}, response_only=False, device=torch.device("cpu"))
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss, kl, reg = head_loss(head, parts, batch, reg_weight=0.1, noise=0.01, generator=torch.Generator().manual_seed(0))
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.8 * losses[0]
    # fc starts as the identity on the feature half
    d = head.cfg.hidden_size
    fresh = build_head(tiny, init="layer", seed=0)
    assert torch.equal(fresh.fc.weight[:, d:], torch.eye(d)) and not fresh.fc.weight[:, :d].any()


def test_greedy_acceptance_on_constructed_cases():
    q = torch.full((4, 3), -100.0)
    q[0, 2] = q[1, 0] = q[2, 1] = q[3, 2] = 100.0  # draft picks rows 2, 0, 1, 2
    vocab = torch.tensor([10, 11, 12])
    target = torch.tensor([12, 10, 99, 11])  # hit, hit, not in V', miss
    assert greedy_acceptance(q, vocab, target) == (2, 4, 2, 3)
    assert greedy_acceptance(q, None, torch.tensor([2, 0, 0, 2])) == (3, 4, 3, 4)


def test_heldout_metric_is_one_for_a_head_that_returns_the_true_feature(tiny, store):
    feats, _ = store
    parts = TargetParts.of(tiny.runtime, None, torch.device("cpu"))

    class Oracle(torch.nn.Module):  # predicts f_{t+1} exactly, from the stored features
        def forward(self, embeds, f, positions):
            return feats.rows("feats", self.i)[positions + 1].float()

        def lift(self, f):
            return f

        def rollout(self, embeds, f, positions, steps):  # and every drafted row as well
            return [self(embeds, f, positions)] * steps

    oracle = Oracle()
    for i in range(len(feats)):
        oracle.i = i
        got = evaluate_head(oracle, parts, feats, [i], eos={2}, device=torch.device("cpu"))
        assert got["acceptance"] > 0.99 and got["positions"] == 3  # responses [5, 6, 7, 2]: rows j = P .. P+2
        assert got["acceptance_second"] > 0.99


def test_run_saves_a_head_that_loads_and_resume_continues(tiny, tmp_path):
    out = tmp_path / "head"
    first = train_head(tiny, out, steps=3, snapshot_every=2, **FAST)
    assert (first.steps, first.stopped) == (3, "completed") and first.heldout_sequences > 0
    fp = target_fingerprint(tiny.tokenizer, int(tiny.config.hidden_size), tiny.runtime.vocab_size)
    loaded = load_head(out, fingerprint=fp)
    assert loaded.draft_tokens is not None and len(loaded.draft_tokens) == 300
    assert loaded.meta["steps"] == 3 and 0 <= loaded.meta["heldout"]["acceptance"] <= 1
    with pytest.raises(ConfigError, match="trained for"):
        load_head(out, fingerprint="0" * 16)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "acceptance" in r] == [0, 2, 3]
    resumed = train_head(tiny, out, steps=5, snapshot_every=2, resume=True, questions=QUESTIONS)
    assert (resumed.steps, resumed.planned_steps) == (5, 5)
    assert load_head(out).draft_tokens.tolist() == loaded.draft_tokens.tolist()
    steps = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 5
    with pytest.raises(ConfigError, match="differs from the checkpoint"):
        train_head(tiny, out, steps=6, resume=True, questions=QUESTIONS, lr=0.5)
    with pytest.raises(ConfigError, match="already holds"):
        train_head(tiny, out, steps=1, **FAST)


def run_store(tiny, out) -> tuple[FeatureStore, list[bool]]:
    """The features of an EAGLE-1 run's own sequences (from its cache) and which of them it held out."""
    rows = [json.loads(line) for line in (out / "data" / "sequences.jsonl").read_text().splitlines()]
    prompts = [QUESTIONS[r["question_id"]].prompt for r in rows]
    store = extract_features(tiny, [r["ids"] for r in rows], [len(tiny.encode_prompt(p)) for p in prompts], out / "data")
    return store, heldout_sequences(prompts, FAST["holdout_percent"])


def heldout_curve(out) -> list[float]:
    """The held-out acceptance the run logged: at step 0 (the untrained head), then per snapshot."""
    return [row["acceptance"] for row in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if "acceptance" in row]


def test_a_trained_head_beats_its_untrained_start_on_the_same_sequences(tiny, tmp_path):
    out = tmp_path / "learned"
    # the whole vocabulary: with a reduced one, the loss weighs each row by the target's mass inside
    # it, a fraction of a percent on this near-uniform random target, and 3 steps barely move it
    train_head(tiny, out, steps=3, snapshot_every=3, **{**FAST, "vocab_size_draft": 0, "lr": 3e-3})
    store, held = run_store(tiny, out)
    parts = TargetParts.of(tiny.runtime, None, torch.device("cpu"))
    untrained, trained = build_head(tiny, init="layer", seed=0), load_head(out).head  # the run's init and seed

    def kl(head, which: bool) -> float:
        rows = [i for i, h in enumerate(held) if h == which]
        batch = make_head_batch(store, rows, parts, window=None, eos={2}, response_only=False, device=torch.device("cpu"))
        with torch.no_grad():
            return head_loss(head, parts, batch, reg_weight=0.0, noise=0.0)[1]

    # against the untrained start (a run that does not learn keeps it: ratio 1, equal acceptance).
    # Measured on the tiny chat model: KL 0.0183 -> 0.0135 on the training sequences and held
    # out, held-out acceptance 0.083 -> 0.125 (3 of 24 positions)
    for which in (False, True):
        assert kl(trained, which) < 0.9 * kl(untrained, which), which
    curve = heldout_curve(out)
    assert len(curve) == 2 and curve[1] > curve[0], curve


def test_time_budget_stops_cleanly(tiny, tmp_path):
    result = train_head(tiny, tmp_path / "h", steps=50, time_budget=1e-3, snapshot_every=10, feature_norm=True, **FAST)
    assert result.stopped == "time budget" and result.steps == 1
    assert load_head(tmp_path / "h").head.cfg.feature_norm


@pytest.mark.parametrize(
    "args, match",
    [
        (["--resume", "--overwrite"], "not both"),
        (["--device", "nonsense:7"], "nonsense"),
        (["--gen-temperatures", "0,x"], "comma-separated"),
        (["--lr", "0"], "lr=0.0 must be"),
        (["--resume"], "nothing to resume"),
    ],
)
def test_cli_bad_input_is_one_line(tiny_chat_folder, tmp_path, args, match):
    result = CliRunner().invoke(app, ["train-head", "--target", str(tiny_chat_folder), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert match in result.output and "Traceback" not in result.output
