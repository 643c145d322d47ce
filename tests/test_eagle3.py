"""EAGLE-3 heads: the fused-feature layer, the training-time test, drafting, training and the
``eagle3`` export.

- The training-time test (``EagleHead.rollout``) computes, for every row and step, exactly what
  drafting with the head's cache computes for that chain (EAGLE-1 and EAGLE-3 layers).
- An EAGLE-3 drafter proposes from scratch what it proposes incrementally, and greedy decoding
  with it equals plain greedy decoding.
- ``train-head --arch eagle3 --ttt 2`` stores the three layers' features as the runtime records
  them, trains, saves a head that loads and drafts losslessly.
- The export carries the speculators ``eagle3`` names and config; where ``speculators`` is
  importable, its own config class accepts the file and its ``Eagle3DraftModel`` loaded from the
  file computes our head's logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftwise.core.decode import decode_steps
from draftwise.eagle.features import extract_features
from draftwise.eagle.data import heldout_sequences
from draftwise.eagle.export import CONFIG_FILE, WEIGHTS_FILE, export_speculators, validate_speculators_config
from draftwise.eagle.run import train_head
from draftwise.eagle.train import TTT_DECAY, TargetParts, build_head, head_loss, make_head_batch
from draftwise.eagle.drafter import EagleDrafter, eagle_drafter
from draftwise.eagle.head import EagleHead, HeadCache, HeadConfig, default_aux_layers, rollout_mask
from draftwise.eagle.files import LoadedHead, load_head, save_head
from draftwise.errors import ConfigError
from draftwise.runtime.native import NativeRuntime
from draftwise.core.sampling import SamplingConfig

from .conftest import random_hf_model, tiny_llama_config
from .test_eagle import _greedy
from .test_train_head import FAST, QUESTIONS, heldout_curve

V = 40
AUX = (0, 1, 2)


@pytest.fixture(scope="module")
def target(one_thread):
    config = tiny_llama_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = random_hf_model(config, seed=5)
    return NativeRuntime(hf.config, hf.state_dict())


def _head(rt: NativeRuntime, arch: str, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    cfg = HeadConfig.from_target(rt.config, arch=arch, aux_layers=AUX if arch == "eagle3" else None)
    head = EagleHead(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    return head.eval().requires_grad_(False)


def test_default_layers_follow_vllm_and_configs_check_their_arch():
    assert default_aux_layers(30) == (1, 14, 26)  # vLLM's ids 2, 15, 27 number layer inputs
    assert default_aux_layers(2) == (1, 0, 0)
    with pytest.raises(ConfigError, match="arch"):
        HeadConfig(8, 2, 1, 4, 16, 1e-5, 1e4, arch="medusa")
    with pytest.raises(ConfigError, match="aux_layers"):
        HeadConfig(8, 2, 1, 4, 16, 1e-5, 1e4, arch="eagle3")


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_rollout_equals_drafting_each_chain(target, arch):
    """Row t of step j equals the j-th drafted row after real rows 0 .. t - j, drafted with the
    head's cache and the tokens that followed (teacher forcing)."""
    head = _head(target, arch)
    n, d = 9, 32
    width = 3 * d if arch == "eagle3" else d
    g = torch.Generator().manual_seed(1)
    embeds, feats = torch.randn(1, n, d, generator=g), torch.randn(1, n, width, generator=g)
    positions = torch.arange(n)[None]
    with torch.no_grad():
        outs = head.rollout(embeds, head.lift(feats), positions, 3)
        assert torch.allclose(outs[0], head(embeds, head.lift(feats), positions), atol=1e-5)
        for j in range(1, 3):
            for t in range(j, n):
                p = t - j
                cache = HeadCache(head.cfg, 32)
                h = head(embeds[:, : p + 1], head.lift(feats[:, : p + 1]), positions[:, : p + 1], cache)[:, -1:]
                for i in range(1, j + 1):
                    h = head(embeds[:, p + i : p + i + 1], h, positions[:, p + i : p + i + 1], cache)
                assert torch.allclose(outs[j][0, t], h[0, 0], atol=1e-5), (j, t)


def test_rollout_mask_rows_always_see_themselves():
    for step in range(4):
        mask = rollout_mask(6, step)
        assert mask.shape == (6, 6 * (step + 1)) and bool(mask.any(-1).all())
        assert bool(mask[:, step * 6 :].diagonal().all())


