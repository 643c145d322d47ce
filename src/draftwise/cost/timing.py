"""Measured costs on this machine: T(n) of a target pass, the cost of a partial pass."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from ..runtime.base import Runtime


def time_pass(runtime: Runtime, ids: Sequence[int], *, layers: Sequence[int] | None = None) -> float:
    """Seconds of one pass over ``ids`` on the current cache, which is then rolled back."""
    base = runtime.length
    kwargs = {} if layers is None else {"layers": layers}
    t0 = time.perf_counter()
    runtime.forward(ids, **kwargs)
    elapsed = time.perf_counter() - t0
    runtime.rollback(base)
    return elapsed


def time_forward(
    runtime: Runtime,
    n: int,
    *,
    layers: Sequence[int] | None = None,
    repeats: int = 7,
    context: int = 128,
) -> float:
    """Median seconds of one pass over ``n`` new tokens on a warm cache of ``context`` tokens.

    Each repeat runs the pass and rolls it back, so every repeat sees the same cache length.
    """
    prompt = [(i * 7919) % 1000 + 10 for i in range(context)]
    runtime.prefill(prompt)
    ids = [(i * 104729) % 1000 + 10 for i in range(n)]
    times = [time_pass(runtime, ids, layers=layers) for _ in range(repeats + 1)]
    return statistics.median(times[1:])  # the first repeat warms up
