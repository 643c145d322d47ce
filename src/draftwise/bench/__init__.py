"""Benchmarks: plain decoding against Hugging Face (``runtime``)."""

from __future__ import annotations

from typing import Any

__all__ = ["run_runtime_benchmark"]


def run_runtime_benchmark(**kwargs: Any) -> dict[str, Any]:
    """See :func:`draftwise.bench.runtime.run_runtime_benchmark` (imported lazily: it pulls in torch)."""
    from .runtime import run_runtime_benchmark as run

    return run(**kwargs)
