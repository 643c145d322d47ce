"""benchmarks/peer_bench.py's pure parts: option parsing, the prompt plan, the stream and metrics
parsers, the per-phase summary and the equality counts (no server, no vLLM, no model)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from .benchmark_scripts import load_benchmark

pytest.importorskip("httpx")
peer = load_benchmark("peer_bench")


def test_engines_parse_and_unknown_ones_are_refused():
    assert peer.parse_engines("draftwise:plain, vllm:eagle3,vllm") == [
        ("draftwise", "plain"), ("vllm", "eagle3"), ("vllm", "plain")]
    for bad, match in (("sglang:plain", "unknown engine"), ("vllm:medusa", "no configuration"),
                       ("vllm:plain,vllm:plain", "twice"), (" , ", "at least one")):
        with pytest.raises(ValueError, match=match):
            peer.parse_engines(bad)


def test_ints_and_env_parse():
    assert peer.parse_ints("1,2,4,8,16", "--clients") == [1, 2, 4, 8, 16]
    for bad in ("0,1", "1,1", "a", ""):
        with pytest.raises(ValueError):
            peer.parse_ints(bad, "--clients")
    assert peer.parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        peer.parse_env(["NOVALUE"])


def test_percentiles_are_nearest_rank():
    assert peer.pct([3.0, 1.0, 2.0], 50) == 2.0
    assert peer.pct([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert peer.pct([5.0], 50) == 5.0
    assert math.isnan(peer.pct([], 50))


def test_each_n_gets_new_prompts_unless_asked_for_the_same():
    plan = peer.prompt_plan([1, 2, 4], 2, 100, same=False)
    assert plan[1] == [[0, 1]]
    assert plan[2] == [[2, 3], [4, 5]]
    assert plan[4] == [[6, 7], [8, 9], [10, 11], [12, 13]]
    assert peer.prompts_needed([1, 2, 4], 2, same=False) == 14
    same = peer.prompt_plan([1, 2], 2, 100, same=True)
    assert same[1] == [[0, 1]] and same[2] == [[0, 1], [2, 3]]
    assert peer.prompts_needed([1, 2], 2, same=True) == 4
    assert peer.prompt_plan([1, 2], 2, 3, same=False)[2] == [[2, 0], [1, 2]]  # wraps when short


def test_sse_lines_parse():
    assert peer.parse_sse_line("") is None
    assert peer.parse_sse_line(": ping") is None
    assert peer.parse_sse_line("data: [DONE]") == "done"
    assert peer.parse_sse_line('data: {"a": 1}') == {"a": 1}


def _chunk(content=None, finish=None, usage=None, **extra):
    choices = [] if content is None and finish is None else [
        {"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}]
    body = {"object": "chat.completion.chunk", "choices": choices, **extra}
    if usage is not None:
        body["usage"] = usage
    return body


def test_a_vllm_stream_counts_tokens_from_its_usage_chunk():
    s = peer.StreamState()
    s.feed(_chunk(""), 0.1)  # the role chunk: empty content is not the first token
    s.feed(_chunk("Hel", usage=None), 0.5)
    s.feed(_chunk("lo"), 0.6)
    s.feed(_chunk(finish="stop"), 0.7)
    assert s.tokens == (2, "chunks")
    s.feed(_chunk(usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}), 0.7)
    assert (s.text, s.ttft, s.finish_reason, s.tokens) == ("Hello", 0.5, "stop", (3, "usage"))


def test_a_draftwise_stream_keeps_its_speculative_statistics_and_errors_are_kept():
    s = peer.StreamState()
    s.feed(_chunk("x"), 0.2)
    s.feed(_chunk(finish="length", usage={"completion_tokens": 4}, speculative={"draft": "suffix", "k": "auto"}), 0.3)
    assert s.extra == {"speculative": {"draft": "suffix", "k": "auto"}}
    assert s.tokens == (4, "usage")
    s.feed({"error": {"message": "boom", "type": "server_error"}}, 0.4)
    assert s.error == "boom"


PROM = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smollm2"} 13.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="smollm2"} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smollm2"} 39.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smollm2"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2",position="0"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smollm2",position="2"} 1.0
vllm:num_requests_running{engine="0",model_name="a,b \\"q\\""} 0.0
process_open_fds 12
"""


