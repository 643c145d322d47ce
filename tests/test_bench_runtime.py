"""The runtime benchmark (draftwise.bench.plain_vs_hf): validation, the report, and one tiny
end-to-end run; and the roofline script (``benchmarks/roofline.py``): bytes per token, the
bandwidth arithmetic and its report.

No timing assertions: the timed benchmarks themselves run from ``benchmarks/runtime_vs_hf.py``
and ``benchmarks/roofline.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from draftwise.bench.plain_vs_hf import render_markdown, run_runtime_benchmark
from draftwise.errors import ConfigError

from .benchmark_scripts import load_benchmark

roofline = load_benchmark("roofline")
kv_bytes_per_token, measure_bandwidth = roofline.kv_bytes_per_token, roofline.measure_bandwidth
weight_bytes_per_token = roofline.weight_bytes_per_token

# tiny Llama: d=64, 4 query heads and 2 KV heads of 16, FFN 96, 3 layers, vocab 100
D, H, KV, HD, FFN, LAYERS, VOCAB = 64, 4, 2, 16, 96, 3, 100


def _rows(categories: str) -> list[dict[str, Any]]:
    return [{"question_id": i, "category": c, "turns": [f"q{i}", "second"]} for i, c in enumerate(categories)]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- validation before any model is loaded ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_prompts": 0}, "num_prompts"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"dtypes": ("float16",)}, "not supported"),
        ({"dtypes": ()}, "empty"),
        ({"dtypes": ("float32", "float32")}, "repeats"),
        ({"threads": 0}, "threads"),
        ({"repeats": 0}, "repeats"),
        ({"num_prompts": 5}, "has only 2"),
    ],
)
def test_run_validates_inputs(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    questions = _write(tmp_path, [json.dumps(r) for r in _rows("ab")])
    # a model that does not exist: validation must fail before anything is loaded
    args = {"model": str(tmp_path / "no-model"), "questions": questions, "progress": False} | kwargs
    with pytest.raises(ConfigError, match=match):
        run_runtime_benchmark(**args)


def test_run_missing_questions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="questions file not found"):
        run_runtime_benchmark(questions=tmp_path / "nope.jsonl", progress=False)


# -- bytes per token -------------------------------------------------------------------------


def _tiny_runtime(*, tied: bool, bias: bool, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    from draftwise.runtime.native import NativeRuntime

    common = dict(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=HD,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    # Qwen2 is the family with q/k/v biases (and none on o)
    config = Qwen2Config(**common) if bias else LlamaConfig(**common)
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    state = {"model.embed_tokens.weight": rand(VOCAB, D), "model.norm.weight": rand(D)}
    if not tied:
        state["lm_head.weight"] = rand(VOCAB, D)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = rand(H * HD, D)
        state[p + "self_attn.k_proj.weight"] = rand(KV * HD, D)
        state[p + "self_attn.v_proj.weight"] = rand(KV * HD, D)
        state[p + "self_attn.o_proj.weight"] = rand(D, H * HD)
        if bias:
            state[p + "self_attn.q_proj.bias"] = rand(H * HD)
            state[p + "self_attn.k_proj.bias"] = rand(KV * HD)
            state[p + "self_attn.v_proj.bias"] = rand(KV * HD)
        state[p + "mlp.gate_proj.weight"] = rand(FFN, D)
        state[p + "mlp.up_proj.weight"] = rand(FFN, D)
        state[p + "mlp.down_proj.weight"] = rand(D, FFN)
        state[p + "input_layernorm.weight"] = rand(D)
        state[p + "post_attention_layernorm.weight"] = rand(D)
    return NativeRuntime(config, state, dtype=dtype, max_context=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tied", "bias"), [(True, False), (False, False), (True, True)])
def test_weight_bytes_per_token_hand_count(dtype: torch.dtype, tied: bool, bias: bool) -> None:
    rt = _tiny_runtime(tied=tied, bias=bias, dtype=dtype)
    size = 4 if dtype == torch.float32 else 2
    per_layer = (
        H * HD * D  # q
        + 2 * KV * HD * D  # k, v
        + D * H * HD  # o
        + 2 * FFN * D  # gate, up
        + D * FFN  # down
        + 2 * D  # the two norms
        + ((H + 2 * KV) * HD if bias else 0)  # q/k/v biases
    )
    expected = {
        "layers": LAYERS * per_layer * size,
        "final_norm": D * size,
        "head": VOCAB * D * size,  # tied or not, the head is read once
        "embedding_row": D * size,  # the lookup reads one row
        "tied_head": int(tied),
    }
    expected["total"] = expected["layers"] + expected["final_norm"] + expected["head"] + D * size
    assert weight_bytes_per_token(rt) == expected
    # sanity: an untied model holds one more [vocab, d] matrix, but reads the same bytes per token
    params = sum(t.numel() for t in {id(t): t for t in _all_tensors(rt)}.values())
    assert expected["total"] == (params - (VOCAB * D if tied else 2 * VOCAB * D)) * size + (
        VOCAB * D + D
    ) * size


def _all_tensors(rt: Any) -> list[torch.Tensor]:
    tensors = [rt.embed, rt.head, rt.final_norm, *rt.ln_attn, *rt.ln_mlp]
    for i in range(rt.num_layers):
        tensors += [t for m in rt.matmuls(i) for t in (m.weight, m.bias) if t is not None]
    return tensors


def test_nbytes() -> None:
    assert roofline._nbytes(torch.zeros(3, 4, dtype=torch.bfloat16)) == 24 and roofline._nbytes(None) == 0


def test_kv_bytes_per_token() -> None:
    rt = _tiny_runtime(tied=True, bias=False, dtype=torch.bfloat16)
    assert kv_bytes_per_token(rt, 10) == LAYERS * 2 * KV * HD * 2 * 10
    assert kv_bytes_per_token(rt, 0) == 0


# -- bandwidth and the report (no timing assertions) -----------------------------------------


def test_measure_bandwidth_small_buffer() -> None:
    bw = measure_bandwidth(1 << 20, repeats=3, warmup=1)
    assert bw["buffer_bytes"] == 1 << 20
    # the best repeat is never slower than the median one
    assert bw["copy_best_gbps"] >= bw["copy_gbps"] and bw["read_best_gbps"] >= bw["read_gbps"]


def test_measure_bandwidth_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fixed timings: a copy moves the buffer twice (read + write), a sum reads it once;
    the figures are medians, the ``best`` ones the fastest repeat."""
    timings = iter([[0.004, 0.001, 0.002], [0.003, 0.001, 0.0005]])  # copy, then read
    monkeypatch.setattr(roofline, "_seconds", lambda fn, repeats, warmup: next(timings))
    bw = measure_bandwidth(1 << 20)
    mb = (1 << 20) / 1e9  # the buffer in GB
    assert bw == pytest.approx({"buffer_bytes": 1 << 20, "copy_gbps": 2 * mb / 0.002, "read_gbps": mb / 0.001,
                                "copy_best_gbps": 2 * mb / 0.001, "read_best_gbps": mb / 0.0005})


