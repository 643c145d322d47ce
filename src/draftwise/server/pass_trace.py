"""A trace of the batched server's target passes, for finding which passes a cost model misprices.

With ``DRAFTWISE_PASS_TRACE=FILE`` in the environment, ``draftwise serve --max-batch N`` (N > 1)
records every pass of its engine and appends them to FILE as JSON lines, each time its batch
empties and every 1,024 passes under load (so memory stays bounded):
``{"sequences", "prompting", "prompt_rows", "rows", "context", "seconds"}`` (``prompting``: the
sequences feeding a prompt chunk, ``prompt_rows`` their rows; ``rows``: the other rows,
decoding and verification; ``context``: the positions already in the pass's sequences' caches,
summed), to price against the batch profile (docs/benchmarks.md, "Goodput at N concurrent requests").
Off by default: nothing is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TRACE_ENV = "DRAFTWISE_PASS_TRACE"
FLUSH_EVERY = 1024
FIELDS = ("sequences", "prompting", "prompt_rows", "rows", "context", "seconds")


def attach(engine: Any) -> None:
    """Start recording ``engine``'s passes when the environment names a trace file."""
    if os.environ.get(TRACE_ENV):
        engine.stats.trace = []


def enabled() -> bool:
    """Whether the environment names a trace file."""
    return bool(os.environ.get(TRACE_ENV))


def flush(engine: Any, *, idle: bool = True) -> None:
    """Append the passes recorded since the last flush to the trace file, and forget them: when
    the batch is ``idle`` (empty), or once 1,024 are held."""
    path, trace = os.environ.get(TRACE_ENV), engine.stats.trace
    if path and trace and (idle or len(trace) >= FLUSH_EVERY):
        with Path(path).open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(dict(zip(FIELDS, t, strict=True))) + "\n" for t in trace)
        trace.clear()
