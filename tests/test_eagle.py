"""The EAGLE drafter and its head files: specs, loading and refusing heads, exact incremental
drafting (the head's cache and the target's features after rollbacks and trees), greedy equality.

The sampled-mode distribution checks for the head are in test_distribution.py (drafter "eagle").
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from draftwise.core.decode import decode_steps
from draftwise.eagle.drafter import EagleDrafter, default_head_folder, eagle_drafter
from draftwise.eagle.parts import TargetParts
from draftwise.eagle.head import EagleHead, HeadCache, HeadConfig
from draftwise.eagle.files import HEAD_META, HEAD_WEIGHTS, LoadedHead, load_head, save_head, target_fingerprint
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.runtime.native import NativeRuntime
from draftwise.core.sampling import SamplingConfig

from .conftest import random_hf_model, tiny_llama_config

V = 40


class _Tok:
    def __init__(self, n: int, salt: str = "") -> None:
        self.vocab = {f"t{i}{salt}": i for i in range(n)}

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


@pytest.fixture(scope="module")
def target(one_thread):
    config = tiny_llama_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = random_hf_model(config, seed=3)
    return NativeRuntime(hf.config, hf.state_dict())


def _head(rt: NativeRuntime, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.from_target(rt.config))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    return head.eval().requires_grad_(False)


def _drafter(rt: NativeRuntime, rows: torch.Tensor | None = None, seed: int = 0, weights: str = "float32") -> EagleDrafter:
    return EagleDrafter(rt, LoadedHead(_head(rt, seed), rows, {}), weights=weights)  # type: ignore[arg-type]


def test_specs_parse_and_print():
    assert str(DraftSpec.parse(" eagle:default ")) == "eagle:default"
    assert DraftSpec.parse("eagle:/tmp/h,x").source == "/tmp/h,x"
    with pytest.raises(ConfigError, match="eagle: needs a path"):
        DraftSpec.parse("eagle:")


def test_head_folder_round_trip_and_refusals(tmp_path, target):
    head = _head(target)
    fp = target_fingerprint(_Tok(V), 32, V)
    save_head(tmp_path / "h", head, draft_tokens=[0, 5, 7], target={"name": "tiny", "fingerprint": fp,
                                                                       "hidden_size": 32, "vocab_size": V})
    loaded = load_head(tmp_path / "h", fingerprint=fp)
    assert loaded.draft_tokens.tolist() == [0, 5, 7] and loaded.meta["draft_vocab_size"] == 3
    for name, p in head.state_dict().items():
        assert torch.equal(loaded.head.state_dict()[name], p), name
    other = target_fingerprint(_Tok(V, salt="x"), 32, V)
    assert other != fp and target_fingerprint(_Tok(V), 48, V) != fp
    with pytest.raises(ConfigError, match="trained for tiny"):
        load_head(tmp_path / "h", fingerprint=other)
    with pytest.raises(ConfigError, match="no draft head at"):
        load_head(tmp_path / "missing")
    (tmp_path / "h" / HEAD_WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="damaged"):
        load_head(tmp_path / "h", fingerprint=fp)
    (tmp_path / "h" / HEAD_META).write_text("{")
    with pytest.raises(ConfigError, match="damaged"):
        load_head(tmp_path / "h")
    (tmp_path / "h" / HEAD_META).unlink()
    with pytest.raises(ConfigError, match="lacks draftwise_head.json"):
        load_head(tmp_path / "h")


def test_head_weights_that_do_not_fit_the_config_are_refused(tmp_path, target):
    fp = target_fingerprint(_Tok(V), 32, V)
    save_head(tmp_path / "h", _head(target), draft_tokens=None, target={"fingerprint": fp, "hidden_size": 32, "vocab_size": V})
    meta = json.loads((tmp_path / "h" / HEAD_META).read_text())
    meta["config"]["intermediate_size"] = 80
    (tmp_path / "h" / HEAD_META).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="do not fit"):
        load_head(tmp_path / "h", fingerprint=fp)


def test_eagle_default_without_a_shipped_head_says_how_to_train_one(tmp_path):
    fake = SimpleNamespace(folder=tmp_path / "no-such-model", name="tiny")
    with pytest.raises(ConfigError, match="train-head"):
        default_head_folder(fake)
    with pytest.raises(ConfigError, match="train-head"):
        eagle_drafter("default", fake)


def test_drafters_of_one_head_share_its_weights_and_keep_their_own_caches(tmp_path, target):
    """A server's slots each build a drafter: one copy of the head and the target's parts between
    them, each its own head cache; another target, or the head file rewritten, loads afresh."""
    fp = target_fingerprint(_Tok(V), 32, V)
    info = {"name": "tiny", "fingerprint": fp, "hidden_size": 32, "vocab_size": V}
    save_head(tmp_path / "h", _head(target), draft_tokens=None, target=info)
    model = SimpleNamespace(runtime=target, tokenizer=_Tok(V))
    a, b = eagle_drafter(str(tmp_path / "h"), model), eagle_drafter(str(tmp_path / "h"), model)
    assert a.head is b.head and a.parts is b.parts and a.cache is not b.cache
    # drafting with one leaves the other's state alone: b drafts as a fresh drafter does
    context = [1, 5, 9, 3, 7, 2]
    want = _reference(target, a, context, 4)
    for drafter in (a, b, a):
        target.rollback(0)
        target.prefill(context[:-1])
        drafter.start(context[:-1], SamplingConfig(), torch.Generator())
        assert drafter.propose(context, 4).tokens == want
    hf = random_hf_model(target.config, seed=3)  # the same weights, another runtime: another model's
    c = eagle_drafter(str(tmp_path / "h"), SimpleNamespace(runtime=NativeRuntime(hf.config, hf.state_dict()),
                                                           tokenizer=_Tok(V)))
    assert c.parts is not a.parts and c.head is not a.head
    weights = tmp_path / "h" / HEAD_WEIGHTS
    before = weights.stat().st_mtime_ns
    save_head(tmp_path / "h", _head(target, seed=1), draft_tokens=None, target=info)  # retrained, same folder
    os.utime(weights, ns=(before + 10**9, before + 10**9))  # a second later (file times tick coarsely)
    d = eagle_drafter(str(tmp_path / "h"), model)
    assert d.head is not a.head and not torch.equal(d.head.fc.weight, a.head.fc.weight)


def _reference(rt: NativeRuntime, drafter: EagleDrafter, context: list[int], k: int,
               tops: list[float] | None = None) -> list[int]:
    """The greedy chain from scratch: a fresh target prefill of the context for features, a fresh
    head cache, every real row at once, then k drafted rows (``tops``: gets each row's top
    probability over the whole vocabulary)."""
    rt.rollback(0)
    rt.prefill(context[:-1])
    n = len(context) - 1
    feats = rt.features(0, n)
    cache = HeadCache(drafter.head.cfg, 128)
    parts = drafter.parts
    with torch.inference_mode():
        h = drafter.head(parts.embed(context[1:])[None], feats[None], torch.arange(n)[None], cache)[0, -1:]
        out = []
        for i in range(k):
            logits = parts.logits(h)[0]
            token = int(logits.argmax())
            out.append(token)
            if tops is not None:
                tops.append(float(torch.softmax(logits, -1).max()))
            h = drafter.head(parts.embed([token])[None], h[None], torch.tensor([[n + i]]), cache)[0]
    return out


@pytest.mark.parametrize("rows,weights", [(None, "float32"), ("reduced", "float32"), (None, "int8"), ("reduced", "int8")])
def test_incremental_drafting_equals_drafting_from_scratch(target, rows, weights):
    """Across steps with rejections (rollback of the head's cache and the target's), every
    proposal equals the one computed from scratch for the same context, with the head as
    trained and in int8."""
    index = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34, 7, 9, 11]) if rows else None
    drafter = _drafter(target, index, weights=weights)
    prompt = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7]
    generator = torch.Generator().manual_seed(0)
    seen = []
    steps = decode_steps(target, prompt, SamplingConfig(), generator, drafter=drafter, k=3)
    context = list(prompt)
    for i, step in enumerate(steps):
        context += step.verdict.tokens
        if i == 6:
            break
        proposal = drafter.propose(context, 3).tokens
        scored = drafter.propose_scored(context, 3)
        assert scored.tokens == proposal
        seen.append((list(context), proposal, scored.scores))
    steps.close()
    assert len(seen) >= 5
    for context, proposal, scores in seen[-3:]:
        ref_drafter = _drafter(target, index, weights=weights)
        tops: list[float] = []
        assert _reference(target, ref_drafter, context, 3, tops) == proposal
        # a scored chain: the running product of the head's top probabilities along it
        assert scores == pytest.approx([tops[0], tops[0] * tops[1], tops[0] * tops[1] * tops[2]], rel=1e-5)
        if index is not None:
            assert set(proposal) <= set(index.tolist())


PROMPT = [5, 6, 7, 8, 5, 6, 7, 1, 2, 3]


def _greedy(rt: NativeRuntime, drafter: EagleDrafter | None, k: int, n: int = 40) -> list[int]:
    """The first n greedy tokens after PROMPT."""
    out: list[int] = []
    steps = decode_steps(rt, PROMPT, SamplingConfig(), torch.Generator(), drafter=drafter, k=k)
    for step in steps:
        out += step.verdict.tokens
        if len(out) >= n:
            break
    steps.close()
    return out[:n]


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_greedy_with_the_head_equals_plain_greedy(target, weights):
    assert _greedy(target, _drafter(target, weights=weights), k=4) == _greedy(target, None, k=1)


def test_int8_drafting_copies_the_head_and_stays_close_to_it(target):
    """int8 drafting leaves the trained head as it is (training keeps float32), quantizes the
    decoder layer's matmuls but not fc, and each int8 layer stays within a few percent of it."""
    loaded = LoadedHead(_head(target), None, {})
    before = {name: p.clone() for name, p in loaded.head.state_dict().items()}
    drafter = EagleDrafter(target, loaded, weights="int8")
    assert all(torch.equal(before[n], p) for n, p in loaded.head.state_dict().items())
    assert type(loaded.head.q_proj) is torch.nn.Linear and drafter.head.q_proj is not loaded.head.q_proj
    assert drafter.head.fc is not loaded.head.fc and type(drafter.head.fc) is torch.nn.Linear
    x = torch.randn(3, 5, loaded.head.q_proj.in_features)
    want, got = loaded.head.q_proj(x), drafter.head.q_proj(x)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())
    h = torch.randn(4, 32)
    float_scores = TargetParts(target, None).scores(h)
    int8_scores = drafter.parts.scores(h)
    assert float((int8_scores - float_scores).abs().max()) <= 0.05 * float(float_scores.abs().max())
    with pytest.raises(ConfigError, match="float32 or int8"):
        EagleDrafter(target, loaded, weights="int4")  # type: ignore[arg-type]