def test_render_markdown_has_table_and_command() -> None:
    stats = {"median": 20.0, "mean": 21.0, "min": 19.0, "max": 22.0}
    ratio = {"median": 1.5, "mean": 1.5, "min": 1.2, "max": 1.8}
    report = {
        "command": "python benchmarks/runtime_vs_hf.py --num-prompts 2",
        "config": {"model": "default", "questions": "/x/q.jsonl", "num_prompts": 2, "max_new_tokens": 8},
        "machine": {"cpu_model": "CPU", "cpu_count": 2, "torch": "2", "torch_threads": 2, "transformers": "5"},
        "results": {
            "float32": {
                "hf_tokens_per_second": stats,
                "draftwise_tokens_per_second": stats,
                "ratio": ratio,
                "equal_outputs": 2,
                "num_prompts": 2,
            }
        },
        "wall_seconds": 60.0,
    }
    md = render_markdown(report)
    assert "| float32 | 20.0 | 20.0 | 1.50x | 1.20-1.80x | 21.0 / 21.0 | 2/2 |" in md
    assert "python benchmarks/runtime_vs_hf.py --num-prompts 2" in md


def test_roofline_report() -> None:
    """The roofline script's figures and its Markdown row, from fixed inputs."""
    bandwidth = {"buffer_bytes": 512.0 * (1 << 20), "copy_gbps": 10.0, "read_gbps": 8.0,
                 "copy_best_gbps": 11.0, "read_best_gbps": 9.0}
    result = {"plain_tokens_per_second": 20.0, "weight_bytes_per_token": {"total": 500_000_000},
              **roofline.roofline({"total": 500_000_000}, bandwidth, 20.0),
              "read_gbps_at_weight_size": 9.0, "roofline_tokens_per_second_read_bw_at_weight_size": 18.0,
              "kv_bytes_per_token_at_mean_context": 1_000_000, "mean_context": 100}
    assert result["percent_of_roofline_copy_bw"] == pytest.approx(100.0)
    assert result["percent_of_roofline_read_bw"] == pytest.approx(125.0)
    md = roofline.render_markdown({
        "command": "python benchmarks/roofline.py --modes float32",
        "config": {"model": "default", "max_new_tokens": 8, "repeats": 3, "threads": 2},
        "machine": {"cpu_model": "CPU", "cpu_count": 2, "torch": "2"},
        "bandwidth": bandwidth, "results": {"float32": result},
    })
    assert "| float32 | 20.0 | 500.0 | 20.0 | 100% | 16.0 | 125% | 9.0 | 18.0 | 1.00 (context 100) |" in md
    assert "python benchmarks/roofline.py --modes float32" in md


