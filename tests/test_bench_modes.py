"""The runtime-modes benchmark (draftwise.bench.modes): validation, the fidelity helpers, one
tiny end-to-end run in float32 and q4 on the random chat model, and the matmul split of the
diagnostic script ``benchmarks/modes_probe.py``.

No timing assertions: the timed benchmark itself is ``draftwise bench-modes``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from draftwise.bench.llama_cpp_peer import llama_cpp_available
from draftwise.bench.modes import plain_margin, run_modes_benchmark
from draftwise.cli import app
from draftwise.errors import ConfigError

from .benchmark_scripts import load_benchmark
from .images import is_complete_png

probe = load_benchmark("modes_probe")

PROMPTS = ["Name three colours.", "Write a haiku about the sea."]
N = 6  # tokens per run in the report fixture


def _questions(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("".join(p + "\n" for p in PROMPTS))
    return path


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"modes": ("float32", "float16")}, "unknown mode.*'float16'.*known modes: float32, bfloat16, q4, int8"),
        ({"modes": "q4,q4"}, "repeats a mode"),
        ({"modes": ""}, "modes is empty"),
        ({"num_prompts": 0}, "num_prompts=0 must be an integer >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"k": 0}, "k=0"),
        ({"drafts": "auto"}, "not a draft here"),
        ({"drafts": "nonsense"}, "nonsense"),
        ({"threads": 0}, "threads"),
        ({"num_prompts": 3}, "has only 2"),
    ],
)
def test_bad_input_is_one_config_error(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    # a model that does not exist: every check must fail before anything is loaded
    args = {"model": str(tmp_path / "no-model"), "questions": _questions(tmp_path), "progress": False} | kwargs
    with pytest.raises(ConfigError, match=match) as info:
        run_modes_benchmark(**args)
    assert "\n" not in str(info.value)


def test_cli_bad_mode_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["bench-modes", "--modes", "float32,fp8", "--questions", str(_questions(tmp_path))])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown mode" in lines[0] and "'fp8'" in lines[0]


def test_cli_threads_zero_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["bench-modes", "--threads", "0"], catch_exceptions=False)
    assert res.exit_code == 2 and res.output.strip() == "error: --threads must be at least 1 (got 0)"


def test_matmul_split_restores_the_runtime(tiny) -> None:
    rt = tiny.runtime
    before = {name: list(getattr(rt, name)) for name in probe.MATMUL_LISTS}
    head = rt._head
    ids = [5, 6, 7, 8]
    want = rt.prefill(ids).clone()
    split = probe.matmul_split(rt, ids, repeats=2)
    assert split is not None and split["context"] == len(ids)
    assert set(split) == {"forward_ms", "rest_ms", "matmul_ms", "context"}
    assert split["matmul_ms"] == pytest.approx(split["forward_ms"] - split["rest_ms"])
    assert all(getattr(rt, name) == before[name] for name in probe.MATMUL_LISTS) and rt._head is head
    torch.testing.assert_close(rt.prefill(ids), want, rtol=0, atol=0)  # real matmuls again


def test_plain_margin_is_the_top2_gap_of_sequential_decoding(tiny) -> None:
    rt = tiny.runtime
    ids, tokens = [5, 6, 7], [9, 10, 11]
    top = rt.prefill(ids).topk(2).values
    assert plain_margin(rt, ids, tokens, 0) == pytest.approx(float(top[0] - top[1]))
    rt.prefill(ids)
    rt.forward([9])
    top = rt.forward([10])[0].topk(2).values  # the logits that pick tokens[2]
    assert plain_margin(rt, ids, tokens, 2) == pytest.approx(float(top[0] - top[1]))


@pytest.fixture(scope="module")
def report(tiny_chat_folder: Path, tmp_path_factory: pytest.TempPathFactory, one_thread) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("modes")
    questions = _questions(out)
    return run_modes_benchmark(
        model=str(tiny_chat_folder), questions=questions, num_prompts=2, max_new_tokens=N,
        modes=("float32", "q4"), drafts=("lookup",), k=2, out_dir=out / "out", progress=False,
        command="draftwise bench-modes --test",
    ) | {"_out": out / "out"}


def _per_prompt(report: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    return [p["modes"][mode] for p in report["prompts"]]


def test_report_fields(report: dict[str, Any]) -> None:
    assert report["config"]["modes"] == {"float32": {"dtype": "float32", "quant": "none"},
                                         "q4": {"dtype": "float32", "quant": "q4"}}
    assert report["config"]["drafts"] == [{"name": "lookup", "spec": "lookup", "k": 2}]
    assert [len(p["modes"]) for p in report["prompts"]] == [2, 2]
    assert report["prompts"][0]["order"] != report["prompts"][1]["order"]  # rotated
    f32, q4 = report["results"]["float32"], report["results"]["q4"]
    # the diagnostics are benchmarks/ scripts', not this command's
    assert "bandwidth" not in report and not {"roofline", "split"} & (set(f32) | set(q4))
    # float32 against itself: same tokens, zero logit difference, the same argmax on every prompt
    assert f32["plain_equal_to_float32"] == 2 and f32["first_divergence_from_float32"] == [None, None]
    assert f32["prefill_logits_vs_float32"] == {"max_abs": 0, "mean_abs": 0, "same_argmax": 2}
    assert f32["ratio_to_float32"] == {"median": 1.0, "mean": 1.0, "min": 1.0, "max": 1.0}
    # q4's logits differ (4-bit weights, bf16 activations)
    diff = q4["prefill_logits_vs_float32"]
    assert diff["max_abs"] >= diff["mean_abs"] > 0
    assert diff["same_argmax"] == sum(r["prefill_logits_vs_float32"]["same_argmax"] for r in _per_prompt(report, "q4"))
    # not a GGUF: every matmul of q4 is quantized at load; float32 quantizes nothing
    assert set(q4["weight_sources"]) == {"quantized"} and f32["weight_sources"] == {}


def test_fidelity_counts_agree_with_the_prompts(report: dict[str, Any]) -> None:
    """q4's count of outputs equal to float32's is the prompts that never diverge; a prompt
    whose prefill argmax differs diverges at its first token, one whose argmax agrees later."""
    q4 = report["results"]["q4"]
    divergence = [r["first_divergence_from_float32"] for r in _per_prompt(report, "q4")]
    assert q4["first_divergence_from_float32"] == divergence
    assert q4["plain_equal_to_float32"] == divergence.count(None)
    for r, at in zip(_per_prompt(report, "q4"), divergence):
        assert r["plain_equal_to_float32"] is (at is None)
        assert at is None or 0 <= at < N
        assert (at == 0) is (not r["prefill_logits_vs_float32"]["same_argmax"])


@pytest.mark.parametrize("mode", ["float32", "q4"])
def test_summary_is_computed_from_the_prompt_records(report: dict[str, Any], mode: str) -> None:
    """Each summary figure is the stated function of the per-prompt seconds (N tokens each)."""
    r, recs = report["results"][mode], _per_prompt(report, mode)
    ref = [x["plain_seconds"] for x in _per_prompt(report, "float32")]
    plain = [x["plain_seconds"] for x in recs]
    assert r["num_prompts"] == 2
    assert r["plain_tokens_per_second"]["median"] == pytest.approx(statistics.median(N / s for s in plain))
    assert r["plain_overall_tokens_per_second"] == pytest.approx(N * 2 / sum(plain))
    assert r["ratio_to_float32"]["median"] == pytest.approx(statistics.median(f / s for f, s in zip(ref, plain)))
    lookup, rows = r["drafts"]["lookup"], [x["drafts"]["lookup"] for x in recs]
    seconds = [d["seconds"] for d in rows]
    speedups = [p / s for p, s in zip(plain, seconds)]
    assert [d["speedup_over_plain"] for d in rows] == pytest.approx(speedups)
    assert lookup["speedup_over_plain"]["median"] == pytest.approx(statistics.median(speedups))
    ratios = [f / s for f, s in zip(ref, seconds)]
    assert lookup["ratio_to_float32_plain"]["median"] == pytest.approx(statistics.median(ratios))
    passes = sum(d["target_passes"] for d in rows)
    assert lookup["tokens_per_target_pass"] == pytest.approx(N * 2 / passes)
    # k=2: a pass commits at most k + 1 = 3 tokens, so N tokens take at least N / 3 passes a prompt
    assert all(d["target_passes"] >= N / 3 for d in rows)
    accepted, proposed = sum(d["accepted"] for d in rows), sum(d["proposed"] for d in rows)
    assert 0 <= accepted <= proposed and lookup["accepted_of_proposed"] == pytest.approx(accepted / max(1, proposed))


def test_speculative_equals_own_plain_in_every_mode(report: dict[str, Any]) -> None:
    for mode, r in report["results"].items():
        assert r["drafts"]["lookup"]["greedy_equal"] == 2, mode
        assert r["drafts"]["lookup"]["plain_top2_margin_at_divergence"] == [None, None]
        for p in report["prompts"]:
            assert p["modes"][mode]["drafts"]["lookup"]["equal_to_plain"], (mode, p["question_id"])


def test_files_written(report: dict[str, Any]) -> None:
    out = report["_out"]
    saved = json.loads((out / "runtime_modes.json").read_text())
    assert saved["results"]["q4"]["drafts"]["lookup"]["greedy_equal"] == 2
    md = (out / "runtime_modes.md").read_text()
    assert "draftwise bench-modes --test" in md
    assert "| q4 | lookup |" in md and "| float32 | plain |" in md
    assert "| float32 | 0 / 0 | 2 |" in md  # float32 against itself: no logit difference, the same argmax
    assert "roofline" not in md
    assert is_complete_png(out / "runtime_modes.png")  # matplotlib is a test dependency
    if not llama_cpp_available():
        assert saved["llama_cpp"] == "not installed"
        assert "llama.cpp peer: not installed" in md


def test_the_probe_script_end_to_end(tiny_chat_folder: Path, tmp_path: Path, one_thread, capsys) -> None:
    """``benchmarks/modes_probe.py`` on the random chat model: a split per mode, files written."""
    out = tmp_path / "probe"
    assert probe.main(["--model", str(tiny_chat_folder), "--questions", str(_questions(tmp_path)),
                       "--modes", "float32,q4", "--repeats", "1", "--out-dir", str(out)]) == 0
    saved = json.loads((out / "modes_probe.json").read_text())
    assert list(saved["results"]) == ["float32", "q4"]
    for split in saved["results"].values():
        assert split["context"] == saved["config"]["context"] > 0
        assert split["matmul_ms"] == pytest.approx(split["forward_ms"] - split["rest_ms"])
    assert (out / "modes_probe.md").read_text() in capsys.readouterr().out
