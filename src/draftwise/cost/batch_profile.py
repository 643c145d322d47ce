"""A batch profile: what one batched target pass costs on *this* machine, over B sequences that
each bring r new rows at a context of c tokens (the data, its file, measuring it, reading it).

The batched engine (:mod:`draftwise.core.engine`) runs one
:meth:`~draftwise.runtime.native.NativeRuntime.forward_batch` per step over every running
sequence's rows: 1 for a plain step, k + 1 for a chain that verifies k proposals. The goodput
model (:mod:`draftwise.cost.goodput`) needs the time of that pass as a function of

- B, the sequences in the step,
- R, the rows of the step (B r when each brings r),
- c, the context each sequence attends to (attention reads B x c keys: it grows with both).

It is *measured* on a grid, ``times[c][b][j]`` = the pass over ``batches[b]`` sequences each
with ``rows[j]`` rows at a mean context of c (every row's logits returned, as verification asks
for them; the sequences' contexts spread evenly from c (1 - ``spread``) to c (1 + ``spread``),
as a serving batch's do: ragged lengths cost more than one shared length),
and *read* by interpolation in that grid (:meth:`BatchProfile.pass_time`): linear in the mean
rows per sequence R / B, in B, and in c between the measured points. A straight line in R is
what a cost model would assume; :meth:`BatchProfile.linear_fit` says where it stops holding
(on a CPU a pass over 8 rows costs far less than 8 one-row passes, then matmuls saturate; on a
GPU T is nearly flat in R up to a knee).

Each value is the :func:`~draftwise.cost.timing.fast_half_mean` of ``repeats`` timings taken
in rounds, each over every batch and rows of one context (drift hits each alike; each batch has
slots of its own, filled once a context), made non-decreasing in r and in B (a pass with more
rows or more sequences never costs less: a dip is noise).

A prompt's chunk brings rows whose logits nobody reads (only its last row's, for the first
token), so the LM head skips them: :attr:`BatchProfile.prompt_share` is a prompt row's price as a
share of a verified row's, timed beside the grid (below 1 by about the LM head's share of a row's
weights, a fifth for SmolLM2-135M), and :meth:`BatchProfile.priced_rows` counts a pass's rows at it.

What a pass does not include comes from the ordinary :class:`~draftwise.cost.profile.Profile`:
each sequence's draft cost D(k) (drafts run one after another on the model's thread) and its
verification overhead (``step - forward``).

One file per kind of measurement, beside the other profiles
(:func:`default_batch_profile_path`: ``<model>-<mode>-<kernel>-batch.json``); :func:`save_batch_profile`
refuses to replace a file measured with other settings unless told to (``replace=True``), so a
second writer never silently swaps the grid the planner was reading.

Example::

    from draftwise import load_model
    from draftwise.cost.batch_profile import measure_batch_profile
    model = load_model("default")
    bp = measure_batch_profile(model, batches=(1, 4, 16), rows_per_seq=(1, 3, 5, 9))
    bp.pass_time(16, 16 * 3, context=512)   # 16 sequences verifying k = 2 each
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftwise.cost.profile import (
    default_profile_path,
    locked,
    machine_fingerprint,
    model_fingerprint,
)
from draftwise.errors import ConfigError
from draftwise.fsutil import fields_of, read_json, write_json_atomic

SCHEMA = "draftwise.batch-profile/1"
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_ROWS = (1, 2, 3, 4, 5, 7, 9)  # a plain step, then k = 1..8 proposals (k = 5, 7 by interpolation)
DEFAULT_CONTEXTS = (128, 1024)
DEFAULT_SPREAD = 0.5  # a measured batch's contexts run from c/2 to 3c/2 (batch_measure.spread_contexts)
LINEAR_TOLERANCE = 0.10  # a line in R "holds" while every point is within 10% of it


def default_batch_profile_path(model: Any) -> Path:
    """Where a model's batch profile is cached: the ordinary profile's name (model, mode,
    matmul kernel) with ``-batch``, so it never shares a file with another kind."""
    base = default_profile_path(model, "profile")
    return base.with_name(base.stem + "-batch.json")


def _between(points: Sequence[int], x: float) -> tuple[int, int, float]:
    """Indices (lo, hi) of the measured points around ``x`` and x's weight on hi; beyond either
    end, the last two points (a linear extrapolation)."""
    if len(points) == 1:
        return 0, 0, 0.0
    hi = min(max(bisect.bisect_left(points, x), 1), len(points) - 1)
    lo = hi - 1
    return lo, hi, (x - points[lo]) / (points[hi] - points[lo])


@dataclass
class BatchProfile:
    """Measured batched-pass times of one model on one machine (seconds); module docstring."""

    model: str
    fingerprint: str
    machine_fingerprint: str
    dtype: str
    runtime: str
    batches: list[int]
    rows: list[int]  # rows per sequence
    contexts: list[int]
    times: dict[int, list[list[float]]]  # context -> [batch index][rows index], smoothed
    raw: dict[int, list[list[float]]] = field(default_factory=dict)  # before smoothing
    repeats: int = 0
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    spread: float = 0.0  # a batch's contexts spread from c (1 - spread) to c (1 + spread); 0: all at c
    #: a prompt row's price as a share of a verified row's (no logits: the LM head is skipped),
    #: from :attr:`prompt_raw`; None: measured before draftwise priced prompt rows apart (1.0)
    prompt_share: float | None = None
    #: context -> per batch, the seconds of a pass over prompt rows (no logits) at the first and
    #: the last rows per sequence: what :attr:`prompt_share` was computed from
    prompt_raw: dict[int, list[list[float]]] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, Any]:
        """What was measured; a file holding other settings is not replaced silently."""
        return {"batches": list(self.batches), "rows": list(self.rows), "contexts": list(self.contexts),
                "repeats": self.repeats, "spread": self.spread}

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    # -- reading -------------------------------------------------------------------------
    def _at_context(self, c: int, batch: float, rows_per_seq: float) -> float:
        grid = self.times[c]
        b0, b1, wb = _between(self.batches, batch)
        r0, r1, wr = _between(self.rows, rows_per_seq)

        def at(b: int) -> float:
            return grid[b][r0] + (grid[b][r1] - grid[b][r0]) * wr

        return at(b0) + (at(b1) - at(b0)) * wb

    def pass_time(self, batch: int, rows: float, context: float | None = None) -> float:
        """T(B, R, c): one batched pass over ``rows`` rows split among ``batch`` sequences at
        ``context`` tokens each (None: the smallest measured context). Interpolated in the grid
        at R / B rows per sequence (a ragged batch is priced at its mean), linearly in B and in c
        (extrapolated past the last measured rows and context, never past the last batch)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch={batch!r} must be an integer >= 1")
        if batch > self.max_batch:
            raise ConfigError(
                f"the batch profile covers batches of up to {self.max_batch} sequences, not {batch}; "
                f"measure it again with batches up to {batch}"
            )
        if not rows >= batch:
            raise ConfigError(f"a pass over {batch} sequences has at least {batch} rows, not {rows}")
        r = rows / batch
        cs = self.contexts
        if context is None or len(cs) == 1:
            return self._at_context(cs[0], batch, r)
        c0, c1, wc = _between(cs, context)
        y0, y1 = self._at_context(cs[c0], batch, r), self._at_context(cs[c1], batch, r)
        return max(y0 + (y1 - y0) * wc, 0.0)

    def priced_rows(self, rows: float, prompt_rows: float = 0.0) -> float:
        """The rows a pass is priced at: ``rows`` verified (every row's logits) and
        ``prompt_rows`` of prompt chunks at :attr:`prompt_share` of a row each.

        >>> bp = BatchProfile(model="m", fingerprint="f", machine_fingerprint="x", dtype="float32", runtime="r",
        ...                   batches=[1], rows=[1], contexts=[128], times={128: [[0.01]]}, prompt_share=0.8)
        >>> bp.priced_rows(16, 100)
        96.0
        """
        return rows + (1.0 if self.prompt_share is None else self.prompt_share) * prompt_rows

    def rows_curve(self, batch: int, context: float | None = None) -> Callable[[float], float]:
        """R -> :meth:`pass_time` (batch, R, context) for one batch and context, precomputed: the
        goodput search prices thousands of row totals at one batch and context."""
        self.pass_time(batch, batch, context)  # checks the batch
        pts = list(self.rows)
        ys = [self.pass_time(batch, batch * r, context) for r in pts]

        def at(rows: float) -> float:
            lo, hi, w = _between(pts, rows / batch)
            return max(ys[lo] + (ys[hi] - ys[lo]) * w, 0.0)

        return at

    def linear_fit(self, tolerance: float = LINEAR_TOLERANCE) -> dict[int, dict[str, Any]]:
        """Where T is a straight line in the total rows R, per context: a least-squares line
        ``a + b R`` over the points with the smallest R, grown while every point stays within
        ``tolerance`` of it. ``holds_to_rows``: the largest R it covers; ``breaks_at_rows``: the
        first R that leaves it (None: the line holds over the whole grid); ``max_error``: its
        worst relative miss over every point. Points of every batch size at one R share the line,
        so a cost that grows with batch x context (attention) shows up as a miss too."""
        out: dict[int, dict[str, Any]] = {}
        for c in self.contexts:
            pts = sorted((b * r, self.times[c][i][j]) for i, b in enumerate(self.batches)
                         for j, r in enumerate(self.rows))
            totals = sorted({R for R, _ in pts})
            best: tuple[float, float] | None = None
            holds, breaks = totals[0], None
            for n in range(2, len(totals) + 1):
                sub = [(R, t) for R, t in pts if R <= totals[n - 1]]
                line = _least_squares(sub)
                if max(abs(t - (line[0] + line[1] * R)) / t for R, t in sub) > tolerance:
                    breaks = totals[n - 1]
                    break
                best, holds = line, totals[n - 1]
            a, b = best if best is not None else (pts[0][1], 0.0)
            worst = max(abs(t - (a + b * R)) / t for R, t in pts)
            out[c] = {"intercept_s": a, "per_row_s": b, "holds_to_rows": holds, "breaks_at_rows": breaks,
                      "max_error": worst}
        return out

    def check_model(self, model: Any, *, machine: bool = True) -> None:
        """Raise (one line) unless this profile was measured on ``model``, in its mode, on this
        machine (``machine=False`` skips the machine: reading a profile sent from elsewhere)."""
        mine = model_fingerprint(model)
        if mine != self.fingerprint:
            raise ConfigError(
                f"this batch profile was measured on model {self.model!r} (fingerprint {self.fingerprint}), "
                f"not on {model.name!r} ({mine}); measure one for this model"
            )
        if model.mode != self.dtype:
            raise ConfigError(f"this batch profile was measured in {self.dtype}, not {model.mode}; "
                              "measure it with the same --dtype and --quant")
        here = machine_fingerprint()
        if machine and here != self.machine_fingerprint:
            # a profile written before the fingerprint covered the CPU's features records no flags:
            # it may be this very machine's, and "another machine" would send the user looking
            where = ("by an older draftwise, whose machine fingerprint did not yet cover the CPU's features"
                     if "cpu_flags" not in self.machine else f"on another machine ({self.machine.get('cpu', '?')})")
            raise ConfigError(
                f"this batch profile was measured {where} (fingerprint {self.machine_fingerprint}, "
                f"this one is {here}); measure it here"
            )

    # -- files ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = SCHEMA
        out["times"] = {str(c): v for c, v in self.times.items()}
        out["raw"] = {str(c): v for c, v in self.raw.items()}
        out["prompt_raw"] = {str(c): v for c, v in self.prompt_raw.items()}
        out["linear_fit"] = {str(c): v for c, v in self.linear_fit().items()}  # for readers; recomputed on load
        return out

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON, atomically (see :func:`save_batch_profile` for the guard)."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the batch profile") -> BatchProfile:
        """Read :meth:`to_dict`'s output, checking its shape; errors name ``source``."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"{source} is not a draftwise batch profile (schema {got!r}, want {SCHEMA!r})")
        with fields_of(source, "measure it again"):
            batches = _ints(data["batches"], "batches")
            rows = _ints(data["rows"], "rows")
            contexts = _ints(data["contexts"], "contexts")
            times = _grids(data["times"], contexts, len(batches), len(rows), "times")
            raw = _grids(data["raw"], contexts, len(batches), len(rows), "raw") if data.get("raw") else {}
            for key in ("model", "fingerprint", "machine_fingerprint", "dtype", "runtime"):
                if not isinstance(data[key], str):
                    raise ValueError(f"{key!r} must be a string")
            return cls(model=data["model"], fingerprint=data["fingerprint"],
                       machine_fingerprint=data["machine_fingerprint"], dtype=data["dtype"],
                       runtime=data["runtime"], batches=batches, rows=rows, contexts=contexts, times=times,
                       raw=raw, repeats=int(data.get("repeats", 0)), machine=dict(data.get("machine", {})),
                       created=str(data.get("created", "")), spread=float(data.get("spread", 0.0)),
                       prompt_share=_share(data.get("prompt_share")),
                       prompt_raw=_grids(data["prompt_raw"], contexts, len(batches), 2, "prompt_raw")
                       if data.get("prompt_raw") else {})

    @classmethod
    def load(cls, path: str | Path) -> BatchProfile:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"no batch profile at {path}; measure one (measure_batch_profile, then save_batch_profile)")
        return cls.from_dict(read_json(path, "batch profile", "measure_batch_profile"), source=str(path))


def _least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def _share(value: Any) -> float | None:
    if value is None:
        return None
    share = float(value)
    if not 0 < share <= 2:
        raise ValueError(f"'prompt_share' must be a number in (0, 2], not {value!r}")
    return share


def _ints(values: Any, what: str) -> list[int]:
    """A non-empty, strictly increasing list of integers >= 1."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{what!r} must be a non-empty list of integers")
    out = [int(v) for v in values]
    if out[0] < 1 or any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{what!r} must be increasing integers >= 1, not {out}")
    return out


