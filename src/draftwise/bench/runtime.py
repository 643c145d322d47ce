"""Plain greedy decoding: the draftwise native runtime vs Hugging Face ``generate``.

Both decode the same chat-templated prompts for exactly ``max_new_tokens`` tokens, greedily,
ignoring EOS, interleaved prompt by prompt (the order alternates) so that the noise of a shared
machine hits both alike. A memory-bandwidth roofline says how close plain decoding gets to the
limit of reading every weight once per token.

What is timed, for both: one call that runs the prefill and ``N - 1`` single-token forwards and
picks ``N`` argmax tokens (no forward after the last token).

- Hugging Face: ``model.generate(ids, attention_mask, max_new_tokens=N, do_sample=False,
  eos_token_id=None)``: with no EOS it never stops early and adds no logits processor, so it is
  the same algorithm as draftwise's. (``min_new_tokens=N`` would instead *suppress* EOS, i.e.
  pick the second-best token where greedy picks EOS, and the outputs would diverge there.)
- draftwise: the first ``N`` tokens of :func:`draftwise.decode.plain_tokens` (prefill + one
  forward per token, greedy :class:`~draftwise.sampling.SamplingConfig`), which does not look
  at EOS at all.

Tokens/s = N / wall seconds, prefill included. Every run must yield exactly N tokens.

Roofline conventions (see :func:`weight_bytes_per_token`, :func:`measure_bandwidth`):

- bytes per token: every weight tensor a single-token forward reads (all layer weights and
  biases, the final norm, the head; a tied head is the embedding matrix, counted once), plus
  the one embedding row the lookup reads. The KV cache is reported apart (it grows with the
  context; at these lengths it is a few percent).
- copy bandwidth: ``dst.copy_(src)`` over a 512 MiB buffer, counting read + write bytes
  (2 x 512 MiB per copy); read bandwidth: ``src.sum()`` over the same buffer, counting the
  bytes read. Medians of several repeats, with torch's current thread count.
- roofline tokens/s = copy bandwidth / bytes per token (the read-bandwidth roofline is reported
  too, and so is the read bandwidth over a buffer the size of the weights, which may sit in a
  large last-level cache).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

#: the Spec-Bench-format development questions, next to the repository (``../shared``)
DEFAULT_QUESTIONS = (
    Path(__file__).resolve().parents[3].parent / "shared" / "data" / "spec_bench" / "question_dev.jsonl"
)
RESULT_STEM = "runtime_vs_hf"
_MIB = 1 << 20
_VALID_DTYPES = ("float32", "bfloat16")


# -- prompts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptSpec:
    """One benchmark prompt: the first turn of a Spec-Bench question."""

    question_id: Any
    category: str
    text: str


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a Spec-Bench-format JSONL file (``question_id``, ``category``, ``turns``)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"questions file not found: {path}; pass a Spec-Bench-format .jsonl file "
            "(one {'question_id', 'category', 'turns': [...]} object per line)"
        )
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno} is not valid JSON: {exc}") from exc
            turns = row.get("turns") if isinstance(row, dict) else None
            if (
                not isinstance(turns, list)
                or not turns
                or not isinstance(turns[0], str)
                or not turns[0].strip()
            ):
                raise ConfigError(
                    f"{path}:{lineno} has no non-empty first turn; each line needs "
                    "'turns': [\"<prompt>\", ...]"
                )
            rows.append(row)
    if not rows:
        raise ConfigError(f"questions file {path} is empty; it needs at least one question")
    return rows


def select_prompts(rows: Sequence[dict[str, Any]], num_prompts: int) -> list[PromptSpec]:
    """``num_prompts`` first-turn prompts spread over the categories, deterministically.

    Round-robin over the categories in the order they first appear in the file, taking each
    category's questions in file order; a category that runs out is skipped.

    >>> rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
    ...         for i, c in enumerate("aaabcc")]
    >>> [(p.category, p.text) for p in select_prompts(rows, 5)]
    [('a', 'q0'), ('b', 'q3'), ('c', 'q4'), ('a', 'q1'), ('c', 'q5')]
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ConfigError(f"num_prompts={num_prompts!r} must be an integer >= 1")
    if num_prompts > len(rows):
        raise ConfigError(
            f"num_prompts={num_prompts} but the questions file has only {len(rows)} questions; "
            f"pass --num-prompts {len(rows)} or fewer"
        )
    by_category: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_category.setdefault(str(row.get("category", "uncategorised")), []).append(row)
    queues = {c: iter(rs) for c, rs in by_category.items()}
    chosen: list[PromptSpec] = []
    while len(chosen) < num_prompts:
        for category, queue in queues.items():
            row = next(queue, None)
            if row is None:
                continue
            chosen.append(PromptSpec(row.get("question_id"), category, row["turns"][0]))
            if len(chosen) == num_prompts:
                break
    return chosen


