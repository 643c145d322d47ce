"""The Hugging Face adapter: cached logits and rollbacks equal a fresh, cache-free forward.

Tiny random models (built from a config, float32, seeded) cover Llama, Gemma 3 with a small
sliding window (rolled back across the window boundary) and LFM2 (a recurrent conv layer: the
re-run-the-prefix rollback). The real Gemma 3 270M (its weights and 18 layers, its window cut
from 512 to 32 so short sequences cross it) runs when its package is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise.errors import ConfigError, ContextLengthError
from draftwise.runtime import hf_cache as hf_module
from draftwise.runtime.base import Runtime
from draftwise.runtime.hf import HFRuntime

VOCAB = 128
TOL = 1e-4  # float32, tiny models
REAL_TOL = 1e-3  # float32, Gemma 3 270M


def _reference(model: Any, ids: list[int], keep: int) -> torch.Tensor:
    """Logits of the last ``keep`` positions of ``ids`` from one cache-free forward."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=keep)
    return out.logits[0].float()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def _random_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


_GEMMA_LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def _tiny_gemma3(sliding_window: int, attn: str = "sdpa", seed: int = 0) -> Any:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(_GEMMA_LAYERS),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=list(_GEMMA_LAYERS),
        max_position_embeddings=256,
    )
    model = Gemma3ForCausalLM(config).eval()
    model.set_attn_implementation(attn)
    return model


@pytest.fixture(scope="module")
def llama() -> Any:
    return _tiny_llama()


