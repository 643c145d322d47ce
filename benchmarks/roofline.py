"""The memory-bandwidth roofline of plain decoding, per weight format: how fast it could go if each
token cost only reading every weight once, and how close the native runtime gets.

    python benchmarks/roofline.py --modes float32,bfloat16,q4,int8 -n 64 --out-dir benchmarks/results/roofline

- bytes per token (:func:`weight_bytes_per_token`): every weight tensor a single-token forward
  reads (all layer weights and biases, the final norm, the head; a tied head is the embedding
  matrix, counted once), plus the one embedding row the lookup reads. The KV cache is reported
  apart (:func:`kv_bytes_per_token`: it grows with the context; at short lengths it is a few
  percent).
- copy bandwidth (:func:`measure_bandwidth`): ``dst.copy_(src)`` over a buffer, counting read +
  write bytes (2 x the buffer per copy); read bandwidth: ``src.sum()`` over the same buffer,
  counting the bytes read. Medians of several repeats, with torch's current thread count. The
  read bandwidth over a buffer the size of the weights is reported too (it may sit in a large
  last-level cache).
- roofline tokens/s = bandwidth / bytes per token; plain decoding's tokens/s (the median of
  ``--repeats`` runs of ``-n`` greedy tokens on the first dev question, prefill included) as a
  share of it.

The modes are ``draftwise bench-modes``'s (:data:`draftwise.bench.modes.MODES`). Writes
``roofline.json`` and ``roofline.md`` into ``--out-dir`` where given, and prints the Markdown.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.modes import MODES, parse_modes
from draftwise.bench.plain_vs_hf import machine_info
from draftwise.bench.progress import quiet_transformers
from draftwise.core.decode import plain_tokens
from draftwise.core.sampling import SamplingConfig
from draftwise.errors import DraftwiseError
from draftwise.fsutil import check_writable, write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, spread_questions
from draftwise.runtime.loaders import load_model

MIB = 1 << 20
RESULT_STEM = "roofline"


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def weight_bytes_per_token(runtime: Any) -> dict[str, int]:
    """Bytes of weights a :class:`~draftwise.runtime.native.NativeRuntime` reads per decoded token.

    Every layer tensor (fused q/k/v with its bias, o, fused gate/up, down, both norms), the
    final norm and the head; a tied head (the embedding matrix) is counted once, as the head;
    the embedding lookup reads one row. Sizes are those of the runtime's own tensors, so the
    dtype and weight format (``quant``) it was loaded in are the ones counted: a 4-bit matmul
    counts its packed nibbles and its scales.
    """
    layers = 0
    for i in range(runtime.num_layers):
        layers += sum(m.nbytes for m in runtime.matmuls(i))
        layers += _nbytes(runtime.ln_attn[i]) + _nbytes(runtime.ln_mlp[i])
    embed_row = runtime.embed.shape[1] * runtime.embed.element_size()
    out = {
        "layers": layers,
        "final_norm": _nbytes(runtime.final_norm),
        "head": runtime.head_matmul.nbytes,
        "embedding_row": embed_row,
        "tied_head": int(runtime.head is runtime.embed),
    }
    out["total"] = out["layers"] + out["final_norm"] + out["head"] + out["embedding_row"]
    return out


def kv_bytes_per_token(runtime: Any, context: int) -> int:
    """Bytes of K and V cache one single-token forward reads at a context of ``context``."""
    per_position = 2 * runtime.n_kv * runtime.head_dim * runtime.k_cache[0].element_size()
    return runtime.num_layers * per_position * int(context)


def _seconds(fn: Any, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure_bandwidth(size_bytes: int = 512 * MIB, *, repeats: int = 9, warmup: int = 2) -> dict[str, float]:
    """Memory bandwidth in GB/s (1e9 bytes/s), medians of ``repeats`` timed runs.

    ``copy_gbps``: ``dst.copy_(src)`` counting read + write (2 x ``size_bytes`` per copy);
    ``read_gbps``: ``src.sum()`` counting the ``size_bytes`` read. ``*_best_gbps``: the
    fastest repeat (the least disturbed, on a shared machine).
    """
    n = max(1, int(size_bytes) // 4)
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = n * 4
    with torch.inference_mode():
        copy_s = _seconds(lambda: dst.copy_(src), repeats, warmup)
        read_s = _seconds(lambda: src.sum(), repeats, warmup)
    del src, dst
    return {
        "buffer_bytes": float(nbytes),
        "copy_gbps": 2 * nbytes / statistics.median(copy_s) / 1e9,
        "read_gbps": nbytes / statistics.median(read_s) / 1e9,
        "copy_best_gbps": 2 * nbytes / min(copy_s) / 1e9,
        "read_best_gbps": nbytes / min(read_s) / 1e9,
    }


def roofline(weights: dict[str, int], bandwidth: dict[str, float], tokens_per_second: float) -> dict[str, float]:
    """Roofline tokens/s at the copy and the read bandwidth (``weights["total"]`` bytes a token),
    and ``tokens_per_second`` as a percentage of each.

    >>> r = roofline({"total": 500_000_000}, {"copy_gbps": 10.0, "read_gbps": 8.0}, 10.0)
    >>> r["roofline_tokens_per_second_copy_bw"], r["percent_of_roofline_copy_bw"], r["roofline_tokens_per_second_read_bw"]
    (20.0, 50.0, 16.0)
    """
    copy = bandwidth["copy_gbps"] * 1e9 / weights["total"]
    read = bandwidth["read_gbps"] * 1e9 / weights["total"]
    return {
        "roofline_tokens_per_second_copy_bw": copy,
        "roofline_tokens_per_second_read_bw": read,
        "percent_of_roofline_copy_bw": 100 * tokens_per_second / copy,
        "percent_of_roofline_read_bw": 100 * tokens_per_second / read,
    }


def plain_seconds(runtime: Any, ids: list[int], n: int) -> float:
    """Seconds for the first ``n`` greedy tokens of plain decoding after ``ids``, prefill included."""
    cfg = SamplingConfig()  # temperature 0: greedy
    with torch.inference_mode():
        t0 = time.perf_counter()
        tokens = plain_tokens(runtime, ids, cfg, cfg.generator())
        out = list(itertools.islice(tokens, n))
        seconds = time.perf_counter() - t0
        tokens.close()
    if len(out) != n:
        raise RuntimeError(f"plain decoding produced {len(out)} tokens, not {n}")
    return seconds


def measure_mode(model: str, mode: str, prompt: str, n: int, repeats: int, bandwidth: dict[str, float]) -> dict[str, Any]:
    """One weight format: its bytes per token, its plain tokens/s and where they sit against the roofline."""
    dtype, quant = MODES[mode]
    with quiet_transformers():
        loaded = load_model(model, dtype=dtype, quant=quant)  # type: ignore[arg-type]
    rt = loaded.runtime
    ids = loaded.encode_prompt(prompt)
    plain_seconds(rt, ids, min(n, 8))  # warm-up
    seconds = [plain_seconds(rt, ids, n) for _ in range(repeats)]
    tps = n / statistics.median(seconds)
    weights = weight_bytes_per_token(rt)
    at_size = measure_bandwidth(weights["total"], repeats=7)["read_gbps"]
    context = len(ids) + (n - 1) // 2
    return {
        "dtype": dtype, "quant": quant, "prompt_tokens": len(ids), "plain_seconds": seconds,
        "plain_tokens_per_second": tps,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token_at_mean_context": kv_bytes_per_token(rt, context), "mean_context": context,
        **roofline(weights, bandwidth, tps),
        "read_gbps_at_weight_size": at_size,
        "roofline_tokens_per_second_read_bw_at_weight_size": at_size * 1e9 / weights["total"],
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one row per mode, the bandwidths and the command line."""
    cfg, machine, bw = report["config"], report["machine"], report["bandwidth"]
    lines = [
        "# The memory-bandwidth roofline of plain decoding",
        "",
        f"Model `{cfg['model']}`, {cfg['max_new_tokens']} greedy tokens on one dev prompt (prefill included), median "
        f"of {cfg['repeats']} runs. Machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, torch "
        f"{machine['torch']} with {cfg['threads']} thread(s).",
        "",
        "| mode | plain tok/s | weight MB/token | roofline tok/s (copy bw) | % of roofline | roofline tok/s (read bw) "
        "| % (read bw) | read GB/s at weight size | roofline tok/s there | KV cache MB/token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, r in report["results"].items():
        lines.append(
            f"| {mode} | {r['plain_tokens_per_second']:.1f} | {r['weight_bytes_per_token']['total'] / 1e6:.1f} "
            f"| {r['roofline_tokens_per_second_copy_bw']:.1f} | {r['percent_of_roofline_copy_bw']:.0f}% "
            f"| {r['roofline_tokens_per_second_read_bw']:.1f} | {r['percent_of_roofline_read_bw']:.0f}% "
            f"| {r['read_gbps_at_weight_size']:.1f} | {r['roofline_tokens_per_second_read_bw_at_weight_size']:.1f} "
            f"| {r['kv_bytes_per_token_at_mean_context'] / 1e6:.2f} (context {r['mean_context']}) |"
        )
    lines += [
        "",
        f"Memory bandwidth ({bw['buffer_bytes'] / MIB:.0f} MiB buffer, medians): copy {bw['copy_gbps']:.1f} GB/s "
        f"counting read + write bytes (`dst.copy_(src)`), read {bw['read_gbps']:.1f} GB/s (`src.sum()`); best "
        f"repeats: copy {bw['copy_best_gbps']:.1f}, read {bw['read_best_gbps']:.1f} GB/s. Roofline tok/s = bandwidth "
        "/ weight bytes per token (every layer weight, the final norm, the head once (a tied head is the "
        "embedding), one embedding row; packed 4-bit nibbles and scales, int8 and its scales).",
        "",
        "Produced by:",
        "",
        "```",
        report["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default', a built-in name, a HF folder or a .gguf")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="the prompt is its first question's first turn")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    parser.add_argument("--max-new-tokens", "-n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed plain runs per mode (the median counts)")
    parser.add_argument("--bandwidth-mib", type=int, default=512, help="buffer size of the bandwidth test")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out-dir", type=Path, default=None, help="write roofline.json and roofline.md here")
    args = parser.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    try:
        names = parse_modes(args.modes)
        for name in ("max_new_tokens", "repeats", "bandwidth_mib"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
        if args.out_dir is not None:
            check_writable(args.out_dir)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        prompt = spread_questions(read_questions(args.questions), 1)[0].prompt
        print(f"measuring memory bandwidth ({args.bandwidth_mib} MiB)", file=sys.stderr)
        bandwidth = measure_bandwidth(args.bandwidth_mib * MIB)
        results = {}
        for name in names:
            print(f"{name}: loading and timing plain decoding", file=sys.stderr)
            results[name] = measure_mode(args.model, name, prompt, args.max_new_tokens, args.repeats, bandwidth)
    except DraftwiseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = {
        "benchmark": "the memory-bandwidth roofline of plain decoding, per weight format",
        "command": command,
        "config": {"model": args.model, "questions": str(args.questions), "modes": list(names),
                   "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                   "bandwidth_mib": args.bandwidth_mib, "threads": torch.get_num_threads()},
        "machine": machine_info(),
        "bandwidth": bandwidth,
        "results": results,
    }
    md = render_markdown(report)
    if args.out_dir is not None:
        write_json_atomic(args.out_dir / f"{RESULT_STEM}.json", report)
        write_text_atomic(args.out_dir / f"{RESULT_STEM}.md", md)
        print(f"wrote {args.out_dir / (RESULT_STEM + '.json')} and {args.out_dir / (RESULT_STEM + '.md')}", file=sys.stderr)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
