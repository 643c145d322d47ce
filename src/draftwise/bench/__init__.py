"""Benchmarks: the Spec-Bench harness (``harness``) and plain decoding against Hugging Face
(``runtime``)."""

from __future__ import annotations

from typing import Any

__all__ = ["run_bench", "run_runtime_benchmark"]


def run_bench(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See :func:`draftwise.bench.harness.run_bench` (imported lazily: it pulls in torch)."""
    from .harness import run_bench as run

    return run(*args, **kwargs)


def run_runtime_benchmark(**kwargs: Any) -> dict[str, Any]:
    """See :func:`draftwise.bench.runtime.run_runtime_benchmark` (imported lazily: it pulls in torch)."""
    from .runtime import run_runtime_benchmark as run

    return run(**kwargs)
