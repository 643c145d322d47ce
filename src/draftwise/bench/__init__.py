"""Benchmarks, as commands and scripts (never as timed unit tests).

- ``draftwise bench`` (:func:`run_bench`): a Spec-Bench-compatible benchmark of every draft
  against plain decoding on any workload. Modules: :mod:`.methods` (what runs),
  :mod:`.runner` (running one method on one question), :mod:`.hf_peer` (Hugging Face
  ``generate`` as a peer), :mod:`.answers` (answer files), :mod:`.outdir` (the output folder
  and a safe ``--resume``), :mod:`.summary`, :mod:`.equality`, :mod:`.report`, :mod:`.run`.
- ``draftwise bench-runtime`` (:func:`run_runtime_benchmark`): plain decoding, the native
  runtime against Hugging Face ``generate`` (:mod:`.plain_vs_hf`): speed and equal outputs.
- ``draftwise bench-modes`` (:func:`run_modes_benchmark`): the native runtime's weight formats
  (float32, bfloat16, q4, int8), plain and speculative, with fidelity against float32 and
  llama.cpp as an optional peer (:mod:`.modes`, :mod:`.llama_cpp_peer`, :mod:`.modes_report`).

Diagnostics of the runtime itself (the memory-bandwidth roofline, the split of a token's time
between the matmuls and the rest) are developer scripts outside the package (docs/runtime.md).
"""

from __future__ import annotations

from draftwise.bench.modes import run_modes_benchmark
from draftwise.bench.modes_report import render_markdown as render_modes_markdown
from draftwise.bench.plain_vs_hf import render_markdown as render_runtime_markdown
from draftwise.bench.plain_vs_hf import run_runtime_benchmark
from draftwise.bench.report import render_markdown
from draftwise.bench.run import run_bench

__all__ = [
    "render_markdown",
    "render_modes_markdown",
    "render_runtime_markdown",
    "run_bench",
    "run_modes_benchmark",
    "run_runtime_benchmark",
]
