"""Timing on this machine: one estimator for every measured cost (the profile, calibrate-self,
the distillation report), and the timed target pass.

The estimator is :func:`fast_half_mean`, the mean of the faster half of repeated timings. A
shared machine only ever *adds* time (another process, a page fault, a frequency dip), so the
slow half is mostly noise; this is steadier than the median, and it keeps ratios such as
T(k+1) / T(1), which every prediction divides by, from drifting. The planner's predictions were
validated against measured speedups with costs taken this way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from draftwise.errors import ConfigError
from draftwise.runtime.base import Runtime


def fast_half_mean(times: Sequence[float]) -> float:
    """The mean of the faster half of ``times`` (the faster ceil(n/2) values).

    >>> fast_half_mean([1.0, 9.0, 2.0, 3.0])
    1.5
    >>> fast_half_mean([4.0, 1.0, 2.0])
    1.5
    """
    if not times:
        raise ConfigError("no timings to summarise")
    ordered = sorted(times)
    half = ordered[: max(1, (len(ordered) + 1) // 2)]
    return sum(half) / len(half)


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
    """Seconds of one pass over ``n`` new tokens on a warm cache of ``context`` tokens: the
    :func:`fast_half_mean` of ``repeats`` timings (after one warm-up pass).

    Each repeat runs the pass and rolls it back, so every repeat sees the same cache length.
    """
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    prompt = [(i * 7919) % 1000 + 10 for i in range(context)]
    runtime.prefill(prompt)
    ids = [(i * 104729) % 1000 + 10 for i in range(n)]
    times = [time_pass(runtime, ids, layers=layers) for _ in range(repeats + 1)]
    return fast_half_mean(times[1:])  # the first pass warms up