def _grids(data: Any, contexts: list[int], nb: int, nr: int, what: str) -> dict[int, list[list[float]]]:
    if not isinstance(data, dict) or sorted(int(c) for c in data) != contexts:
        raise ValueError(f"{what!r} must map each of the contexts {contexts} to a grid of seconds")
    out = {}
    for c, grid in data.items():
        if not isinstance(grid, list) or len(grid) != nb or any(not isinstance(g, list) or len(g) != nr for g in grid):
            raise ValueError(f"{what}[{c}] must be {nb} lists (one per batch) of {nr} seconds (one per rows)")
        vals = [[float(x) for x in g] for g in grid]
        if not all(math.isfinite(x) and x > 0 for g in vals for x in g):
            raise ValueError(f"{what}[{c}] holds a time that is not a finite number > 0")
        out[int(c)] = vals
    return out


def save_batch_profile(profile: BatchProfile, path: str | Path | None = None, *, model: Any = None,
                       replace: bool = False) -> Path:
    """Write ``profile`` to ``path`` (default: :func:`default_batch_profile_path` of ``model``),
    under the profile lock. A file already there measured with other settings (batches, rows,
    contexts, repeats), on another model or another machine, is kept and this is a ConfigError
    unless ``replace``: one file per kind, and no second writer silently overwrites it."""
    if path is None:
        if model is None:
            raise ConfigError("save_batch_profile needs a path or the model (for the default path)")
        path = default_batch_profile_path(model)
    path = Path(path).expanduser()
    with locked(path):
        if path.exists() and not replace:
            try:
                old = BatchProfile.load(path)
            except ConfigError:
                old = None
            same = old is not None and (old.settings, old.fingerprint, old.machine_fingerprint, old.dtype) == (
                profile.settings, profile.fingerprint, profile.machine_fingerprint, profile.dtype)
            if not same:
                what = "is not a batch profile" if old is None else f"holds one measured with {old.settings}"
                raise ConfigError(
                    f"{path} {what}, not {profile.settings} on this model and machine; pass replace=True "
                    "(CLI: --replace) to overwrite it, or write to another file"
                )
        return profile.save(path)
