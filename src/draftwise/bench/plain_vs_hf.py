"""Plain greedy decoding: the draftwise native runtime vs Hugging Face ``generate``.

Both decode the same chat-templated prompts for exactly ``max_new_tokens`` tokens, greedily,
ignoring EOS, interleaved prompt by prompt (the order alternates) so that the noise of a shared
machine hits both alike. (How close plain decoding gets to the limit of reading every weight
once per token, the memory-bandwidth roofline, is a developer diagnostic outside the package.)

What is timed, for both: one call that runs the prefill and ``N - 1`` single-token forwards and
picks ``N`` argmax tokens (no forward after the last token).

- Hugging Face: ``model.generate(ids, attention_mask, max_new_tokens=N, do_sample=False,
  eos_token_id=None)``: with no EOS it never stops early and adds no logits processor, so it is
  the same algorithm as draftwise's. (``min_new_tokens=N`` would instead *suppress* EOS, i.e.
  pick the second-best token where greedy picks EOS, and the outputs would diverge there.)
- draftwise: the first ``N`` tokens of :func:`draftwise.core.decode.plain_tokens` (prefill + one
  forward per token, greedy :class:`~draftwise.core.sampling.SamplingConfig`), which does not look
  at EOS at all.

Tokens/s = N / wall seconds, prefill included. Every run must yield exactly N tokens.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.progress import Progress, quiet_transformers
from draftwise.core.decode import plain_tokens
from draftwise.core.sampling import SamplingConfig
from draftwise.cost.profile import cpu_flags, cpu_model
from draftwise.errors import ConfigError
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    read_questions,
    spread_questions,
)
from draftwise.runtime.loaders import load_model, parse_dtype

RESULT_STEM = "runtime_vs_hf"
_VALID_DTYPES = ("float32", "bfloat16")
METHOD = (
    "per prompt, HF generate(max_new_tokens=N, do_sample=False, eos_token_id=None) "
    "and the first N tokens of draftwise.core.decode.plain_tokens (greedy), interleaved, "
    "order alternating; both warmed up once; wall time includes the prefill; "
    "with repeats > 1, the fastest of the repeats per method"
)


def machine_info() -> dict[str, Any]:
    """What a reader of a benchmark needs to know about the machine and the libraries."""
    import transformers

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
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


# -- timing one prompt -----------------------------------------------------------------------


def _time_draftwise(runtime: Any, ids: list[int], n: int) -> tuple[float, list[int]]:
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
    x = torch.tensor([ids], dtype=torch.long)  # [1, n_prompt]
    with torch.inference_mode(), quiet_transformers():
        t0 = time.perf_counter()
        out = hf_model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
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


class _Pair:
    """One dtype's two contestants on the same weights: draftwise's runtime and HF's model."""

    def __init__(self, model: str | Path, dtype_name: str) -> None:
        from transformers import AutoModelForCausalLM

        with quiet_transformers():
            self.dw = load_model(model, dtype=dtype_name, runtime="native")  # type: ignore[arg-type]
            self.hf = AutoModelForCausalLM.from_pretrained(str(self.dw.folder), dtype=parse_dtype(dtype_name)).eval()
        self.rt = self.dw.runtime
        self.pad_id = next(iter(sorted(self.dw.eos_token_ids)), 0)

    def run(self, which: str, ids: list[int], n: int) -> tuple[float, list[int]]:
        if which == "hf":
            return _time_hf(self.hf, ids, n, self.pad_id)
        return _time_draftwise(self.rt, ids, n)


def _time_prompt(pair: _Pair, q: Question, ids: list[int], n: int, i: int, repeats: int) -> dict[str, Any]:
    """Best of ``repeats`` per contestant (the least disturbed run on a shared machine), the
    order alternating from run to run and from prompt to prompt."""
    times: dict[str, list[float]] = {"hf": [], "draftwise": []}
    outputs: dict[str, list[int]] = {}
    for r in range(repeats):
        for which in ("hf", "draftwise") if (i + r) % 2 == 0 else ("draftwise", "hf"):
            seconds, toks = pair.run(which, ids, n)
            if len(toks) != n:
                raise RuntimeError(f"{which} produced {len(toks)} tokens, not {n}")
            times[which].append(seconds)
            outputs.setdefault(which, toks)
    hf_s, dw_s = min(times["hf"]), min(times["draftwise"])
    equal = outputs["hf"] == outputs["draftwise"]
    return {
        "question_id": q.question_id,
        "category": q.category,
        "prompt_tokens": len(ids),
        "first": "hf" if i % 2 == 0 else "draftwise",
        "hf_seconds": hf_s,
        "draftwise_seconds": dw_s,
        "hf_seconds_all": times["hf"],
        "draftwise_seconds_all": times["draftwise"],
        "hf_tokens_per_second": n / hf_s,
        "draftwise_tokens_per_second": n / dw_s,
        "ratio": hf_s / dw_s,
        "equal_output": equal,
        "first_divergence": None if equal else _first_divergence(outputs["hf"], outputs["draftwise"]),
    }


# -- one dtype -------------------------------------------------------------------------------