# -- roofline --------------------------------------------------------------------------------


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def weight_bytes_per_token(runtime: Any) -> dict[str, int]:
    """Bytes of weights a :class:`~draftwise.runtime.native.NativeRuntime` reads per decoded token.

    Every layer tensor (fused q/k/v with its bias, o, fused gate/up, down, both norms), the
    final norm and the head; a tied head (the embedding matrix) is counted once, as the head;
    the embedding lookup reads one row. Sizes are those of the runtime's own tensors, so the
    dtype it was loaded in is the one counted.
    """
    layers = 0
    for i in range(runtime.num_layers):
        layers += _nbytes(runtime.wqkv[i]) + _nbytes(runtime.bqkv[i]) + _nbytes(runtime.wo[i])
        layers += _nbytes(runtime.w_gate_up[i]) + _nbytes(runtime.w_down[i])
        layers += _nbytes(runtime.ln_attn[i]) + _nbytes(runtime.ln_mlp[i])
    embed_row = runtime.embed.shape[1] * runtime.embed.element_size()
    out = {
        "layers": layers,
        "final_norm": _nbytes(runtime.final_norm),
        "head": _nbytes(runtime.head),
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


def measure_bandwidth(size_bytes: int = 512 * _MIB, *, repeats: int = 9, warmup: int = 2) -> dict[str, float]:
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


# -- machine ---------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(AttributeError, RuntimeError):
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


# -- timing ----------------------------------------------------------------------------------


def _time_draftwise(runtime: Any, ids: list[int], n: int) -> tuple[float, list[int]]:
    from ..decode import plain_tokens
    from ..sampling import SamplingConfig

    cfg = SamplingConfig()  # temperature 0: greedy
    generator = cfg.generator()
    with torch.inference_mode():
        t0 = time.perf_counter()
        tokens = plain_tokens(runtime, ids, cfg, generator)
        out = list(itertools.islice(tokens, n))
        seconds = time.perf_counter() - t0
        tokens.close()
    return seconds, out


def _time_hf(hf_model: Any, ids: list[int], n: int, pad_id: int) -> tuple[float, list[int]]:
    x = torch.tensor([ids], dtype=torch.long)
    mask = torch.ones_like(x)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = hf_model.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,  # never stop early, suppress nothing: plain greedy for n tokens
            pad_token_id=pad_id,
        )
        seconds = time.perf_counter() - t0
    return seconds, out[0, len(ids) :].tolist()


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class _Progress:
    """A rich progress bar on stderr (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._lines = False
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            console = Console(stderr=True)
            # no live display off a terminal (a log file): print one line per finished prompt
            self._lines = not console.is_terminal
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[rate]}"),
                console=console,
                transient=False,
            )
            self._task = self._progress.add_task("starting", total=total, rate="")

    def __enter__(self) -> _Progress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, description: str, rate: str = "", advance: int = 0) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description, rate=rate, advance=advance)
            if self._lines and (advance or not rate):
                print(f"{description} {rate}".rstrip(), file=sys.stderr, flush=True)


# -- the benchmark ---------------------------------------------------------------------------


def _validate(
    num_prompts: int,
    max_new_tokens: int,
    dtypes: Sequence[str],
    bandwidth_mib: int,
    threads: int | None = None,
    repeats: int = 1,
) -> tuple[str, ...]:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an integer >= 1")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads={threads!r} must be an integer >= 1 (or None: torch's default)")
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ConfigError(f"num_prompts={num_prompts!r} must be an integer >= 1")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if isinstance(bandwidth_mib, bool) or not isinstance(bandwidth_mib, int) or bandwidth_mib < 1:
        raise ConfigError(f"bandwidth_mib={bandwidth_mib!r} must be an integer >= 1")
    if isinstance(dtypes, str):
        dtypes = [d.strip() for d in dtypes.split(",")]
    names = tuple(str(getattr(d, "value", d)) for d in dtypes)
    if not names:
        raise ConfigError("dtypes is empty; pass float32, bfloat16 or both")
    bad = [d for d in names if d not in _VALID_DTYPES]
    if bad:
        raise ConfigError(f"dtype(s) {bad} not supported; use {', '.join(_VALID_DTYPES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"dtypes {list(names)} repeats a dtype")
    return names


def run_runtime_benchmark(
    *,
    model: str | Path = "default",
    questions: str | Path = DEFAULT_QUESTIONS,
    num_prompts: int = 20,
    max_new_tokens: int = 128,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    out_dir: str | Path | None = None,
    progress: bool = True,
    bandwidth_mib: int = 512,
    threads: int | None = None,
    repeats: int = 1,
    command: str | None = None,
) -> dict[str, Any]:
    """Benchmark plain greedy decoding, draftwise native runtime vs HF ``generate``.

    Returns a JSON-ready dict (``config``, ``machine``, ``bandwidth``, ``results`` per dtype);
    with ``out_dir``, also writes ``runtime_vs_hf.json`` and ``runtime_vs_hf.md`` there.
    ``repeats`` > 1 times each method that many times per prompt (interleaved) and keeps the
    fastest run; ``threads`` sets torch's intra-op thread count for the run (None: leave it as it is);
    ``command`` is the command line recorded in the report (default: ``sys.argv``).
    See the module docstring for what is timed and the roofline conventions.
    """
    names = _validate(num_prompts, max_new_tokens, dtypes, bandwidth_mib, threads, repeats)
    prompts = select_prompts(load_questions(questions), num_prompts)
    if command is None:
        command = " ".join(shlex.quote(a) for a in sys.argv)

    started = time.time()
    n = max_new_tokens
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        report = _run(
            model, questions, prompts, n, names, progress, bandwidth_mib, repeats, command
        )
    finally:
        torch.set_num_threads(old_threads)
    report["wall_seconds"] = time.time() - started
    if out_dir is not None:
        write_report(report, Path(out_dir))
    return report


def _run(
    model: str | Path,
    questions: str | Path,
    prompts: list[PromptSpec],
    n: int,
    names: tuple[str, ...],
    progress: bool,
    bandwidth_mib: int,
    repeats: int,
    command: str,
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from ..loaders import load_model, parse_dtype

    machine = machine_info()
    with _Progress(progress, total=len(names) * len(prompts)) as bar:
        bar.update(f"measuring memory bandwidth ({bandwidth_mib} MiB)")
        bandwidth = measure_bandwidth(bandwidth_mib * _MIB)
        results: dict[str, Any] = {}
        for dtype_name in names:
            bar.update(f"{dtype_name}: loading models")
            torch_dtype = parse_dtype(dtype_name)
            with _quiet_transformers():
                dw = load_model(model, dtype=dtype_name, runtime="native")  # type: ignore[arg-type]
                rt = dw.runtime
                hf = AutoModelForCausalLM.from_pretrained(str(dw.folder), dtype=torch_dtype).eval()
            pad_id = next(iter(sorted(dw.eos_token_ids)), 0)
            encoded = [dw.encode_prompt(p.text) for p in prompts]
            longest = max(len(ids) for ids in encoded)
            if longest + n > rt.max_context:
                raise ConfigError(
                    f"the longest prompt has {longest} tokens: {longest} + max_new_tokens {n} > "
                    f"the context of {rt.max_context}; lower --max-new-tokens or --num-prompts"
                )

            bar.update(f"{dtype_name}: warming up")
            warm = min(n, 16)
            with _quiet_transformers():
                _time_hf(hf, encoded[0], warm, pad_id)
            _time_draftwise(rt, encoded[0], warm)

            records: list[dict[str, Any]] = []
            for i, (spec, ids) in enumerate(zip(prompts, encoded)):
                bar.update(f"{dtype_name} prompt {i + 1}/{len(prompts)}")
                # best of `repeats` per method (the least disturbed run on a shared machine),
                # the order alternating from run to run and from prompt to prompt
                times: dict[str, list[float]] = {"hf": [], "draftwise": []}
                outputs: dict[str, list[int]] = {}
                for r in range(repeats):
                    order = ("hf", "draftwise") if (i + r) % 2 == 0 else ("draftwise", "hf")
                    for which in order:
                        if which == "hf":
                            with _quiet_transformers():
                                seconds, toks = _time_hf(hf, ids, n, pad_id)
                        else:
                            seconds, toks = _time_draftwise(rt, ids, n)
                        if len(toks) != n:
                            raise RuntimeError(f"{which} produced {len(toks)} tokens, not {n}")
                        times[which].append(seconds)
                        outputs.setdefault(which, toks)
                runs = {w: (min(times[w]), outputs[w]) for w in times}
                hf_tps = n / runs["hf"][0]
                dw_tps = n / runs["draftwise"][0]
                equal = runs["hf"][1] == runs["draftwise"][1]
                records.append(
                    {
                        "question_id": spec.question_id,
                        "category": spec.category,
                        "prompt_tokens": len(ids),
                        "first": "hf" if i % 2 == 0 else "draftwise",
                        "hf_seconds": runs["hf"][0],
                        "draftwise_seconds": runs["draftwise"][0],
                        "hf_seconds_all": times["hf"],
                        "draftwise_seconds_all": times["draftwise"],
                        "hf_tokens_per_second": hf_tps,
                        "draftwise_tokens_per_second": dw_tps,
                        "ratio": dw_tps / hf_tps,
                        "equal_output": equal,
                        "first_divergence": None
                        if equal
                        else _first_divergence(runs["hf"][1], runs["draftwise"][1]),
                    }
                )
                bar.update(
                    f"{dtype_name} prompt {i + 1}/{len(prompts)}",
                    rate=f"hf {hf_tps:.1f} tok/s | draftwise {dw_tps:.1f} tok/s "
                    f"| x{dw_tps / hf_tps:.2f}",
                    advance=1,
                )

            bar.update(f"{dtype_name}: read bandwidth at the model's size")
            weights = weight_bytes_per_token(rt)
            model_size_read = measure_bandwidth(weights["total"], repeats=7)["read_gbps"]
            mean_context = statistics.fmean(len(ids) for ids in encoded) + (n - 1) / 2
            kv = kv_bytes_per_token(rt, round(mean_context))
            hf_tps_all = [r["hf_tokens_per_second"] for r in records]
            dw_tps_all = [r["draftwise_tokens_per_second"] for r in records]
            ratios = [r["ratio"] for r in records]
            dw_median = statistics.median(dw_tps_all)
            hf_median = statistics.median(hf_tps_all)
            roof_copy = bandwidth["copy_gbps"] * 1e9 / weights["total"]
            roof_read = bandwidth["read_gbps"] * 1e9 / weights["total"]
            by_category: dict[str, list[float]] = {}
            for r in records:
                by_category.setdefault(r["category"], []).append(r["ratio"])
            results[dtype_name] = {
                "hf_tokens_per_second": _stats(hf_tps_all),
                "draftwise_tokens_per_second": _stats(dw_tps_all),
                "ratio": _stats(ratios),
                "ratio_of_medians": dw_median / hf_median,
                "equal_outputs": sum(r["equal_output"] for r in records),
                "num_prompts": len(records),
                "median_ratio_by_category": {
                    c: statistics.median(v) for c, v in by_category.items()
                },
                "roofline": {
                    "weight_bytes_per_token": weights,
                    "kv_bytes_per_token_at_mean_context": kv,
                    "mean_context": mean_context,
                    "roofline_tokens_per_second_copy_bw": roof_copy,
                    "roofline_tokens_per_second_read_bw": roof_read,
                    "read_gbps_at_weight_size": model_size_read,
                    "roofline_tokens_per_second_read_bw_at_weight_size": model_size_read
                    * 1e9
                    / weights["total"],
                    "draftwise_percent_of_roofline_copy_bw": 100 * dw_median / roof_copy,
                    "draftwise_percent_of_roofline_read_bw": 100 * dw_median / roof_read,
                    "hf_percent_of_roofline_copy_bw": 100 * hf_median / roof_copy,
                },
                "prompts": records,
            }
            del dw, rt, hf
            gc.collect()

    report: dict[str, Any] = {
        "benchmark": "plain greedy decoding: draftwise native runtime vs transformers generate",
        "command": command,
        "config": {
            "model": str(model),
            "questions": str(Path(questions).expanduser()),
            "num_prompts": len(prompts),
            "max_new_tokens": n,
            "dtypes": list(names),
            "bandwidth_mib": bandwidth_mib,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "prompts": [asdict(p) | {"text": p.text[:80]} for p in prompts],
            "method": (
                "per prompt, HF generate(max_new_tokens=N, do_sample=False, eos_token_id=None) "
                "and the first N tokens of draftwise.decode.plain_tokens (greedy), interleaved, "
                "order alternating; both warmed up once; wall time includes the prefill; "
                "with repeats > 1, the fastest of the repeats per method"
            ),
        },
        "machine": machine,
        "bandwidth": bandwidth,
        "results": results,
    }
    return report


# -- output ----------------------------------------------------------------------------------


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a table per dtype, the roofline and the command line."""
    cfg, machine, bw = report["config"], report["machine"], report["bandwidth"]
    lines = [
        "# Plain greedy decoding: draftwise native runtime vs transformers `generate`",
        "",
        f"Model `{cfg['model']}`, {cfg['num_prompts']} prompts (first turns, round-robin over "
        f"the categories of `{Path(cfg['questions']).name}`), {cfg['max_new_tokens']} new tokens "
        "each, greedy, EOS ignored; baseline and draftwise interleaved prompt by prompt"
        + (f", best of {cfg['repeats']} runs each" if cfg.get("repeats", 1) > 1 else "")
        + ". Tokens/s include the prefill.",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, torch "
        f"{machine['torch']} with {machine['torch_threads']} thread(s), transformers "
        f"{machine['transformers']}.",
        "",
        "| dtype | HF tok/s (median) | draftwise tok/s (median) | speedup median | speedup min-max "
        "| HF / draftwise tok/s (mean) | equal outputs | weight MB/token | roofline tok/s "
        "| draftwise % of roofline |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, r in report["results"].items():
        roof = r["roofline"]
        lines.append(
            f"| {dtype} | {r['hf_tokens_per_second']['median']:.1f} "
            f"| {r['draftwise_tokens_per_second']['median']:.1f} "
            f"| {r['ratio']['median']:.2f}x "
            f"| {r['ratio']['min']:.2f}-{r['ratio']['max']:.2f}x "
            f"| {r['hf_tokens_per_second']['mean']:.1f} / {r['draftwise_tokens_per_second']['mean']:.1f} "
            f"| {r['equal_outputs']}/{r['num_prompts']} "
            f"| {roof['weight_bytes_per_token']['total'] / 1e6:.1f} "
            f"| {roof['roofline_tokens_per_second_copy_bw']:.1f} "
            f"| {roof['draftwise_percent_of_roofline_copy_bw']:.0f}% |"
        )
    lines += [
        "",
        f"Memory bandwidth ({bw['buffer_bytes'] / _MIB:.0f} MiB buffer, medians): copy "
        f"{bw['copy_gbps']:.1f} GB/s counting read + write bytes (`dst.copy_(src)`), read "
        f"{bw['read_gbps']:.1f} GB/s (`src.sum()`); best repeats: copy "
        f"{bw.get('copy_best_gbps', float('nan')):.1f}, read {bw.get('read_best_gbps', float('nan')):.1f} GB/s. Roofline tok/s = copy bandwidth / weight "
        "bytes per token (every layer weight, the final norm, the head once (a tied head is the "
        "embedding), one embedding row).",
        "",
        "| dtype | roofline tok/s (read bw) | draftwise % (read bw) | read GB/s at weight size "
        "| roofline tok/s there | KV cache MB/token at mean context |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for dtype, r in report["results"].items():
        roof = r["roofline"]
        lines.append(
            f"| {dtype} | {roof['roofline_tokens_per_second_read_bw']:.1f} "
            f"| {roof['draftwise_percent_of_roofline_read_bw']:.0f}% "
            f"| {roof['read_gbps_at_weight_size']:.1f} "
            f"| {roof['roofline_tokens_per_second_read_bw_at_weight_size']:.1f} "
            f"| {roof['kv_bytes_per_token_at_mean_context'] / 1e6:.2f} "
            f"(context {roof['mean_context']:.0f}) |"
        )
    lines += [
        "",
        f"Wall time: {report['wall_seconds'] / 60:.1f} min. Produced by:",
        "",
        "```",
        report["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``runtime_vs_hf.json`` and ``runtime_vs_hf.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{RESULT_STEM}.json"
    md_path = out_dir / f"{RESULT_STEM}.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, md_path