@pytest.fixture(autouse=True)
def small_kv_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start the K/V buffers at 4 positions, so the tiny tests grow them (and copy) often."""
    monkeypatch.setattr(hf_module, "_MIN_CAPACITY", 4)


# -- tiny Llama ------------------------------------------------------------------------------


def test_protocol_and_properties(llama: Any) -> None:
    rt = HFRuntime.from_model(llama, max_context=100)
    assert isinstance(rt, Runtime)
    assert rt.vocab_size == VOCAB
    assert rt.num_layers == 2
    assert rt.max_context == 100  # min(256 from the config, 100)
    assert HFRuntime.from_model(llama, max_context=1000).max_context == 256
    assert HFRuntime.from_model(llama).max_context == 256
    assert rt.dtype == torch.float32
    assert rt.length == 0
    assert rt.exact_rollback
    rt.prefill([1, 2, 3])
    assert rt.length == 3
    rt.forward([4, 5])
    assert rt.length == 5


def test_llama_prefill_and_forward_match_full_forward(llama: Any) -> None:
    ids = _random_ids(40, seed=1)
    rt = HFRuntime.from_model(llama)
    ref = _reference(llama, ids, keep=len(ids))

    last = rt.prefill(ids[:17])
    assert last.shape == (VOCAB,) and last.dtype == torch.float32
    assert _max_diff(last, ref[16]) <= TOL
    pos = 17
    for n in (1, 5, 1, 16):  # single-token and multi-token steps
        rows = rt.forward(ids[pos : pos + n])
        assert rows.shape == (n, VOCAB) and rows.dtype == torch.float32
        assert _max_diff(rows, ref[pos : pos + n]) <= TOL
        pos += n
    assert rt.length == pos == 40
    # a second prefill starts a new sequence: nothing of the first one leaks in
    other = _random_ids(9, seed=2)
    assert _max_diff(rt.prefill(other), _reference(llama, other, keep=1)[0]) <= TOL
    assert rt.length == 9


def test_llama_rollback_matches_fresh_run(llama: Any) -> None:
    ids = _random_ids(30, seed=3)
    rt = HFRuntime.from_model(llama)
    rt.prefill(ids[:12])
    rejected = rt.forward(_random_ids(6, seed=4))  # a draft that gets rejected
    rt.rollback(10)
    assert rt.length == 10
    rows = rt.forward(ids[10:30])
    ref = _reference(llama, ids, keep=20)
    assert _max_diff(rows, ref) <= TOL
    assert _max_diff(rejected, ref[2:8]) > 1e-2  # the rejected tokens really were different
    rt.rollback(0)
    assert rt.length == 0
    rows = rt.forward(ids[:5])
    assert _max_diff(rows, _reference(llama, ids[:5], keep=5)) <= TOL


def test_errors(llama: Any) -> None:
    rt = HFRuntime.from_model(llama, max_context=20)
    rt.prefill([1, 2, 3])
    with pytest.raises(ConfigError, match="native runtime"):
        rt.forward([4], layers=[0])
    with pytest.raises(ConfigError, match="native runtime"):
        rt.forward([4], layers=[])
    with pytest.raises(ConfigError, match="4"):
        rt.rollback(4)
    with pytest.raises(ConfigError):
        rt.rollback(-1)
    assert rt.length == 3
    too_long = r"3 cached \+ 18 new tokens = 21 .*max_context=20"
    with pytest.raises(ContextLengthError, match=too_long):
        rt.forward(list(range(18)))
    with pytest.raises(ContextLengthError, match="21 tokens.*20"):
        rt.prefill(list(range(21)))
    with pytest.raises(ConfigError, match="empty"):
        rt.prefill([])
    with pytest.raises(ConfigError, match="out of range"):
        rt.forward([VOCAB])
    assert rt.length == 3  # failed calls leave the cache as it was
    assert rt.forward([]).shape == (0, VOCAB)
    rt.forward(list(range(17)))  # exactly max_context fits
    assert rt.length == 20


# -- tiny Gemma 3: sliding-window layers ------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3() -> Any:
    return _tiny_gemma3(sliding_window=4)


def test_gemma3_sliding_window_is_exercised(gemma3: Any) -> None:
    """The window changes the logits, so a cache that lost the sliding mask would fail below."""
    wide = _tiny_gemma3(sliding_window=4096)
    wide.load_state_dict(gemma3.state_dict())
    ids = _random_ids(48, seed=5)
    narrow_ref = _reference(gemma3, ids, keep=48)
    wide_ref = _reference(wide, ids, keep=48)
    assert _max_diff(narrow_ref[:4], wide_ref[:4]) <= TOL  # inside the window: identical
    assert _max_diff(narrow_ref[8:], wide_ref[8:]) > 0.05  # beyond it: the window matters

    rt = HFRuntime.from_model(gemma3)
    rt.prefill(ids[:10])
    rows = rt.forward(ids[10:48])
    assert _max_diff(rows, narrow_ref[10:]) <= TOL
    assert _max_diff(rows, wide_ref[10:]) > 0.05
    # the sliding layers hand attention only the window, not the whole history
    for layer, kind in zip(rt._cache.layers, _GEMMA_LAYERS, strict=True):  # type: ignore[union-attr]
        assert layer.is_sliding == (kind == "sliding_attention")
        assert layer.get_seq_length() == 48
        if layer.is_sliding:
            with torch.inference_mode():  # the cache holds inference tensors
                keys, _ = layer.update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16))
                layer.truncate(48)  # undo that probe
            assert keys.shape[-2] == 4  # window - 1 cached + 1 new
    assert _max_diff(rt.forward(ids[:3]), _reference(gemma3, ids + ids[:3], keep=3)) <= TOL


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gemma3_rollback_across_window_matches_fresh(attn: str) -> None:
    model = _tiny_gemma3(sliding_window=4, attn=attn)
    seq = _random_ids(12, seed=6)
    rt = HFRuntime.from_model(model)
    rt.prefill(seq)

    def check(rows: torch.Tensor, n: int) -> None:
        assert rt.length == len(seq)
        assert _max_diff(rows, _reference(model, seq, keep=n)) <= TOL

    steps: list[tuple[int, int]] = [  # (roll back to, then append n tokens)
        (12, 6),  # 18
        (9, 5),  # drop 9 positions (> window): 14
        (14, 1),
        (15, 1),
        (3, 7),  # back inside the first window: 10
        (10, 30),  # far beyond the window: 40
        (33, 3),
        (0, 5),  # all the way back
        (5, 50),
    ]
    for i, (keep, n) in enumerate(steps):
        rt.rollback(keep)
        del seq[keep:]
        new = _random_ids(n, seed=100 + i)
        seq.extend(new)
        check(rt.forward(new), n)
    check(rt.prefill(seq)[None], 1)  # a fresh prefill of the final sequence agrees too


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 9)), min_size=1, max_size=8),
    seed=st.integers(0, 1000),
)
def test_gemma3_random_rollbacks_match_fresh(
    gemma3: Any, ops: list[tuple[float, int]], seed: int
) -> None:
    rt = HFRuntime.from_model(gemma3)
    seq = _random_ids(6, seed=seed)
    rt.prefill(seq)
    for i, (frac, n) in enumerate(ops):
        keep = int(frac * len(seq))
        rt.rollback(keep)
        del seq[keep:]
        new = _random_ids(n, seed=seed * 31 + i)
        seq.extend(new)
        rows = rt.forward(new)
        assert _max_diff(rows, _reference(gemma3, seq, keep=n)) <= TOL


# -- absolute position embeddings: position ids must be exact -----------------------------------


def test_gpt2_absolute_positions_and_rollback() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config).eval()
    rt = HFRuntime.from_model(model)
    assert rt.max_context == 64 and rt.num_layers == 2
    seq = _random_ids(20, seed=10)
    ref = _reference(model, seq, keep=20)
    assert _max_diff(rt.prefill(seq[:8]), ref[7]) <= TOL
    assert _max_diff(rt.forward(seq[8:12]), ref[8:12]) <= TOL
    rt.forward(_random_ids(3, seed=11))
    rt.rollback(12)
    assert _max_diff(rt.forward(seq[12:20]), ref[12:20]) <= TOL


# -- a recurrent layer: the re-run-the-prefix rollback -----------------------------------------


def test_recurrent_cache_rollback_reruns_prefix() -> None:
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    config = Lfm2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv"],
        max_position_embeddings=256,
    )
    model = Lfm2ForCausalLM(config).eval()
    rt = HFRuntime.from_model(model)
    assert not rt.exact_rollback  # a conv state cannot be shortened
    seq = _random_ids(10, seed=7)
    rt.prefill(seq)
    rt.forward(_random_ids(4, seed=8))
    rt.rollback(7)
    assert rt.length == 7
    del seq[7:]
    new = _random_ids(6, seed=9)
    seq.extend(new)
    assert _max_diff(rt.forward(new), _reference(model, seq, keep=6)) <= TOL


# -- the real Gemma 3 270M (sliding window 512, cut to 32 here) --------------------------------

REAL_WINDOW = 32  # the sliding window the real model runs with here (its config says 512)


@pytest.fixture(scope="module")
def gemma3_270m(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HFRuntime, Any, Path]]:
    """The real Gemma 3 270M through ``HFRuntime.from_folder``, from a copy of its converted
    folder whose config cuts the sliding window from 512 to :data:`REAL_WINDOW`: the same
    weights and layers, so sequences of ~50 tokens cross the window instead of ~530."""
    import json

    from draftwise.runtime.models import BUILTIN_MODELS

    builtin = BUILTIN_MODELS["gemma3-270m"]
    if not builtin.installed():
        pytest.skip(f"Gemma 3 270M is not installed ({builtin.install_hint})")
    from draftwise.runtime.loaders import gguf_to_folder

    converted = gguf_to_folder(builtin.gguf_path())
    folder = tmp_path_factory.mktemp("gemma3-270m-window")
    for item in converted.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((converted / "config.json").read_text())
    assert config["sliding_window"] == 512
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": REAL_WINDOW}))
    rt = HFRuntime.from_folder(folder, dtype=torch.float32, max_context=2048)
    yield rt, rt._model, folder


@pytest.mark.real_model
def test_gemma3_270m_rollback_across_window_matches_fresh(
    gemma3_270m: tuple[HFRuntime, Any, Path],
) -> None:
    """Prefilled past the window, rolled back across 16 positions (staying past it), then back
    below it and past it again: each time the cached rows equal a fresh forward."""
    from transformers import AutoTokenizer

    rt, model, folder = gemma3_270m
    assert rt.max_context == 2048 and rt.num_layers == 18 and rt.exact_rollback
    w = model.config.sliding_window
    assert w == REAL_WINDOW
    text = (
        "The quick brown fox jumps over the lazy dog while the farmer counts sheep. "
        "Speculative decoding drafts a few tokens and verifies them in one pass. "
    )
    ids = AutoTokenizer.from_pretrained(str(folder))(text * 5)["input_ids"]
    assert len(ids) > w + 96
    seq = ids[: w + 18]  # longer than the window
    last = rt.prefill(seq)
    assert _max_diff(last, _reference(model, seq, keep=1)[0]) <= REAL_TOL

    rt.forward(ids[w + 18 : w + 24])  # a draft ...
    rt.rollback(w + 8)  # ... rolled back across 16 positions
    seq = seq[: w + 8] + ids[w + 90 : w + 94]  # different tokens
    rows = rt.forward(seq[w + 8 :])
    assert _max_diff(rows, _reference(model, seq, keep=4)) <= REAL_TOL

    rt.rollback(w - 7)  # back below the window length, then past it again
    seq = seq[: w - 7] + ids[w + 60 : w + 72]
    rows = rt.forward(seq[w - 7 :])
    assert len(seq) == w + 5 > w
    assert _max_diff(rows, _reference(model, seq, keep=12)) <= REAL_TOL