def test_eagle3_drafting_is_incremental_exact_and_greedy_lossless(target):
    head = _head(target, "eagle3")
    drafter = EagleDrafter(target, LoadedHead(head, None, {}))
    assert _greedy(target, drafter, k=3) == _greedy(target, None, k=1)
    tree = EagleDrafter(target, LoadedHead(head, None, {}), topk=3, depth=3)
    assert _greedy(target, tree, k=6) == _greedy(target, None, k=1)
    # a proposal after those steps equals one computed from scratch
    context = [5, 6, 7, 8, 5, 6, 7, 1, 2, 3] + _greedy(target, None, k=1, n=7)
    target.rollback(0)
    target.capture_features(AUX)
    target.prefill(context[:-1])
    got = drafter.propose(context, 3).tokens
    n = len(context) - 1
    cache = HeadCache(head.cfg, 128)
    parts = drafter.parts
    with torch.no_grad():
        h = head(parts.embed(context[1:])[None], head.lift(target.features(0, n).float())[None], torch.arange(n)[None], cache)
        h = h[0, -1:]
        want = []
        for i in range(3):
            token = int(parts.logits(h)[0].argmax())
            want.append(token)
            h = head(parts.embed([token])[None], h[None], torch.tensor([[n + i]]), cache)[0]
    assert got == want
    target.capture_features(enabled=False)
    target.rollback(0)


def test_eagle1_and_eagle3_heads_take_turns_on_one_runtime(target):
    """A bench or a server builds every drafter first, then runs them in turn on one target:
    each generation must record its own head's layers, from the prefill on."""
    one = EagleDrafter(target, LoadedHead(_head(target, "eagle1"), None, {}))
    three = EagleDrafter(target, LoadedHead(_head(target, "eagle3"), None, {}))
    plain = _greedy(target, None, k=1)
    for drafter in (one, three, one):
        assert _greedy(target, drafter, k=3) == plain


def test_a_head_fusing_layers_the_target_lacks_is_refused(target):
    cfg = HeadConfig.from_target(target.config, arch="eagle3", aux_layers=(0, 1, 7))
    with pytest.raises(ConfigError, match="fuses layers"):
        EagleDrafter(target, LoadedHead(EagleHead(cfg), None, {}))


def test_features_store_the_fused_layers_as_the_runtime_records_them(tiny, tmp_path):
    seqs = [tiny.encode_prompt(q.prompt) + [5, 6, 7, 2] for q in QUESTIONS[:2]]
    aux = default_aux_layers(int(tiny.runtime.num_layers))
    store = extract_features(tiny, seqs, [len(s) - 4 for s in seqs], tmp_path, aux_layers=aux)
    plain = extract_features(tiny, seqs, [len(s) - 4 for s in seqs], tmp_path)  # one folder, two layer sets
    index = json.loads((tmp_path / "features" / "index.json").read_text())
    assert index["layer_sets"] == [list(aux), None] and index["chunks"] == 2
    rt = tiny.runtime
    rt.capture_features(aux)
    rt.forward(seqs[1])
    want = rt.features(0, len(seqs[1]))
    rt.capture_features(enabled=False)
    rt.rollback(0)
    assert store.has_aux and not plain.has_aux
    assert torch.allclose(store.rows("aux", 1).float(), want, rtol=2e-3, atol=2e-3)
    for i in range(2):  # the last layer, as an EAGLE-1 head reads it
        assert torch.equal(store.rows("feats", i), plain.rows("feats", i))
    parts = TargetParts.of(rt, None, torch.device("cpu"))
    batch = make_head_batch(store, [0, 1], parts, window=8, eos={2}, response_only=False, device=torch.device("cpu"))
    assert batch.feats.shape[-1] == 3 * int(tiny.config.hidden_size)


def _second_token_kl(tiny, out, head, held_out: bool) -> float:
    """KL(target || head) of the second drafted token of each chain (the training-time test's
    step 1), teacher-forced over the run's own training or held-out sequences, full vocabulary."""
    rows = [json.loads(line) for line in (out / "data" / "sequences.jsonl").read_text().splitlines()]
    prompts = [QUESTIONS[r["question_id"]].prompt for r in rows]
    store = extract_features(tiny, [r["ids"] for r in rows], [len(tiny.encode_prompt(p)) for p in prompts],
                             out / "data", aux_layers=head.cfg.aux_layers)
    which = [i for i, h in enumerate(heldout_sequences(prompts, FAST["holdout_percent"])) if h == held_out]
    parts = TargetParts.of(tiny.runtime, None, torch.device("cpu"))
    batch = make_head_batch(store, which, parts, window=None, eos={2}, response_only=False, device=torch.device("cpu"))
    with torch.no_grad():  # reg_weight 0: loss = KL_0 + TTT_DECAY * KL_1
        loss, kl0, _ = head_loss(head, parts, batch, reg_weight=0.0, noise=0.0, ttt=2)
    return (float(loss) - kl0) / TTT_DECAY


