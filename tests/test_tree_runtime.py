"""Token trees in the runtimes: a tree pass scores every root-to-node path exactly as feeding that
path as a chain would, and ``keep`` leaves the cache of having decoded the kept path as a chain."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from draftwise.errors import ConfigError
from draftwise.runtime.base import Rows, Runtime, ancestor_mask, check_parents
from draftwise.runtime.hf import HFRuntime
from draftwise.runtime.native import NativeRuntime
from draftwise.core.tree import TokenTree

from .conftest import random_hf_model, tiny_llama_config

TOL = 1e-5  # native tree pass vs native chain pass, float32
HF_TOL = 1e-4  # native vs transformers (as tests/test_native_runtime.py)
VOCAB = 96
PROMPT = list(range(3, 20))

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_model() -> Any:
    return random_hf_model(tiny_llama_config(), seed=7)


def native(hf: Any) -> NativeRuntime:
    return NativeRuntime(hf.config, hf.state_dict(), max_context=128)


def random_tree(m: int, seed: int) -> tuple[list[int], list[int]]:
    """``m + 1`` row tokens (row 0 the root) and the ``parents`` a forward takes."""
    rng = random.Random(seed)
    tree = TokenTree(
        tokens=[rng.randrange(VOCAB) for _ in range(m)],
        parents=[rng.randrange(j) for j in range(1, m + 1)],
    )
    return [rng.randrange(VOCAB), *tree.tokens], [-1, *tree.parents]


def paths(parents: list[int]) -> list[list[int]]:
    """Every root-to-node path of the tree, as row indices."""
    out = [[0]]
    for j in range(1, len(parents)):
        out.append([*out[parents[j]], j])
    return out


def chain_logits(rt: Any, ids: list[int], **kwargs: Any) -> torch.Tensor:
    rt.prefill(PROMPT)
    return rt.forward(ids, **kwargs)


def test_helpers_match_token_tree() -> None:
    ids, parents = random_tree(12, seed=0)
    tree = TokenTree(ids[1:], parents[1:])
    assert check_parents(parents, 13) == [0, *tree.depths]
    mask = ancestor_mask(parents)
    for j in range(1, 13):
        assert mask[j].nonzero().flatten().tolist() == tree.path_to(j)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layers", [None, [0, 2]], ids=["all-layers", "layer-subset"])
def test_every_path_scores_as_its_chain(hf_model: Any, seed: int, layers: list[int] | None) -> None:
    rt = native(hf_model)
    ids, parents = random_tree(9 + seed, seed)
    rt.prefill(PROMPT)
    tree_logits = rt.forward(ids, parents=parents, layers=layers)  # [m + 1, vocab]
    assert tree_logits.shape == (len(ids), VOCAB) and rt.length == len(PROMPT) + len(ids)
    assert check_parents(parents, len(ids)) is not None  # a tree, not a chain
    for path in paths(parents):
        chain = chain_logits(rt, [ids[r] for r in path], layers=layers)
        assert (tree_logits[path] - chain).abs().max() <= TOL, path


@pytest.mark.parametrize("seed", range(3))
def test_keep_leaves_the_cache_of_the_chain(hf_model: Any, seed: int) -> None:
    """Three rounds of tree, keep a path, then a plain continuation: every round's logits and the
    final cache equal those of a runtime that decoded the kept paths as chains."""
    rt, ref = native(hf_model), native(hf_model)
    rt.prefill(PROMPT)
    ref.prefill(PROMPT)
    rng = random.Random(seed)
    for rnd in range(3):
        ids, parents = random_tree(8, seed=100 * seed + rnd)
        base = rt.length
        tree_logits = rt.forward(ids, parents=parents)
        path = rng.choice(paths(parents)[1:])
        rt.keep(base, path)
        assert rt.length == base + len(path)
        chain = ref.forward([ids[r] for r in path])
        assert (tree_logits[path] - chain).abs().max() <= TOL
    after = [5, 6, 7]
    assert (rt.forward(after) - ref.forward(after)).abs().max() <= TOL
    n = rt.length
    for i in range(rt.num_layers):
        assert (rt.k_cache[i][:, :n] - ref.k_cache[i][:, :n]).abs().max() <= TOL
        assert (rt.v_cache[i][:, :n] - ref.v_cache[i][:, :n]).abs().max() <= TOL


def test_keep_of_a_chain_is_rollback(hf_model: Any) -> None:
    rt = native(hf_model)
    rt.prefill(PROMPT)
    base = rt.length
    first = rt.forward([40, 41, 42, 43])
    rt.keep(base, [0, 1])  # nothing moves
    assert rt.length == base + 2
    again = rt.forward([42, 43])
    assert torch.equal(again, first[2:])


def test_chain_parents_take_the_chain_path(hf_model: Any) -> None:
    rt = native(hf_model)
    ids = [40, 41, 42, 43, 44]
    plain = chain_logits(rt, ids)
    explicit = chain_logits(rt, ids, parents=[-1, 0, 1, 2, 3])
    assert torch.equal(plain, explicit)
    # the tree code (gathered rope positions, ancestor mask) on a chain gives the same numbers
    rt.prefill(PROMPT)
    forced = rt.forward_batch([Rows(0, ids, tree=[-1, 0, 1, 2, 3])])[0]
    assert torch.equal(plain, forced)


@pytest.fixture(params=["sdpa", "eager"])
def attn_model(hf_model: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    hf_model.set_attn_implementation(request.param)
    yield hf_model
    hf_model.set_attn_implementation("sdpa")


def test_hf_adapter_agrees_with_native_on_a_tree(attn_model: Any) -> None:
    hf, rt = HFRuntime.from_model(attn_model, max_context=128), native(attn_model)
    assert isinstance(hf, Runtime) and isinstance(rt, Runtime)
    assert hf.supports_trees and rt.supports_trees
    hf.prefill(PROMPT)
    rt.prefill(PROMPT)
    for rnd in range(2):
        ids, parents = random_tree(7, seed=40 + rnd)
        base = hf.length
        a, b = hf.forward(ids, parents=parents), rt.forward(ids, parents=parents)
        assert (a - b).abs().max() <= HF_TOL
        path = paths(parents)[-1]
        hf.keep(base, path)
        rt.keep(base, path)
        assert hf.length == rt.length == base + len(path)
    assert (hf.forward([9, 8]) - rt.forward([9, 8])).abs().max() <= HF_TOL


@pytest.mark.parametrize("dropped", ["attention_mask", "position_ids"])
def test_hf_probe_catches_a_model_that_ignores_the_mask_or_positions(dropped: str) -> None:
    import functools

    model = random_hf_model(tiny_llama_config(num_hidden_layers=1), seed=8)
    forward = model.forward

    @functools.wraps(forward)
    def ignoring(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop(dropped, None)
        return forward(*args, **kwargs)

    model.forward = ignoring
    assert not HFRuntime.from_model(model, max_context=64).supports_trees
    model.forward = forward
    assert HFRuntime.from_model(model, max_context=64).supports_trees


def test_hf_adapter_says_no_trees_for_sliding_windows() -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
    )
    hf = HFRuntime.from_model(Gemma3ForCausalLM(config).eval())
    assert not hf.supports_trees
    hf.prefill(PROMPT)
    with pytest.raises(ConfigError, match="cannot verify a token tree"):
        hf.forward([1, 2, 3], parents=[-1, 0, 0])
    base = hf.length
    hf.forward([1, 2, 3], parents=[-1, 0, 1])  # a chain is fine, and keep on it is a rollback
    hf.keep(base, [0, 1])
    assert hf.length == base + 2


@pytest.mark.parametrize("make", [native, lambda m: HFRuntime.from_model(m, max_context=128)], ids=["native", "hf"])
def test_bad_parents_and_rows_are_config_errors(hf_model: Any, make: Any) -> None:
    rt = make(hf_model)
    rt.prefill(PROMPT)
    base = rt.length
    for parents, match in [
        ([-1, 0], "2 entries for 3 tokens"),
        ([0, 0, 1], "parents\\[0\\] must be -1"),
        ([-1, 0, 2], "not an earlier row"),
        ([-1, -1, 0], "not an earlier row"),
    ]:
        with pytest.raises(ConfigError, match=match):
            rt.forward([4, 5, 6], parents=parents)
    assert rt.length == base
    rt.forward([4, 5, 6, 7], parents=[-1, 0, 0, 1])  # rows 1 and 2 under the root, 3 under 1
    for b, rows, match in [
        (base + 1, [0, 1], "last forward started at"),
        (base, [], "start with the root"),
        (base, [1, 3], "start with the root"),
        (base, [0, 4], "must be < 4"),
        (base, [0, 3], "not a root-to-node path"),
        (base, [0, 1, 1], "not a root-to-node path"),
        (base, [0, 2, 3], "not a root-to-node path"),
    ]:
        with pytest.raises(ConfigError, match=match):
            rt.keep(b, rows)
    rt.keep(base, [0, 1, 3])
    with pytest.raises(ConfigError, match="must be < 3"):
        rt.keep(base, [0, 1, 2, 3])
    rt.rollback(base - 1)
    with pytest.raises(ConfigError, match="no longer in the cache"):
        rt.keep(base, [0])
