"""Benchmarks, as commands and scripts (never as timed unit tests).

- ``draftwise bench`` (:func:`run_bench`): a Spec-Bench-compatible benchmark of every draft
  against plain decoding on any workload. Modules: :mod:`.methods` (what runs),
  :mod:`.runner` (running one method on one question), :mod:`.hf_peer` (Hugging Face
  ``generate`` as a peer), :mod:`.answers` (answer files), :mod:`.outdir` (the output folder
  and a safe ``--resume``), :mod:`.summary`, :mod:`.equality`, :mod:`.report`, :mod:`.run`.
- ``draftwise bench-runtime`` (:func:`run_runtime_benchmark`): plain decoding, the native
  runtime against Hugging Face ``generate`` (:mod:`.plain_vs_hf`), with the memory-bandwidth
  roofline (:mod:`.roofline`).
"""

from __future__ import annotations

from .plain_vs_hf import render_markdown as render_runtime_markdown
from .plain_vs_hf import run_runtime_benchmark
from .report import render_markdown
from .run import run_bench

__all__ = ["render_markdown", "render_runtime_markdown", "run_bench", "run_runtime_benchmark"]