def test_train_head_eagle3_with_the_training_time_test_saves_a_lossless_head(tiny, tmp_path):
    out = tmp_path / "h3"
    # the whole vocabulary (as in test_train_head's learning check) at lr 3e-3: 2 steps take the
    # second token's KL from 0.036 to 0.023 (0.64x) on the tiny chat model, on both splits
    result = train_head(tiny, out, steps=2, snapshot_every=2, arch="eagle3", ttt=2,
                        **{**FAST, "vocab_size_draft": 0, "lr": 3e-3})
    assert result.steps == 2
    loaded = load_head(out)
    untrained = build_head(tiny, init="layer", seed=0, arch="eagle3")  # the run's init and seed
    for held_out in (False, True):  # against the untrained start: a run that does not learn keeps it
        kl = _second_token_kl(tiny, out, loaded.head, held_out)
        assert kl < 0.9 * _second_token_kl(tiny, out, untrained, held_out), held_out
    # the untrained head (step 0, random fusion layer) accepts nothing held out; 2 steps: 0.17
    curve = heldout_curve(out)
    assert len(curve) == 2 and curve[1] > curve[0], curve
    assert loaded.head.cfg.arch == "eagle3" and loaded.head.cfg.aux_layers == default_aux_layers(int(tiny.runtime.num_layers))
    assert loaded.meta["settings"]["ttt"] == 2
    drafter = eagle_drafter(str(out), tiny)
    prompt = tiny.encode_prompt("Write a haiku about autumn.")
    plain, spec = [], []
    for drafter_, sink in ((None, plain), (drafter, spec)):
        steps = decode_steps(tiny.runtime, prompt, SamplingConfig(), torch.Generator(), drafter=drafter_, k=3)
        for step in steps:
            sink += step.verdict.tokens
            if len(sink) >= 20:
                break
        steps.close()
    assert spec[:20] == plain[:20]
    with pytest.raises(ConfigError, match="ttt=0 must be"):
        train_head(tiny, tmp_path / "bad", steps=1, ttt=0, **FAST)


# -- the eagle3 export ------------------------------------------------------------------------------

D, VOCAB, DRAFT = 8, 12, [7, 2, 5, 11]
CFG3 = HeadConfig(hidden_size=D, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=16,
                  rms_norm_eps=1e-5, rope_theta=50000.0, arch="eagle3", aux_layers=(1, 3, 5))
TARGET = {"name": "default", "fingerprint": "f" * 16, "hidden_size": D, "vocab_size": VOCAB, "num_layers": 8}


@pytest.fixture
def exported(tmp_path):
    torch.manual_seed(0)
    head = EagleHead(CFG3)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    folder = save_head(tmp_path / "head", head.eval(), draft_tokens=DRAFT, target=TARGET)
    norm, lm_head = torch.rand(D) + 0.5, torch.randn(VOCAB, D)
    out = export_speculators(folder, tmp_path / "out", verifier="org/target", final_norm=norm, lm_head=lm_head, k=3)
    return head, norm, lm_head, out


def test_eagle3_export_names_shapes_and_config(exported, tmp_path):
    head, norm, lm_head, out = exported
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["speculators_config"]["algorithm"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6] and cfg["draft_vocab_size"] == len(DRAFT)
    assert cfg["norm_before_residual"] is False and cfg["target_hidden_size"] == D
    tensors = load_file(str(out / WEIGHTS_FILE))
    assert tensors["fc.weight"].shape == (D, 3 * D) and tensors["layers.0.self_attn.q_proj.weight"].shape == (8, 2 * D)
    assert torch.equal(tensors["layers.0.hidden_norm.weight"], head.hidden_norm.weight)
    assert torch.equal(tensors["norm.weight"], norm)
    assert torch.equal(tensors["lm_head.weight"], lm_head[sorted(DRAFT)])  # rows in ascending token id
    assert tensors["t2d"].nonzero().flatten().tolist() == sorted(DRAFT)
    with pytest.raises(ConfigError, match="final norm and LM head"):
        export_speculators(tmp_path / "head", tmp_path / "o2", verifier="org/target", final_norm=norm)


def test_speculators_eagle3_model_loads_the_export_and_computes_our_logits(exported):
    """Skipped where speculators is not importable (it pins transformers <= 5.19 and pulls
    torchvision and datasets, so it is not a dependency); see docs/eagle.md for the run."""
    pytest.importorskip("speculators")
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    head, norm, lm_head, out = exported
    assert validate_speculators_config(out) is None
    config = Eagle3SpeculatorConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel(config)
    state = load_file(str(out / WEIGHTS_FILE))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith(("embed_tokens", "verifier_")) for k in missing), missing
    n = 6
    g = torch.Generator().manual_seed(2)
    aux, ids = torch.randn(1, n, 3 * D, generator=g), torch.randint(0, VOCAB, (1, n), generator=g)
    embed = torch.randn(VOCAB, D, generator=g)
    model.embed_tokens.weight.data.copy_(embed)
    captured: list[torch.Tensor] = []
    model.layers[0].register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        theirs = model(aux, ids, document_ids=torch.zeros(1, n, dtype=torch.long), ttt_steps=1)
        ours_h = head(torch.nn.functional.embedding(ids, embed), head.lift(aux), torch.arange(n)[None])
        ours = torch.nn.functional.linear(torch.nn.functional.rms_norm(ours_h, (D,), norm, 1e-5), lm_head[sorted(DRAFT)])
    assert torch.allclose(captured[0].reshape(ours_h.shape), ours_h, atol=1e-4)
    assert torch.equal(theirs[0].reshape(-1), ours.argmax(-1).reshape(-1))
