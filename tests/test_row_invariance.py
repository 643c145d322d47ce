"""Row invariance (DESIGN.md section 11): a row's logits depend only on its own sequence's tokens,
not on how many rows its pass has nor on the other sequences in it, in every weight mode.

Checked bit for bit at the logit level on a random Llama big enough to take every kernel path
the real model takes (a down projection with K > 1024, grouped-query attention, contexts of up
to 600 keys: many 64-key blocks, past the ~320 keys where a matmul's reduction changes), and on the
real default model through the batched engine."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from draftwise.errors import ConfigError, ContextLengthError
from draftwise.runtime import kernels
from draftwise.runtime.base import Rows
from draftwise.runtime.native import NativeRuntime

from .conftest import tiny_llama_config

MODES = [("float32", "none"), ("bfloat16", "none"), ("float32", "int8"), ("float32", "q4")]
#: attention's two paths: the compiled kernel (runtime/kernels) and the torch one (runtime/attention.py)
PATHS = ["kernel", "torch"]


def wide_config() -> Any:
    return tiny_llama_config(vocab_size=512, hidden_size=256, intermediate_size=1536, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def wide_state(one_thread: None) -> dict[str, torch.Tensor]:
    from .conftest import random_hf_model

    model = random_hf_model(wide_config(), seed=3)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def runtime(state: dict[str, torch.Tensor], mode: tuple[str, str], slots: int = 1,
            path: str = "kernel") -> NativeRuntime:
    dtype, quant = mode
    rt = NativeRuntime(wide_config(), state, dtype=getattr(torch, dtype), quant=quant, max_context=1024)
    if path == "kernel" and not rt.kernel_attention:
        pytest.skip(f"the attention kernel is not built here ({kernels.why_not()})")
    rt.kernel_attention = path == "kernel"
    rt.allocate_slots(slots)
    return rt


def random_tree(rng: random.Random, n: int) -> list[int]:
    return [-1] + [rng.randrange(j) for j in range(1, n)]


def sequence_plan(rng: random.Random) -> tuple[list[int], list[tuple[list[int], list[int] | None]]]:
    """A prompt, then passes: plain steps, chains and trees, as a decode loop feeds them."""
    prompt = [rng.randrange(3, 512) for _ in range(rng.randrange(5, 600))]
    passes: list[tuple[list[int], list[int] | None]] = []
    for _ in range(4):
        n = rng.choice([1, 1, 4, 7])
        tree = random_tree(rng, n) if n > 2 and rng.random() < 0.5 else None
        passes.append(([rng.randrange(3, 512) for _ in range(n)], tree))
    return prompt, passes


def alone(rt: NativeRuntime, prompt: list[int], passes: list[tuple[list[int], list[int] | None]]) -> list[torch.Tensor]:
    """The logits of each pass, the sequence alone in slot 0 (a tree's pass keeps its row 0 only)."""
    out = [rt.prefill(prompt)[None]]
    for ids, tree in passes:
        base = rt.length
        out.append(rt.forward(ids, parents=tree))
        rt.keep(base, [0])
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES, ids=["+".join(m) for m in MODES])
def test_a_row_is_the_same_alone_and_in_a_batch_of_16(wide_state: dict[str, torch.Tensor], mode: tuple[str, str],
                                                      path: str) -> None:
    rng = random.Random(7)
    seqs = [sequence_plan(rng) for _ in range(16)]
    solo = runtime(wide_state, mode, path=path)
    want = [alone(solo, prompt, passes) for prompt, passes in seqs]
    rt = runtime(wide_state, mode, slots=16, path=path)
    # the prompts enter in chunks of different sizes, as the engine's chunked prefill feeds them
    got: list[list[torch.Tensor]] = [[] for _ in seqs]
    fed = [0] * 16
    while any(f < len(p) for f, (p, _) in zip(fed, seqs)):
        batch = []
        for s, (prompt, _) in enumerate(seqs):
            if fed[s] < len(prompt):
                n = rng.choice([1, 16, 64])
                last = fed[s] + n >= len(prompt)
                batch.append(Rows(s, prompt[fed[s] : fed[s] + n], last_only=last, logits=last))
                fed[s] += n
        for rows, logits in zip(batch, rt.forward_batch(batch)):
            if rows.logits:
                got[rows.slot].append(logits)
    for step in range(4):
        order = list(range(16))
        rng.shuffle(order)  # any order of sequences in a pass, and some sit this pass out
        batch = [Rows(s, seqs[s][1][step][0], seqs[s][1][step][1]) for s in order[: rng.randrange(9, 17)]]
        for rows, logits in zip(batch, rt.forward_batch(batch)):
            got[rows.slot].append(logits)
            rt.keep_slot(rows.slot, rt.slot_length(rows.slot) - len(rows.ids), [0])
        for s in order[len(batch) :]:  # those that sat out run alone, in their own pass
            ids, tree = seqs[s][1][step]
            got[s].append(rt.forward_batch([Rows(s, ids, tree)])[0])
            rt.keep_slot(s, rt.slot_length(s) - len(ids), [0])
    for s in range(16):
        assert len(got[s]) == len(want[s])
        for g, w in zip(got[s], want[s]):
            assert torch.equal(g, w), f"sequence {s}: logits differ by {(g - w).abs().max().item()}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES, ids=["+".join(m) for m in MODES])
