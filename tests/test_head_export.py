"""A draft head written in the speculators ``eagle`` layout: fields, names, exact tensors, and a
forward pass through transformers' own Llama layer built from the exported file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import load_file
from typer.testing import CliRunner

from draftwise.cli.export_head import export_head_cmd
from draftwise.eagle.drafter import fingerprint_of
from draftwise.eagle.head import EagleHead, HeadConfig
from draftwise.eagle.files import save_head
from draftwise.errors import ConfigError
from draftwise.eagle.export import (
    CONFIG_FILE,
    FINAL_NORM_NAME,
    WEIGHT_NAMES,
    WEIGHTS_FILE,
    export_speculators,
    validate_speculators_config,
    verifier_id,
    vocab_maps,
)

CFG = HeadConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                 intermediate_size=16, rms_norm_eps=1e-5, rope_theta=50000.0)
VOCAB = 12
DRAFT = [7, 2, 5, 11]
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TARGET = {"name": "default", "fingerprint": "f" * 16, "hidden_size": 8, "vocab_size": VOCAB, "num_layers": 2}


def _head(seed: int = 0, cfg: HeadConfig = CFG) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)  # norms too, so a norm taken from the wrong place shows up
    return head.eval()


@pytest.fixture
def head_folder(tmp_path) -> Path:
    return save_head(tmp_path / "head", _head(), draft_tokens=DRAFT, target=TARGET)


def test_config_names_the_eagle_type_the_layer_and_the_verifier(head_folder, tmp_path):
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL, final_norm=torch.ones(8), k=3,
                             max_positions=2048)
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert cfg["speculators_model_type"] == "eagle" and cfg["speculators_config"]["algorithm"] == "eagle"
    assert (cfg["layernorms"], cfg["fusion_bias"], cfg["draft_vocab_size"]) == (True, False, len(DRAFT))
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1 and layer["vocab_size"] == VOCAB
    assert (layer["hidden_size"], layer["intermediate_size"], layer["head_dim"]) == (8, 16, 4)
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["max_position_embeddings"]) == (2, 1, 2048)
    assert layer["rope_theta"] == layer["rope_parameters"]["rope_theta"] == 50000.0
    spec = cfg["speculators_config"]
    assert spec["verifier"]["name_or_path"] == SMOL and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [
        {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
    ]
    notes = " ".join(cfg["draftwise"]["not_represented"])
    assert "embedding_layernorm" in notes and "before its final norm" in notes and "t2d" in notes
    assert FINAL_NORM_NAME not in notes  # it was written
    assert cfg["draftwise"]["target"]["fingerprint"] == TARGET["fingerprint"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_round_trip_under_speculators_names(head_folder, tmp_path, dtype):
    norm = torch.randn(8)
    out = export_speculators(head_folder, tmp_path / dtype, verifier=SMOL, final_norm=norm, dtype=dtype)
    tensors = load_file(str(out / WEIGHTS_FILE))
    assert set(tensors) == {*WEIGHT_NAMES.values(), FINAL_NORM_NAME, "t2d", "d2t"}
    want = getattr(torch, dtype)
    for ours, theirs in WEIGHT_NAMES.items():
        assert tensors[theirs].dtype == want
        assert torch.equal(tensors[theirs], _head().state_dict()[ours].to(want)), theirs
    assert torch.equal(tensors[FINAL_NORM_NAME], norm.to(want))
    assert tensors["fusion_fc.weight"].shape == (8, 16)
    draft_ids = torch.arange(len(DRAFT)) + tensors["d2t"]  # d2t: offsets, draft id -> target id
    assert draft_ids.tolist() == sorted(DRAFT) == tensors["t2d"].nonzero().flatten().tolist()
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].shape == (VOCAB,)


def test_the_exported_layer_run_by_transformers_reproduces_the_head(head_folder, tmp_path):
    """speculators' ``eagle`` forward with layernorms (embedding_layernorm left out, as the file
    says): fusion_fc -> transformers' LlamaDecoderLayer -> pre_lm_head_layernorm."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    norm = torch.randn(8).abs() + 0.5
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL, final_norm=norm)
    cfg = json.loads((out / CONFIG_FILE).read_text())
    tensors = load_file(str(out / WEIGHTS_FILE))
    layer_cfg = AutoConfig.for_model(**cfg["transformer_layer_config"])
    layer_cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(layer_cfg, layer_idx=0).eval()
    prefix = "transformer."
    layer.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}, strict=True)
    rope = LlamaRotaryEmbedding(layer_cfg)

    torch.manual_seed(1)
    embeds, feats = torch.randn(1, 5, 8), torch.randn(1, 5, 8)  # [B, n, d]
    positions = torch.arange(3, 8)[None]  # [B, n]
    with torch.no_grad():
        x = torch.nn.functional.linear(torch.cat([embeds, feats], dim=-1), tensors["fusion_fc.weight"])
        y = layer(x, position_ids=positions, position_embeddings=rope(x, positions))
        y = y[0] if isinstance(y, tuple) else y
        theirs = torch.nn.functional.rms_norm(y, (8,), tensors[FINAL_NORM_NAME], layer_cfg.rms_norm_eps)
        mine = _head()(embeds, feats, positions)
        mine = torch.nn.functional.rms_norm(mine, (8,), norm, CFG.rms_norm_eps)
    torch.testing.assert_close(theirs, mine, rtol=1e-5, atol=1e-5)