def test_a_tiny_end_to_end_run_on_a_text_prompt_file(tiny_chat_folder, tmp_path, one_thread):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\nCount to three.\nSay hi.\n")
    report = run_runtime_benchmark(
        model=str(tiny_chat_folder), questions=prompts, num_prompts=2, max_new_tokens=4, dtypes=["float32"],
        out_dir=tmp_path / "out", progress=False,
    )
    r = report["results"]["float32"]
    assert "bandwidth" not in report and "roofline" not in r  # benchmarks/roofline.py's, not this command's
    assert [p["text"] for p in report["config"]["prompts"]] == ["Name a colour.", "Count to three."]
    assert r["num_prompts"] == 2 and r["equal_outputs"] == 2  # float32 greedy: the same tokens
    for rec in r["prompts"]:
        assert rec["ratio"] == pytest.approx(rec["draftwise_tokens_per_second"] / rec["hf_tokens_per_second"])
    saved = json.loads((tmp_path / "out" / "runtime_vs_hf.json").read_text())
    assert saved["results"]["float32"]["num_prompts"] == 2
    assert (tmp_path / "out" / "runtime_vs_hf.md").read_text() == render_markdown(saved)


def test_the_roofline_script_end_to_end(tiny_chat_folder, tmp_path, one_thread, capsys):
    """``benchmarks/roofline.py`` on the random chat model: each mode's figures, files written."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\n")
    out = tmp_path / "roof"
    assert roofline.main(["--model", str(tiny_chat_folder), "--questions", str(prompts), "--modes", "float32,q4",
                          "-n", "3", "--repeats", "1", "--bandwidth-mib", "1", "--out-dir", str(out)]) == 0
    saved = json.loads((out / "roofline.json").read_text())
    f32, q4 = saved["results"]["float32"], saved["results"]["q4"]
    assert q4["weight_bytes_per_token"]["total"] < f32["weight_bytes_per_token"]["total"]  # 4-bit weights
    for r in (f32, q4):
        assert r["percent_of_roofline_copy_bw"] == pytest.approx(
            100 * r["plain_tokens_per_second"] / r["roofline_tokens_per_second_copy_bw"])
    assert (out / "roofline.md").read_text() in capsys.readouterr().out