def _run_dtype(model: str | Path, dtype_name: str, prompts: Sequence[Question], n: int, repeats: int,
               bar: Progress) -> dict[str, Any]:
    """Load both contestants in ``dtype_name``, time every prompt, and summarise."""
    bar.update(f"{dtype_name}: loading models")
    pair = _Pair(model, dtype_name)
    encoded = [pair.dw.encode_prompt(q.prompt) for q in prompts]
    longest = max(len(ids) for ids in encoded)
    if longest + n > pair.rt.max_context:
        raise ConfigError(
            f"the longest prompt has {longest} tokens: {longest} + max_new_tokens {n} > "
            f"the context of {pair.rt.max_context}; lower --max-new-tokens or --num-prompts"
        )
    bar.update(f"{dtype_name}: warming up")
    for which in ("hf", "draftwise"):
        pair.run(which, encoded[0], min(n, 16))
    records: list[dict[str, Any]] = []
    for i, (q, ids) in enumerate(zip(prompts, encoded)):
        label = f"{dtype_name} prompt {i + 1}/{len(prompts)}"
        bar.update(label)
        rec = _time_prompt(pair, q, ids, n, i, repeats)
        records.append(rec)
        hf_tps, dw_tps = rec["hf_tokens_per_second"], rec["draftwise_tokens_per_second"]
        bar.update(label, rate=f"hf {hf_tps:.1f} tok/s | draftwise {dw_tps:.1f} tok/s | x{rec['ratio']:.2f}", advance=1)
    hf_tps_all = [r["hf_tokens_per_second"] for r in records]
    dw_tps_all = [r["draftwise_tokens_per_second"] for r in records]
    by_category: dict[str, list[float]] = {}
    for r in records:
        by_category.setdefault(r["category"], []).append(r["ratio"])
    result = {
        "hf_tokens_per_second": _stats(hf_tps_all),
        "draftwise_tokens_per_second": _stats(dw_tps_all),
        "ratio": _stats([r["ratio"] for r in records]),
        "ratio_of_medians": statistics.median(dw_tps_all) / statistics.median(hf_tps_all),
        "equal_outputs": sum(r["equal_output"] for r in records),
        "num_prompts": len(records),
        "median_ratio_by_category": {c: statistics.median(v) for c, v in by_category.items()},
        "prompts": records,
    }
    del pair
    gc.collect()
    return result


# -- the benchmark ---------------------------------------------------------------------------


def _whole(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1" + (" (or None: torch's default)" if allow_none else ""))


def _validate(num_prompts: int, max_new_tokens: int, dtypes: Sequence[str] | str,
              threads: int | None = None, repeats: int = 1) -> tuple[str, ...]:
    """Every argument checked before anything is loaded; returns the dtype names."""
    _whole("repeats", repeats)
    _whole("threads", threads, allow_none=True)
    _whole("num_prompts", num_prompts)
    _whole("max_new_tokens", max_new_tokens)
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
    threads: int | None = None,
    repeats: int = 1,
    command: str | None = None,
) -> dict[str, Any]:
    """Benchmark plain greedy decoding, draftwise native runtime vs HF ``generate``.

    ``num_prompts`` first turns are taken round-robin over the categories of ``questions``
    (:func:`draftwise.questions.spread_questions`). Returns a JSON-ready dict (``config``,
    ``machine``, ``results`` per dtype); with ``out_dir``, also writes
    ``runtime_vs_hf.json`` and ``runtime_vs_hf.md`` there. ``repeats`` > 1 times each method
    that many times per prompt (interleaved) and keeps the fastest run; ``threads`` sets torch's
    intra-op thread count for the run (None: leave it as it is); ``command`` is the command
    line recorded in the report (default: ``sys.argv``).
    """
    names = _validate(num_prompts, max_new_tokens, dtypes, threads, repeats)
    prompts = spread_questions(read_questions(questions), num_prompts)
    command = command if command is not None else " ".join(shlex.quote(a) for a in sys.argv)
    started = time.time()
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        machine = machine_info()
        with Progress(progress, total=len(names) * len(prompts)) as bar:
            results = {d: _run_dtype(model, d, prompts, max_new_tokens, repeats, bar) for d in names}
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    report: dict[str, Any] = {
        "benchmark": "plain greedy decoding: draftwise native runtime vs transformers generate",
        "command": command,
        "config": {
            "model": str(model),
            "questions": str(Path(questions).expanduser()),
            "num_prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "dtypes": list(names),
            "repeats": repeats,
            "threads": threads_used,
            "prompts": [{"question_id": q.question_id, "category": q.category, "text": q.prompt[:80]} for q in prompts],
            "method": METHOD,
        },
        "machine": machine,
        "results": results,
        "wall_seconds": time.time() - started,
    }
    if out_dir is not None:
        write_report(report, Path(out_dir))
    return report


# -- output ----------------------------------------------------------------------------------


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a table per dtype and the command line."""
    cfg, machine = report["config"], report["machine"]
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
        "| HF / draftwise tok/s (mean) | equal outputs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, r in report["results"].items():
        lines.append(
            f"| {dtype} | {r['hf_tokens_per_second']['median']:.1f} "
            f"| {r['draftwise_tokens_per_second']['median']:.1f} "
            f"| {r['ratio']['median']:.2f}x "
            f"| {r['ratio']['min']:.2f}-{r['ratio']['max']:.2f}x "
            f"| {r['hf_tokens_per_second']['mean']:.1f} / {r['draftwise_tokens_per_second']['mean']:.1f} "
            f"| {r['equal_outputs']}/{r['num_prompts']} |"
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
    """Write ``runtime_vs_hf.json`` and ``runtime_vs_hf.md`` into ``out_dir`` (atomically)."""
    json_path = write_json_atomic(out_dir / f"{RESULT_STEM}.json", report)
    md_path = write_text_atomic(out_dir / f"{RESULT_STEM}.md", render_markdown(report))
    return json_path, md_path
