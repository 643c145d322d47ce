"""Measuring a :class:`~draftwise.cost.batch_profile.BatchProfile`: one ``forward_batch`` pass
over B sequences with r new rows each, at each context, timed on this machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.core.engine import check_batch
from draftwise.cost.batch_profile import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    DEFAULT_ROWS,
    DEFAULT_SPREAD,
    BatchProfile,
    default_batch_profile_path,
    machine_fingerprint,
    save_batch_profile,
)
from draftwise.cost.measure import _reporter, monotone
from draftwise.cost.profile import cpu_flags, cpu_model, model_fingerprint
from draftwise.cost.timing import fast_half_mean
from draftwise.errors import ConfigError
from draftwise.runtime.base import Rows


# -- measuring -------------------------------------------------------------------------------
def _tokens(n: int, seed: int, vocab: int) -> list[int]:
    """Synthetic token ids (what they are does not change a pass's time), below ``vocab``."""
    top = max(min(vocab - 10, 2000), 1)
    return [(i * 7919 + seed * 104729) % top + min(10, vocab - 1) for i in range(n)]


def _checked(values: Sequence[int], what: str) -> list[int]:
    try:
        out = sorted({int(v) for v in values})
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be integers, not {list(values)!r}") from None
    if not out or out[0] < 1:
        raise ConfigError(f"{what} must be integers >= 1, not {list(values)!r}")
    return out


def spread_contexts(c: int, batch: int, spread: float) -> list[int]:
    """The contexts of a measured batch of ``batch`` sequences at mean context ``c``: evenly from
    ``c (1 - spread)`` to ``c (1 + spread)`` (one sequence: ``c``), as a serving batch's
    sequences sit at different lengths.

    >>> spread_contexts(128, 4, 0.5), spread_contexts(128, 1, 0.5), spread_contexts(128, 2, 0.0)
    ([64, 107, 149, 192], [128], [128, 128])
    """
    if batch == 1 or spread == 0:
        return [c] * batch
    return [max(1, round(c * (1 - spread + 2 * spread * i / (batch - 1)))) for i in range(batch)]


def _fill(rt: Any, lengths: Sequence[int], chunk: int) -> None:
    """Slots 0.. filled with ``lengths[s]`` tokens of synthetic text each (untimed)."""
    for s, n in enumerate(lengths):
        rt.rollback_slot(s, 0)
        ids = _tokens(n, s + 1, rt.vocab_size)
        for lo in range(0, n, chunk):
            last = lo + chunk >= n
            rt.forward_batch([Rows(s, ids[lo : lo + chunk], last_only=last, logits=last)])


def measure_batch_profile(
    model: Any,
    *,
    batches: Sequence[int] = DEFAULT_BATCHES,
    rows_per_seq: Sequence[int] = DEFAULT_ROWS,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    repeats: int = 3,
    spread: float = DEFAULT_SPREAD,
    prefill_chunk: int = 256,
    progress: Callable[[str, float], None] | bool = True,
) -> BatchProfile:
    """Time one ``forward_batch`` over B sequences x r rows at each context c, for every B in
    ``batches``, r in ``rows_per_seq`` and c in ``contexts`` (module docstring).

    The runtime's slots are allocated once, each batch its own (1 + 2 + 4 + 8 + 16 = 31 by
    default; refused in one line when their KV cache does not fit in memory:
    :func:`draftwise.core.engine.check_batch`). For each c, every batch's slots are filled with
    synthetic text to :func:`spread_contexts` (mean c, from c (1 - spread) to c (1 + spread): a
    batch of sequences at one length would price the pass below what a serving batch of ragged
    lengths costs, measured 1.2-1.5x at B = 8-16 here), and every timed pass is rolled back, so
    each pass over a batch sees the same cache. Each round times every batch and shape once, so a
    host that slows for a minute slows every batch alike: when each batch was timed in a block
    of its own, one profile priced served 16-sequence passes above their seconds and 8-sequence
    ones about right (docs/benchmarks.md, "Goodput at N concurrent requests"). The slots the runtime
    had before are restored (their contents are not).
    ``progress``: a ``(description, fraction)`` callback, True for a bar, False for nothing."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an integer >= 1")
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 <= spread < 1:
        raise ConfigError(f"spread={spread!r} must be a number from 0 up to (not including) 1")
    batches = _checked(batches, "batches")
    rows_per_seq = _checked(rows_per_seq, "rows per sequence")
    contexts = _checked(contexts, "contexts")
    rt = model.runtime
    if not hasattr(rt, "forward_batch"):
        raise ConfigError(f"the {type(rt).__name__} runtime runs one sequence at a time: a batch profile "
                          "needs the native runtime (Llama-family models)")
    need = max(spread_contexts(contexts[-1], batches[-1], spread)) + rows_per_seq[-1] + 1
    if need > rt.max_context:
        raise ConfigError(f"contexts up to {contexts[-1]} with {rows_per_seq[-1]} rows need {need} positions; "
                          f"the model holds {rt.max_context}")
    groups = [sum(batches[:i]) for i in range(len(batches))]  # batch i's first slot: each batch its own slots
    try:
        check_batch(model, sum(batches), need)
    except ConfigError as exc:
        raise ConfigError(f"timing batches {batches} holds {sum(batches)} sequences' caches at once: {exc}") from None
    before = (rt.slots, rt.slot_context)
    on_gpu = getattr(getattr(rt, "device", None), "type", "cpu") == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)  # a GPU pass returns before it ends
    total = len(contexts) * (repeats + 1)
    done = [0]
    report, bar = _reporter(progress, total)
    raw: dict[int, list[list[float]]] = {}
    prompt_raw: dict[int, list[list[float]]] = {}  # the same passes, prompt rows (no logits), first and last r
    ends = (rows_per_seq[0], rows_per_seq[-1])
    try:
        rt.allocate_slots(sum(batches), need)
        for c in contexts:
            samples: list[list[list[float]]] = [[[] for _ in rows_per_seq] for _ in batches]
            prompt: list[list[list[float]]] = [[[], []] for _ in batches]
            lengths = [spread_contexts(c, b, spread) for b in batches]
            _fill(rt, [n for ls in lengths for n in ls], prefill_chunk)  # once a context, every batch's slots
            for rnd in range(repeats + 1):  # round 0 warms every shape up and is not kept
                for i, b in enumerate(batches):  # in rounds over every batch and shape: drift hits each alike
                    shapes = [(samples[i][j], r, True) for j, r in enumerate(rows_per_seq)]
                    shapes += [(prompt[i][e], r, False) for e, r in enumerate(ends)]  # a prompt's chunk
                    slots = range(groups[i], groups[i] + b)
                    for kept, r, logits in shapes:
                        passes = [Rows(s, _tokens(r, 100 + s - groups[i], rt.vocab_size), logits=logits) for s in slots]
                        t0 = time.perf_counter()
                        rt.forward_batch(passes)  # verification takes every row's logits, a prompt none
                        sync()
                        elapsed = time.perf_counter() - t0
                        for s, n in zip(slots, lengths[i]):
                            rt.rollback_slot(s, n)
                        if rnd:
                            kept.append(elapsed)
                done[0] += 1
                report(f"batched passes, context {c}", done[0] / total)
            raw[c] = [[fast_half_mean(t) for t in row] for row in samples]
            prompt_raw[c] = [[fast_half_mean(t) for t in row] for row in prompt]
        report("done", 1.0)
    finally:
        if bar is not None:
            bar.stop()
        rt.allocate_slots(*before)
    return BatchProfile(
        model=model.name, fingerprint=model_fingerprint(model), machine_fingerprint=machine_fingerprint(),
        dtype=model.mode, runtime=type(rt).__name__, batches=batches, rows=rows_per_seq, contexts=contexts,
        times={c: smooth(g) for c, g in raw.items()}, raw=raw, repeats=repeats, spread=float(spread),
        machine={"threads": torch.get_num_threads(), "cpu": cpu_model(),
                 "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "torch": torch.__version__},
        created=time.strftime("%Y-%m-%dT%H:%M:%S"), prompt_share=prompt_share(raw, prompt_raw), prompt_raw=prompt_raw,
    )


def prompt_share(raw: dict[int, list[list[float]]], prompt_raw: dict[int, list[list[float]]]) -> float | None:
    """A prompt row's price as a share of a verified row's: what the rows from the first to the
    last rows per sequence add to a pass without logits, over what they add with every row's
    logits, summed over every context and batch (so the large passes, whose differences stand
    out of the noise, weigh most). None where the grid has one rows value or no difference.

    >>> prompt_share({128: [[0.010, 0.020], [0.020, 0.060]]}, {128: [[0.009, 0.017], [0.018, 0.050]]})
    0.8
    """
    verified = sum(row[-1] - row[0] for g in raw.values() for row in g)
    prompt = sum(row[1] - row[0] for g in prompt_raw.values() for row in g)
    if not verified > 0 or not prompt > 0:
        return None
    return round(prompt / verified, 4)


def smooth(grid: Sequence[Sequence[float]]) -> list[list[float]]:
    """Non-decreasing in rows (pool adjacent violators, :func:`~draftwise.cost.measure.monotone`),
    then in batch (a running maximum down each column): more rows or more sequences never cost less.

    >>> smooth([[2.0, 1.0], [1.0, 3.0]])
    [[1.5, 1.5], [1.5, 3.0]]
    """
    out = [monotone(row) for row in grid]
    for i in range(1, len(out)):
        out[i] = [max(a, b) for a, b in zip(out[i], out[i - 1])]
    return out


def resolve_batch_profile(model: Any, path: str | Path | None = None, *, measure: bool = True,
                          status: Callable[[str], None] | None = None, **settings: Any) -> BatchProfile:
    """The batch profile at ``path`` (default: :func:`default_batch_profile_path`), checked
    against ``model`` and this machine; measured (with ``settings``) and saved when missing and
    ``measure``, or when the cached one (no ``path`` given) is stale: another model fingerprint,
    machine or attention path, or no prompt rows timed. A profile named by ``path`` that does not
    fit is refused."""
    cached, stale = path is None, False
    path = Path(path).expanduser() if path is not None else default_batch_profile_path(model)
    if path.is_file():
        bp = BatchProfile.load(path)
        try:
            bp.check_model(model)
            if not bp.prompt_raw and cached and measure:  # (a share of None after timing them: no rise, kept)
                raise ConfigError("it prices a prompt's rows as verified rows: measured before prompt rows were timed")
            return bp
        except ConfigError as exc:
            if not (cached and measure):
                raise
            stale = True
            if status is not None:
                status(f"the cached batch profile no longer fits ({exc}); measuring again")
    if not measure:
        raise ConfigError(f"no batch profile at {path}; measure one first")
    if status is not None:
        status(f"measuring batched passes on this machine (once; cached at {path})")
    bp = measure_batch_profile(model, progress=False, **settings)
    save_batch_profile(bp, path, replace=stale)
    return bp