def test_without_the_final_norm_the_file_says_so(head_folder, tmp_path):
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    assert FINAL_NORM_NAME not in load_file(str(out / WEIGHTS_FILE))
    notes = json.loads((out / CONFIG_FILE).read_text())["draftwise"]["not_represented"]
    assert any(n.startswith(FINAL_NORM_NAME) for n in notes)


def test_a_full_vocabulary_head_has_no_vocabulary_maps(tmp_path):
    folder = save_head(tmp_path / "head", _head(), draft_tokens=None, target=TARGET)
    out = export_speculators(folder, tmp_path / "out", verifier=SMOL, final_norm=torch.ones(8))
    assert not {"t2d", "d2t"} & set(load_file(str(out / WEIGHTS_FILE)))
    assert json.loads((out / CONFIG_FILE).read_text())["draft_vocab_size"] == VOCAB


def test_refusals_are_one_line_config_errors(head_folder, tmp_path):
    with pytest.raises(ConfigError, match="no draft head"):
        export_speculators(tmp_path / "nothing", tmp_path / "o1", verifier=SMOL)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not empty"):
        export_speculators(head_folder, tmp_path / "busy", verifier=SMOL)
    assert (tmp_path / "busy" / "mine.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="shape"):
        export_speculators(head_folder, tmp_path / "o2", verifier=SMOL, final_norm=torch.ones(9))
    with pytest.raises(ConfigError, match="dtype"):
        export_speculators(head_folder, tmp_path / "o3", verifier=SMOL, dtype="float16")
    with pytest.raises(ConfigError, match="k 0"):
        export_speculators(head_folder, tmp_path / "o4", verifier=SMOL, k=0)
    with pytest.raises(ConfigError, match="--verifier"):
        verifier_id("my-local-model", None)
    assert verifier_id("default") == SMOL and verifier_id("default", " org/x ") == "org/x"


def test_an_earlier_export_is_replaced_only_with_overwrite(head_folder, tmp_path):
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    with pytest.raises(ConfigError, match="--overwrite"):
        export_speculators(head_folder, out, verifier=SMOL)
    export_speculators(head_folder, out, verifier="org/other", overwrite=True)
    assert json.loads((out / CONFIG_FILE).read_text())["speculators_config"]["verifier"]["name_or_path"] == "org/other"


def test_vocab_maps_refuse_repeated_ids():
    with pytest.raises(ConfigError, match="repeat"):
        vocab_maps(torch.tensor([3, 3]), 8)


def test_validation_without_speculators_says_it_did_not_check(head_folder, tmp_path, monkeypatch):
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    monkeypatch.setitem(sys.modules, "speculators", None)  # makes `import speculators` fail
    message = validate_speculators_config(out)
    assert message is not None and "not importable" in message
    assert "cannot read" in (validate_speculators_config(tmp_path / "nowhere") or "")


def test_speculators_own_classes_check_the_config(head_folder, tmp_path):
    speculators = pytest.importorskip("speculators")
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL, final_norm=torch.ones(8))
    message = validate_speculators_config(out)
    if "eagle" in (speculators.SpeculatorModelConfig.registry or {}):
        assert message is None, message
    else:  # speculators >= 0.7 dropped the type: the shared block is still checked
        assert message is not None and "no 'eagle' model type" in message and "it is valid" in message


# -- the command ------------------------------------------------------------------------------

def _cli(*args: str):
    app = typer.Typer()
    app.command()(export_head_cmd)
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_cli_refuses_a_missing_head_and_a_busy_folder_before_loading(head_folder, tmp_path):
    res = _cli(str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "no draft head" in res.output and "Traceback" not in res.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    res = _cli(str(head_folder), "--out", str(tmp_path / "busy"))
    assert res.exit_code == 2 and "not empty" in res.output
    meta = json.loads((head_folder / "draftwise_head.json").read_text())
    meta["target"]["name"] = "my-local-model"
    (head_folder / "draftwise_head.json").write_text(json.dumps(meta))
    res = _cli(str(head_folder), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "--verifier" in res.output


def test_cli_exports_a_head_with_its_targets_final_norm(tiny, tiny_chat_folder, tmp_path):
    cfg = HeadConfig.from_target(tiny.config)
    target = {"name": tiny.name, "fingerprint": fingerprint_of(tiny), "hidden_size": cfg.hidden_size,
              "vocab_size": int(tiny.runtime.vocab_size), "num_layers": 3}
    folder = save_head(tmp_path / "head", _head(cfg=cfg), draft_tokens=[5, 9, 100], target=target)
    res = _cli(str(folder), "--out", str(tmp_path / "out"), "--model", str(tiny_chat_folder),
               "--verifier", "org/tiny", "--dtype", "bfloat16", "--no-validate")
    assert res.exit_code == 0, res.output
    tensors = load_file(str(tmp_path / "out" / WEIGHTS_FILE))
    assert torch.equal(tensors[FINAL_NORM_NAME], tiny.runtime.final_norm.to(torch.bfloat16))
    cfg_json = json.loads((tmp_path / "out" / CONFIG_FILE).read_text())
    assert cfg_json["speculators_config"]["verifier"]["name_or_path"] == "org/tiny"
    assert cfg_json["transformer_layer_config"]["max_position_embeddings"] == 512
    other = save_head(tmp_path / "other", _head(cfg=cfg), draft_tokens=None, target={**target, "fingerprint": "0" * 16})
    res = _cli(str(other), "--out", str(tmp_path / "out2"), "--model", str(tiny_chat_folder), "--verifier", "org/tiny")
    assert res.exit_code == 2 and "trained for" in res.output