def test_prometheus_text_parses_with_labels_and_quoted_commas():
    samples = peer.parse_prometheus(PROM)
    assert ("process_open_fds", {}, 12.0) in samples
    running = [s for s in samples if s[0] == "vllm:num_requests_running"]
    assert running == [("vllm:num_requests_running", {"engine": "0", "model_name": 'a,b "q"'}, 0.0)]
    assert len(samples) == 9


def test_spec_counters_sum_vllm_and_draftwise_names_and_deltas_give_acceptance():
    after = peer.spec_counters(peer.parse_prometheus(PROM))
    assert after == {"drafts": 13.0, "draft_tokens": 39.0, "accepted": 9.0, "per_pos": [6.0, 2.0, 1.0]}
    ours = ('draftwise:spec_decode_num_drafts_total{model_name="m",draft="suffix"} 4\n'
            'draftwise:spec_decode_num_drafts_total{model_name="m",draft="lookup"} 6\n'
            'draftwise:spec_decode_num_draft_tokens_total{model_name="m",draft="suffix"} 20\n'
            'draftwise:spec_decode_num_accepted_tokens_total{model_name="m",draft="suffix"} 10\n')
    assert peer.spec_counters(peer.parse_prometheus(ours))["drafts"] == 10.0
    before = {"drafts": 3.0, "draft_tokens": 9.0, "accepted": 1.0, "per_pos": [1.0]}
    d = peer.counter_delta(before, after)
    assert (d["drafts"], d["draft_tokens"], d["accepted"], d["per_pos"]) == (10.0, 30.0, 8.0, [5.0, 2.0, 1.0])
    assert d["acceptance"] == pytest.approx(8 / 30)
    assert d["mean_acceptance_length"] == pytest.approx(1.8)
    assert d["per_pos_rate"] == pytest.approx([0.5, 0.2, 0.1])
    empty = peer.spec_counters([])
    assert peer.counter_delta(empty, empty)["acceptance"] is None


def _rec(config, n, prompt, text, *, tokens=4, e2e=1.0, ttft=0.5, error=None, lost=False, dtype="float32"):
    return {"engine": config.split(":")[0], "config": config, "dtype": dtype, "n": n, "prompt": prompt,
            "text": text, "tokens": tokens, "e2e": e2e, "ttft": ttft, "error": error, "lost": lost,
            "tokens_from": "usage"}


def test_a_phase_summary_counts_tokens_over_wall_time_and_leaves_failures_out():
    recs = [_rec("vllm:plain", 2, 0, "a", tokens=10, e2e=2.0, ttft=0.2),
            _rec("vllm:plain", 2, 1, "b", tokens=30, e2e=3.0, ttft=0.4),
            _rec("vllm:plain", 2, 2, "", tokens=0, error="HTTP 500")]
    s = peer.summarize(recs, 4.0)
    assert (s["requests"], s["ok"], s["errors"], s["lost"], s["tokens"]) == (3, 2, 1, 0, 40)
    assert s["tokens_per_s"] == 10.0
    assert s["per_request_tps"] == pytest.approx((5 + 10) / 2)
    assert (s["ttft_p50_s"], s["ttft_p99_s"]) == (peer.pct([0.2, 0.4], 50), 0.4)  # the failed one left out
    assert math.isnan(peer.summarize([], 1.0)["ttft_p50_s"])


