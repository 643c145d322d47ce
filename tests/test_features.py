"""Hidden-state features for an EAGLE draft head (:mod:`draftwise.runtime.features`).

The reference is transformers itself: forward hooks on the decoder layers of a cache-free forward
give every layer's output, before the final norm. Both runtimes must record exactly those, per
cache position, through prefill, chains, rollbacks and tree passes with ``keep``.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from draftwise.errors import ConfigError
from draftwise.runtime import features as features_module
from draftwise.runtime.base import FeatureRuntime
from draftwise.runtime.hf import HFRuntime
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config

TOL = 1e-4  # float32, tiny models: a runtime vs transformers
SAME = 1e-5  # one runtime, the same tokens fed in different chunks
VOCAB = 96
PROMPT = [5, 17, 3, 44, 9, 71, 30, 12, 60, 8, 25]
MORE = [33, 7, 90, 14, 2, 58]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start the feature buffer at 4 positions, so the tests grow it (and copy) often."""
    monkeypatch.setattr(features_module, "_MIN_CAPACITY", 4)


@pytest.fixture(scope="module")
def llama() -> Any:
    return random_hf_model(tiny_llama_config(), seed=3)  # 3 layers, d = 64


@pytest.fixture(scope="module")
def gemma() -> Any:
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], max_position_embeddings=128,
    )
    model = random_hf_model(config, seed=4)
    model.set_attn_implementation("sdpa")
    return model


def native(model: Any) -> NativeRuntime:
    return NativeRuntime(model.config, model.state_dict(), max_context=128)


def hf(model: Any) -> HFRuntime:
    return HFRuntime.from_model(model, max_context=128)


def layer_outputs(model: Any, ids: list[int]) -> list[torch.Tensor]:
    """Each decoder layer's output ``[n, d]`` from one cache-free transformers forward."""
    outs: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda m, a, out: outs.append((out[0] if isinstance(out, tuple) else out)[0]))
        for layer in model.model.layers
    ]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return [o.float() for o in outs]


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


MAKERS = [pytest.param(native, id="native"), pytest.param(hf, id="hf")]


@pytest.mark.parametrize("make", MAKERS)
def test_prefill_records_every_prompt_position_before_the_final_norm(llama: Any, make: Any) -> None:
    rt = make(llama)
    assert isinstance(rt, FeatureRuntime)
    rt.capture_features()
    assert rt.feature_width == 64
    rt.prefill(PROMPT)
    got = rt.features(0, len(PROMPT))
    assert got.dtype == torch.float32 and got.shape == (len(PROMPT), 64)
    want = layer_outputs(llama, PROMPT)[-1]
    assert diff(got, want) < TOL
    with torch.inference_mode():  # after the final norm is something else: the test can tell
        normed = llama(input_ids=torch.tensor([PROMPT]), output_hidden_states=True).hidden_states[-1][0]
    assert diff(got, normed) > 100 * TOL
    assert diff(rt.features(3, 7), want[3:7]) < TOL and rt.features(4, 4).shape == (0, 64)


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("layers", [(0, 1), (2, 0), (1, 1, 2)])
def test_chosen_layers_are_concatenated_in_order(llama: Any, make: Any, layers: tuple[int, ...]) -> None:
    rt = make(llama)
    rt.capture_features(layers)
    assert rt.feature_width == 64 * len(layers)
    rt.prefill(PROMPT)
    outs = layer_outputs(llama, PROMPT)
    assert diff(rt.features(0, len(PROMPT)), torch.cat([outs[i] for i in layers], dim=1)) < TOL


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("layers", [None, (0, 2)])
def test_chain_rollback_forward_equals_a_fresh_prefill(llama: Any, make: Any, layers: Any) -> None:
    rt = make(llama)
    rt.capture_features(layers)
    rt.prefill(PROMPT)
    rt.forward(MORE[:4])
    rt.rollback(len(PROMPT) + 1)  # keep MORE[0]
    rt.forward(MORE[4:])
    rt.rollback(len(PROMPT) + 2)  # kept positions stay valid without a pass
    ids = PROMPT + [MORE[0], MORE[4]]
    fresh = make(llama)
    fresh.capture_features(layers)
    fresh.prefill(ids)
    assert diff(rt.features(0, len(ids)), fresh.features(0, len(ids))) < SAME


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("path", [[0, 2, 4], [0, 1, 3], [0, 2]])
def test_tree_pass_then_keep_equals_the_path_as_a_chain(llama: Any, make: Any, path: list[int]) -> None:
    tokens, parents = [40, 41, 42, 43, 44], [-1, 0, 0, 1, 2]
    rt = make(llama)
    rt.capture_features((0, 2))
    rt.prefill(PROMPT)
    base = rt.length
    rt.forward(tokens, parents=parents)
    rt.keep(base, path)
    chain = make(llama)
    chain.capture_features((0, 2))
    ids = PROMPT + [tokens[r] for r in path]
    chain.prefill(ids)
    assert rt.length == len(ids)
    assert diff(rt.features(0, len(ids)), chain.features(0, len(ids))) < SAME
    # and the next pass goes on from the kept path
    rt.forward([9, 10])
    chain.forward([9, 10])
    assert diff(rt.features(0, rt.length), chain.features(0, chain.length)) < SAME