def test_eagle_specs_draft_in_int8_on_a_cpu_whose_kernel_works(monkeypatch):
    from draftwise.eagle import drafter as eagle

    monkeypatch.setattr(eagle, "kernel_works", lambda kind: kind == "int8")
    assert eagle.default_head_weights() == "int8"
    assert eagle.default_head_weights("meta") == "float32"
    monkeypatch.setattr(eagle, "kernel_works", lambda kind: False)
    assert eagle.default_head_weights() == "float32"


def test_a_runtime_without_feature_capture_is_refused():
    class NoFeatures:
        vocab_size, max_context, length = V, 64, 0

    with pytest.raises(ConfigError, match="cannot record features"):
        EagleDrafter(NoFeatures(), LoadedHead(EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 1e4)), None, {}))


def test_target_parts_reduced_vocabulary_scores_only_its_rows(target):
    parts = TargetParts(target, torch.tensor([4, 9]))
    logits = parts.logits(torch.randn(2, 32))
    assert logits.shape == (2, V)
    finite = torch.isfinite(logits).nonzero()[:, 1].unique().tolist()
    assert finite == [4, 9]


@pytest.mark.parametrize("rows", [None, [2, 4, 9, 17, 30]])
def test_best_is_the_argmax_of_the_logits_and_its_probability(target, rows):
    # greedy drafts from the head's own rows; logits spreads them over the whole vocabulary
    parts = TargetParts(target, None if rows is None else torch.tensor(rows))
    for seed in range(5):
        hidden = torch.randn(1, 32, generator=torch.Generator().manual_seed(seed))
        logits = parts.logits(hidden)[0]
        token, top = parts.best(hidden)
        assert token == int(logits.argmax())
        assert top == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-6)


def test_greedy_trees_equal_plain_greedy_and_respect_the_budget(target):
    """EAGLE-2 trees (top-3 children, depth 4) at a budget of 7 nodes: every proposal is a tree
    of at most 7 nodes, some are not chains, and the output equals plain greedy decoding."""
    drafter = EagleDrafter(target, LoadedHead(_head(target, seed=1), None, {}), topk=3, depth=4)
    real_propose, shapes = drafter.propose, []

    def spy(context, k):
        draft = real_propose(context, k)
        shapes.append((k, len(draft), draft.tree))
        return draft

    drafter.propose = spy  # type: ignore[method-assign]
    assert _greedy(target, drafter, k=7) == _greedy(target, None, k=1)
    assert all(n <= k for k, n, _ in shapes)
    assert any(tree is not None and not tree.is_chain for _, _, tree in shapes)
    assert max(tree.depth for _, _, tree in shapes if tree is not None) >= 2