def test_equality_counts_against_own_plain_and_the_other_engines_plain():
    configs = [("draftwise", "plain"), ("draftwise", "suffix"), ("vllm", "plain"), ("vllm", "eagle3")]
    recs = [_rec("draftwise:plain", 1, 0, "x"), _rec("draftwise:plain", 1, 1, "y"),
            _rec("draftwise:suffix", 1, 0, "x"), _rec("draftwise:suffix", 1, 1, "y"),
            _rec("vllm:plain", 1, 0, "x"), _rec("vllm:plain", 1, 1, "Y"),
            _rec("vllm:eagle3", 1, 0, "x"), _rec("vllm:eagle3", 1, 1, "", error="HTTP 500"),
            _rec("vllm:plain", 1, 0, "x", dtype="bfloat16")]  # no draftwise bfloat16: no cross baseline
    eq = peer.equality(recs, configs)
    assert eq[("draftwise:plain", "float32", 1)]["same"] is None  # not compared with itself
    assert eq[("draftwise:plain", "float32", 1)]["cross"] == [1, 2]
    assert eq[("draftwise:suffix", "float32", 1)]["same"] == [2, 2]
    assert eq[("draftwise:suffix", "float32", 1)]["cross"] == [1, 2]
    assert eq[("vllm:plain", "float32", 1)]["cross"] == [1, 2]
    assert eq[("vllm:eagle3", "float32", 1)]["same"] == [1, 2]  # a failed request counts as unequal
    assert eq[("vllm:eagle3", "float32", 1)]["cross_vs"] == "draftwise:plain"
    assert eq[("vllm:plain", "bfloat16", 1)]["cross"] is None


def test_commands_carry_the_config_the_dtype_and_the_extra_arguments(tmp_path):
    args = argparse.Namespace(
        draftwise_model="default", port=8011, max_batch=16, clients_list=[1, 16], max_tokens=128,
        draftwise_arg=["--threads", "2"], vllm_python=str(tmp_path / "venv" / "bin" / "python"),
        model_dir=tmp_path / "model", head_dir=tmp_path / "head", draft_dir=tmp_path / "draft", num_spec_tokens=3,
        ngram_max=4, ngram_min=2, max_model_len=2048, vllm_arg=["--max-num-batched-tokens", "4096"],
        vllm_env_dict={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})
    dw = peer.draftwise_command(args, "suffix", "bfloat16")
    assert dw[1:2] == ["serve"] and dw[-6:] == ["--draft", "suffix", "--k", "auto", "--threads", "2"]
    assert "bfloat16" in dw and "16" in dw
    v = peer.vllm_command(args, "eagle3", "float32")
    assert v[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and v[-2:] == ["--max-num-batched-tokens", "4096"]
    spec = json.loads(v[v.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(tmp_path / "head"), "num_speculative_tokens": 3}
    assert "--speculative-config" not in peer.vllm_command(args, "plain", "float32")
    assert peer.vllm_spec_config("ngram", args)["prompt_lookup_max"] == 4
    env = peer.vllm_env(args)
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "LD_PRELOAD" not in env  # no libiomp5.so in that venv


def test_the_table_renders_rows_and_servers():
    row = {"config": "vllm:eagle3", "dtype": "float32", "n": 2, "requests": 2, "errors": 0, "lost": 0,
           "tokens_per_s": 41.25, "per_request_tps": 20.5, "ttft_p50_s": 0.1, "ttft_p99_s": float("nan"),
           "spec": {"acceptance": 0.25, "mean_acceptance_length": 1.75}, "equal_same": [2, 2], "equal_cross": None}
    summary = {"config": {"prompts": 4, "questions": "q.jsonl", "same_prompts": False, "requests": 1,
                          "max_tokens": 8, "cpus": 2, "cpu": "x", "date": "d", "command": "c"},
               "rows": [row], "servers": [{"config": "vllm:eagle3", "dtype": "float32", "command": ["python", "-m", "v"],
                                           "env_set": {"A": "1"}, "startup_s": 120.0}]}
    text = peer.render(summary)
    assert "| vllm:eagle3 | float32 | 2 | 2 | 0 | 41.2 | 20.5 | 0.10 s | - | 0.25 | 1.75 | 2/2 | - |" in text
    assert "`A=1 python -m v`" in text