def test_hf_gemma3_sliding_window_features(gemma: Any) -> None:
    """Sliding layers (window 4) across rollbacks past the window: still transformers' states."""
    rt = hf(gemma)
    rt.capture_features((0, 1, 2))
    rt.prefill(PROMPT)
    rt.forward(MORE)
    rt.rollback(len(PROMPT) - 3)
    rt.forward(MORE[:2])
    ids = PROMPT[:-3] + MORE[:2]
    outs = layer_outputs(gemma, ids)
    assert diff(rt.features(0, len(ids)), torch.cat(outs, dim=1)) < TOL
    rt.capture_features()  # other layers: a new, empty buffer
    assert rt.feature_width == 32
    rt.prefill(ids)
    assert diff(rt.features(0, len(ids)), outs[-1]) < TOL


def test_native_logits_do_not_change_with_capture(llama: Any) -> None:
    off, on = native(llama), native(llama)
    on.capture_features((0, 1))
    assert torch.equal(off.prefill(PROMPT), on.prefill(PROMPT))
    assert torch.equal(off.forward(MORE), on.forward(MORE))
    assert torch.equal(off.forward([1, 2, 3], parents=[-1, 0, 0]), on.forward([1, 2, 3], parents=[-1, 0, 0]))


@pytest.mark.parametrize("make", MAKERS)
def test_capture_off_costs_no_buffer_and_bad_input_is_a_config_error(llama: Any, make: Any) -> None:
    rt = make(llama)
    rt.prefill(PROMPT)
    assert rt.feature_width == 0 and rt._feats is None
    with pytest.raises(ConfigError, match="features are off"):
        rt.features(0, 1)
    for layers in [(), (3,), (-1,)]:
        with pytest.raises(ConfigError, match="decoder layer indices in"):
            rt.capture_features(layers)
        assert rt.feature_width == 0
    rt.capture_features()
    with pytest.raises(ConfigError, match="not recorded"):  # turned on after the prompt ran
        rt.features(0, 2)
    rt.prefill(PROMPT)
    for start, end in [(-1, 2), (3, 2), (0, len(PROMPT) + 1)]:
        with pytest.raises(ConfigError, match=r"needs 0 <= start <= end <= length \(11\)"):
            rt.features(start, end)
    rt.capture_features()  # the same layers again: what is recorded stays
    assert rt.features(0, len(PROMPT)).shape == (len(PROMPT), 64)
    rt.capture_features(enabled=False)
    assert rt.feature_width == 0 and rt._feats is None
    with pytest.raises(ConfigError, match="features are off"):
        rt.features(0, 1)


def test_hf_hooks_exist_only_while_capture_is_on(llama: Any) -> None:
    def hooked() -> list[int]:
        """The layers with more forward hooks than before (transformers keeps its own there)."""
        gc.collect()
        return [i for i, layer in enumerate(llama.model.layers) if len(layer._forward_hooks) > before[i]]

    gc.collect()  # runtimes of earlier tests, dropped with capture on, take their hooks along
    before = [len(layer._forward_hooks) for layer in llama.model.layers]
    rt = hf(llama)
    rt.capture_features((2, 0))
    assert hooked() == [0, 2]
    rt.capture_features(enabled=False)
    assert hooked() == []
    rt.capture_features()
    assert hooked() == [2]
    del rt  # the model outlives the runtime: its hooks go with the runtime
    assert hooked() == []


def test_native_draft_pass_leaves_its_positions_unrecorded(llama: Any) -> None:
    rt = native(llama)
    rt.capture_features()
    rt.prefill(PROMPT)
    rt.forward(MORE[:3], layers=[0])  # self-speculation draft: not the target's features
    assert rt.features(0, len(PROMPT)).shape[0] == len(PROMPT)
    with pytest.raises(ConfigError, match="not recorded"):
        rt.features(0, rt.length)
    rt.rollback(len(PROMPT))
    rt.forward(MORE[:3])  # the verification pass records them
    fresh = native(llama)
    fresh.capture_features()
    fresh.prefill(PROMPT + MORE[:3])
    assert diff(rt.features(0, rt.length), fresh.features(0, fresh.length)) < SAME