def test_a_chain_pass_reproduces_one_row_steps(wide_state: dict[str, torch.Tensor], mode: tuple[str, str],
                                               path: str) -> None:
    rt = runtime(wide_state, mode, path=path)
    rng = random.Random(1)
    prompt = [rng.randrange(3, 512) for _ in range(250)]
    ids = [rng.randrange(3, 512) for _ in range(9)]  # the chain crosses 256 keys
    rt.prefill(prompt)
    steps = torch.cat([rt.forward([t]) for t in ids])
    rt.rollback(len(prompt))
    assert torch.equal(rt.forward(ids), steps)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES, ids=["+".join(m) for m in MODES])
def test_a_tree_row_equals_its_path_run_as_a_chain(wide_state: dict[str, torch.Tensor], mode: tuple[str, str],
                                                   path: str) -> None:
    """Every node of random trees (paths that skip rows, prompts not a multiple of any block)
    against its path fed as a chain: the keys a tree row sees sit at other cache indices than in
    the chain, and float32 shows any reduction that groups by index (it caught both paths)."""
    rt = runtime(wide_state, mode, path=path)
    rng = random.Random(7)
    for _ in range(3):
        prompt = [rng.randrange(3, 512) for _ in range(rng.randrange(20, 300))]
        n = rng.choice([8, 12, 20])
        parents, tokens = random_tree(rng, n), [rng.randrange(3, 512) for _ in range(n)]
        rt.prefill(prompt)
        tree = rt.forward(tokens, parents=parents)
        for j in range(n):
            nodes = [j]
            while parents[nodes[0]] >= 0:
                nodes.insert(0, parents[nodes[0]])
            rt.rollback(len(prompt))
            assert torch.equal(tree[nodes], rt.forward([tokens[i] for i in nodes])), (mode, j, nodes)
        rt.rollback(0)


def test_bad_batches_are_refused(wide_state: dict[str, torch.Tensor]) -> None:
    rt = runtime(wide_state, ("float32", "none"), slots=2)
    with pytest.raises(ConfigError, match="slot 2"):
        rt.forward_batch([Rows(2, [1])])
    with pytest.raises(ConfigError, match="slot 0"):
        rt.forward_batch([Rows(0, [1]), Rows(0, [2])])
    with pytest.raises(ConfigError, match="at least one token"):
        rt.forward_batch([Rows(1, [])])
    with pytest.raises(ContextLengthError):
        rt.forward_batch([Rows(1, [1] * 1025)])
    with pytest.raises(ConfigError, match="slots >= 1"):
        rt.allocate_slots(0)


@pytest.mark.real_model
@pytest.mark.parametrize("mode", MODES[1:], ids=["+".join(m) for m in MODES[1:]])
def test_the_default_model_verifies_as_it_decodes(default_folder: Any, mode: tuple[str, str]) -> None:
    """On the real model, in each reduced-precision mode: a 9-row verification pass gives the
    logits of 9 one-row steps bit for bit (the random Llama above cannot show every kernel's
    data-dependent order: bfloat16's down projections differed only on real activations)."""
    from draftwise import load_model

    model = load_model("default", dtype=mode[0], quant=mode[1], max_context=512)
    rt = model.runtime
    prompt = model.encode_prompt("Write a short poem about the sea and the sky, then explain it.")
    ext = list(range(1000, 1009))
    rt.prefill(prompt)
    steps = torch.cat([rt.forward([t]) for t in ext])
    rt.prefill(prompt)
    assert torch.equal(rt.forward(ext), steps)
    path, parents = [0, 1, 3, 5, 7], [-1, 0, 0, 1, 1, 3, 3, 5, 2]  # as a token tree: row 7's path skips rows
    rt.prefill(prompt)
    tree = rt.forward(ext, parents=parents)
    rt.prefill(prompt)
    assert torch.equal(tree[path], torch.cat([rt.forward([ext[i]]) for i in path]))
