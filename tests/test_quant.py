"""Weight formats of the native runtime: 4-bit (the GGUF's own blocks), int8, packed float32 and bfloat16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from draftwise.errors import ConfigError, ModelLoadError
from draftwise.runtime.gguf_blocks import load_q4, q4_weights, read_q4_blocks, save_q4
from draftwise.runtime.native import NativeRuntime, load_state_dict
from draftwise.runtime.quant import GROUP, Int4Linear, Int8Linear, Linear, Q4Weight, parse_quant, quantize_q4

from .conftest import random_hf_model, tiny_llama_config


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


# -- the kernels ------------------------------------------------------------------------------


def test_quantize_q4_is_within_half_a_step_and_keeps_group_extremes() -> None:
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(0))
    q4 = quantize_q4(w)
    assert q4.q.dtype == torch.uint8 and int(q4.q.max()) <= 15
    err = (q4.dequantize() - w).abs().view(48, 96 // GROUP, GROUP)
    step = q4.d[..., None]
    # d and m are stored as float16, like the file's: allow their rounding on top of half a step
    assert bool((err <= step / 2 + 1e-3 * w.abs().max()).all())


def test_int4_and_int8_linear_match_float_within_bfloat16_rounding() -> None:
    g = torch.Generator().manual_seed(1)
    w, x, b = torch.randn(64, 128, generator=g), torch.randn(5, 128, generator=g), torch.randn(64, generator=g)
    q4 = quantize_q4(w)
    assert _rel_err(Int4Linear(q4, b)(x), F.linear(x, q4.dequantize(), b)) < 0.02
    assert _rel_err(Int8Linear(w, b)(x), F.linear(x, w, b)) < 0.02
    assert Int4Linear(q4).nbytes == 64 * 128 // 2 + (128 // GROUP) * 64 * 2 * 2  # nibbles + bf16 scale/zero
    assert Int8Linear(w).nbytes == 64 * 128 + 64 * 2


def test_packed_bfloat16_linear_matches_plain() -> None:
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(32, 64, generator=g).bfloat16(), torch.randn(3, 64, generator=g).bfloat16()
    lin = Linear(w)
    assert _rel_err(lin(x), F.linear(x, w)) < 0.01


def test_packed_float32_linear_matches_plain_and_is_batch_invariant() -> None:
    """Each row's result is bit-identical whatever the rows beside it (the oneDNN kernel's
    property that makes a verification pass compute each position as a one-token pass does)."""
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(96, 160, generator=g), torch.randn(96, generator=g), torch.randn(20, 160, generator=g)
    lin = Linear(w, b)
    assert _rel_err(lin(x), F.linear(x, w, b)) < 1e-5
    if lin.kind != "mkldnn":
        pytest.skip(f"this torch build packs float32 for {lin.kind}, which promises no batch invariance")
    alone = torch.cat([lin(x[i : i + 1]) for i in range(20)])
    for n in (2, 3, 5, 8, 16, 17, 20):
        assert torch.equal(lin(x[:n]), alone[:n]), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1728, 576), (576, 1536)])  # the default model's gate+up and down
def test_a_packed_row_is_the_same_at_any_row_count(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """A row's result, alone or among up to 300 rows. On an Intel Xeon with AMX, oneDNN's
    bfloat16 kernel changed its summation order above 32 rows (and again at some larger
    counts) until the runtime ran such calls in blocks of 32."""
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    x = torch.randn(300, shape[1], generator=g).to(dtype)
    lin = Linear(w)
    if lin.kind == "dense":
        pytest.skip("this torch build packs no weight of this dtype")
    with torch.inference_mode():
        alone = torch.cat([lin(x[i : i + 1]) for i in range(300)])
        for n in (2, 7, 32, 33, 64, 65, 200, 256, 300):
            y = lin(x[:n])
            assert torch.equal(y, alone[:n]), f"{n} rows: {int((y != alone[:n]).any(1).sum())} differ"


def test_row_behaviour_blocks_a_kernel_that_changes_order_above_some_count() -> None:
    """A kernel whose order changes above 32 rows (simulated: a last-bit change there) runs in
    blocks of 32; one whose lone row differs runs it as two; one that never changes runs as is."""
    from draftwise.runtime import quant

    class Fake:
        kind, bias = "fake", None

        def __init__(self, above: int | None, lone: bool) -> None:
            self.above, self.lone = above, lone

        def _run(self, x: torch.Tensor) -> torch.Tensor:
            y = x[:, :8].clone()
            if (self.above is not None and x.shape[0] > self.above) or (self.lone and x.shape[0] == 1):
                y = torch.nextafter(y, torch.full_like(y, float("inf")))
            return y

    for above, lone, want in [(32, False, (False, 32)), (8, True, (True, 8)), (None, False, (False, None)),
                              (40, False, (False, 32))]:
        w = torch.zeros(8, 64 + (above or 0) + int(lone))  # a shape of its own: behaviours are cached by shape
        assert quant._row_behaviour(Fake(above, lone), w) == want, (above, lone)  # type: ignore[arg-type]


def test_int4_refuses_a_shape_it_cannot_take() -> None:
    q4 = Q4Weight(torch.zeros(3, 32, dtype=torch.uint8), torch.ones(3, 1), torch.zeros(3, 1))
    with pytest.raises(ConfigError, match="cannot take"):
        Int4Linear(q4)
    with pytest.raises(ConfigError, match="divisible by 32"):
        quantize_q4(torch.randn(4, 40))


def test_parse_quant() -> None:
    assert parse_quant("q4") == "q4"
    with pytest.raises(ConfigError, match="not one of none, q4, int8"):
        parse_quant("q3")


def test_q4_cache_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    w = {"a.weight": quantize_q4(torch.randn(8, 64)), "b.weight": quantize_q4(torch.randn(4, 32))}
    path = tmp_path / "w.q4.safetensors"
    save_q4(w, {"a.weight": "file", "b.weight": "quantized"}, path)
    back, sources = load_q4(path)
    assert sources == {"a.weight": "file", "b.weight": "quantized"}
    for name in w:
        assert torch.equal(back[name].q, w[name].q) and torch.equal(back[name].d, w[name].d)
    path.write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match="unreadable"):
        load_q4(path)


# -- the runtime in each mode (tiny random model) ---------------------------------------------


@pytest.fixture(scope="module")
def tiny_state():
    config = tiny_llama_config(hidden_size=64, intermediate_size=96, vocab_size=96)
    model = random_hf_model(config, seed=3)
    return config, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("quant", "dtype"), [("q4", torch.float32), ("int8", torch.float32), ("none", torch.bfloat16)])
def test_each_mode_rolls_back_exactly_and_batches_like_single_steps(tiny_state, one_thread, quant, dtype) -> None:
    config, state = tiny_state
    blocks, sources = q4_weights(state, config) if quant == "q4" else (None, None)
    rt = NativeRuntime(config, state, dtype=dtype, quant=quant, blocks=blocks, block_sources=sources)
    assert set(rt.weight_sources.values()) <= {"quantized", "dense"}
    rt.prefill([5, 6, 7])
    base = rt.length
    batch = rt.forward([8, 9, 10])
    rt.rollback(base)
    single = torch.cat([rt.forward([t]) for t in (8, 9, 10)])
    rt.rollback(base)
    again = rt.forward([8, 9, 10])
    assert torch.equal(batch, again)  # rollback is exact
    assert torch.equal(batch, single)  # a verification pass scores each row as a single step would
    # and the mode is close to float32 (it is a lossy format, not a different model)
    ref = NativeRuntime(config, state)
    ref.prefill([5, 6, 7])
    cosine = F.cosine_similarity(batch.float(), ref.forward([8, 9, 10]), dim=-1)
    assert bool((cosine > 0.95).all()), cosine


def test_q4_keeps_dense_what_the_kernel_cannot_take(tiny_state, one_thread) -> None:
    config, state = tiny_state
    odd = tiny_llama_config(hidden_size=64, intermediate_size=80, vocab_size=96)  # down_proj K = 80
    model = random_hf_model(odd, seed=4)
    st = {k: v.detach().clone() for k, v in model.state_dict().items()}
    blocks, sources = q4_weights(st, odd)
    rt = NativeRuntime(odd, st, quant="q4", blocks=blocks, block_sources=sources)
    assert rt.weight_sources["model.layers.0.mlp.down_proj.weight"] == "dense"
    assert rt.weight_sources["model.layers.0.mlp.up_proj.weight"] == "quantized"
    assert rt.prefill([1, 2]).isfinite().all()


def test_load_model_bad_device_and_quant_lines(tiny_chat_folder, one_thread) -> None:
    from draftwise import load_model

    with pytest.raises(ConfigError, match="not a device name"):
        load_model(str(tiny_chat_folder), device="banana")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            load_model(str(tiny_chat_folder), device="cuda")
    with pytest.raises(ConfigError, match="needs the native runtime"):
        load_model(str(tiny_chat_folder), runtime="hf", quant="q4")
    with pytest.raises(ConfigError, match="not one of"):
        load_model(str(tiny_chat_folder), quant="fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_runtime_matches_cpu(tiny_state) -> None:  # pragma: no cover - runs where a GPU is
    config, state = tiny_state
    cpu, gpu = NativeRuntime(config, state), NativeRuntime(config, state, device="cuda")
    assert _rel_err(gpu.prefill([1, 2, 3]).cpu(), cpu.prefill([1, 2, 3])) < 1e-3
    with pytest.raises(ConfigError, match="CPU kernels"):
        NativeRuntime(config, state, device="cuda", quant="q4")


# -- the real default model: the file's own blocks --------------------------------------------


@pytest.mark.real_model
def test_gguf_blocks_are_exactly_the_converted_weights(default_folder) -> None:
    """The 4-bit blocks read straight from the GGUF (rows of q/k un-permuted) de-quantize to
    exactly what transformers' conversion wrote: the q4 runtime runs the file's own weights."""
    from transformers import AutoConfig

    from draftwise.runtime.models import BUILTIN_MODELS

    config = AutoConfig.from_pretrained(str(default_folder))
    blocks = read_q4_blocks(BUILTIN_MODELS["default"].gguf_path(), config)
    state = load_state_dict(default_folder)
    assert len(blocks) == 7 * config.num_hidden_layers
    for name, w in blocks.items():
        assert torch.equal(w.dequantize(), state[name]), name


@pytest.mark.real_model
def test_q4_default_model_greedy_speculation_equals_its_plain_decoding(tmp_path, monkeypatch, default_folder) -> None:
    from draftwise import generate, load_model

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    # the GGUF's conversion is the session's (a second one takes ~20 s); the q4 cache starts empty
    (tmp_path / "cache" / "converted").mkdir(parents=True)
    (tmp_path / "cache" / "converted" / default_folder.name).symlink_to(default_folder)
    model = load_model("default", quant="q4")
    sources = dict(model.runtime.weight_sources)
    # the tied head is Q8_0 in the file: it runs as per-channel int8 (see docs/runtime.md)
    assert sources.pop("model.embed_tokens.weight") == "quantized"
    assert set(sources.values()) == {"file"} and len(sources) == 7 * 30
    assert len(list((tmp_path / "cache" / "quant").glob("*.q4.safetensors"))) == 1  # cached for next time
    # a chat answer that ends at EOS: drafted tokens accepted past the EOS are not committed
    prompt = "Repeat this list exactly: apples, pears, plums, apples, pears, plums, apples."
    plain = generate(model, prompt, max_new_tokens=32, draft="none")
    spec = generate(model, prompt, max_new_tokens=32, draft="lookup", k=4)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.committed == plain.stats.committed == plain.stats.target_passes  # plain: a token a pass
    assert spec.stats.committed <= spec.stats.accepted + spec.stats.target_passes
    # a list the model continues: every pass commits what it accepted plus one token, so the
    # look-up's accepted tokens are target passes saved
    text = "apples, pears, plums, apples, pears, plums, apples,"
    plain = generate(model, text, max_new_tokens=32, chat=False, draft="none")
    spec = generate(model, text, max_new_tokens=32, chat=False, draft="lookup", k=4)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "length"
    assert spec.stats.committed == spec.stats.accepted + spec.stats.target_passes == plain.stats.target_passes == 32
    assert spec.stats.accepted <= spec.stats.proposed <= 4 * (spec.stats.target_passes - 1)
    assert 2 * spec.stats.target_passes <= plain.stats.target_passes  # 9 of 32 when written
