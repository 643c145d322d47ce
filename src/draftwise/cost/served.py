"""The served step, measured: what ``draftwise serve`` spends on a batched step beyond what the
batch profile prices, so the concurrency plan predicts the server and not its passes alone.

The batch profile (:mod:`draftwise.cost.batch_profile`) times bare passes, and the ordinary
profile (:mod:`draftwise.cost.profile`) one sequence's overhead beside its pass. A served step
also runs the scheduler, resumes every sequence (sampling, verification, the stop rules,
detokenising), posts each piece to its client's queue, admits new requests and keeps its
metrics, while the clients' event loop takes its turns on the interpreter. On a host where the
pass is fast that rest is a large share of the step: a plan priced from passes alone overshot
its own server by 18-29% (docs/benchmarks.md, "Plan from what is served").

A :class:`ServedProfile` is measured on the server's own worker (the ``draftwise[serve]`` side:
:func:`draftwise.server.served_profile.measure_served_profile`), at every N of a grid, with plain
requests and with requests that speculate at a fixed k, and holds:

- ``pass_scale``: per batch size B, the served passes' seconds over what the batch profile prices
  for the same passes (their sequences, rows, prompt rows and contexts); applied to the batch
  profile (:meth:`ServedProfile.apply`), so every consumer prices a pass as served;
- ``step_seconds``, ``per_plain`` and ``per_speculating``: a step's seconds outside its pass,
  fitted by least squares as ``step_seconds + per_plain * P + per_speculating * S`` over the
  served steps, P and S the plain and speculating sequences the step resumed (a speculating
  sequence's draft is priced apart, by the profile's D(k), and taken out first).

Between measured batch sizes the scale is interpolated linearly; past them it is the nearest one.

Example::

    served = ServedProfile.load(default_served_profile_path(model))
    cost = StepCost.served_from(batch_profile, profile, served)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from draftwise.errors import ConfigError
from draftwise.fsutil import read_json, write_json_atomic

SCHEMA = "draftwise.served/1"


@dataclass(frozen=True)
class StepSample:
    """One served step: its pass (``sequences``, ``rows``, ``prompt_rows``, ``context`` summed
    over its sequences, ``pass_s``), and the seconds outside it (``outside_s``) spent on the
    ``plain`` and ``speculating`` sequences the step resumed, whose drafts the profile prices
    at ``draft_s``."""

    sequences: int
    rows: int
    prompt_rows: int
    context: int
    pass_s: float
    outside_s: float
    plain: int
    speculating: int
    draft_s: float = 0.0


@dataclass
class ServedProfile:
    """A served step's price beyond the bare pass, for one model on one machine (module docstring)."""

    model: str
    fingerprint: str
    machine_fingerprint: str
    dtype: str
    batches: list[int]
    pass_scale: dict[int, float]
    step_seconds: float
    per_plain: float
    per_speculating: float
    batch_profile_created: str = ""
    created: str = ""
    steps: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------
    def scale(self, batch: float) -> float:
        """The served passes' seconds over the batch profile's, at ``batch`` sequences."""
        bs = sorted(self.pass_scale)
        if not bs:
            return 1.0
        if batch <= bs[0]:
            return self.pass_scale[bs[0]]
        for lo, hi in zip(bs, bs[1:]):
            if batch <= hi:
                w = (batch - lo) / (hi - lo)
                return self.pass_scale[lo] + (self.pass_scale[hi] - self.pass_scale[lo]) * w
        return self.pass_scale[bs[-1]]

    def outside(self, plain: int, speculating: int) -> float:
        """A step's seconds outside its pass for ``plain`` and ``speculating`` sequences (drafts apart)."""
        return self.step_seconds + self.per_plain * plain + self.per_speculating * speculating

    def apply(self, batch: BatchProfile) -> BatchProfile:
        """``batch`` with every pass priced as served (:meth:`scale` of its batch size)."""
        self.check_batch(batch)
        times = {c: [[t * self.scale(b) for t in row] for b, row in zip(batch.batches, grid)]
                 for c, grid in batch.times.items()}
        return dataclasses.replace(batch, times=times)

    # -- checks ----------------------------------------------------------------------------
    def check_batch(self, batch: BatchProfile) -> None:
        """Refuse a batch profile other than the one this was measured against."""
        if batch.fingerprint != self.fingerprint or batch.dtype != self.dtype:
            raise ConfigError(f"the served profile was measured for {self.model!r} ({self.dtype}), not the batch "
                              f"profile's {batch.model!r} ({batch.dtype}); measure it again")
        if self.batch_profile_created and batch.created != self.batch_profile_created:
            raise ConfigError(f"the served profile scales the batch profile of {self.batch_profile_created!r}, not "
                              f"{batch.created!r}; measure it again (draftwise plan --concurrency measures it once)")

    # -- files -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["pass_scale"] = {str(b): s for b, s in self.pass_scale.items()}
        return {"schema": SCHEMA, **data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServedProfile:
        if data.get("schema") != SCHEMA:
            raise ConfigError(f"not a served profile ({data.get('schema')!r}, expected {SCHEMA!r})")
        try:
            fields = {f.name for f in dataclasses.fields(cls)}
            values = {k: v for k, v in data.items() if k in fields}
            values["pass_scale"] = {int(b): float(s) for b, s in data["pass_scale"].items()}
            values["batches"] = [int(b) for b in data["batches"]]
            for key in ("step_seconds", "per_plain", "per_speculating"):
                values[key] = float(data[key])
                if not values[key] >= 0:
                    raise ValueError(f"{key} must be >= 0")
            return cls(**values)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"a malformed served profile: {exc}") from None

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> ServedProfile:
        return cls.from_json(read_json(Path(path), "served profile", "draftwise plan --concurrency"))


def default_served_profile_path(model: Any) -> Path:
    """Beside the batch profile in the cache: ``...-served.json``."""
    batch = default_batch_profile_path(model)
    return batch.with_name(batch.name.replace("-batch.json", "-served.json"))


def fit_outside(samples: Iterable[StepSample]) -> tuple[float, float, float]:
    """(step, per plain, per speculating) seconds by least squares over ``samples``' seconds
    outside their passes less their drafts; each coefficient >= 0 (a negative one refitted without).

    >>> s = [StepSample(p + q, p + 4 * q, 0, 0, 0.01, 0.002 + 0.001 * p + 0.003 * q, p, q) for p, q in
    ...      [(1, 0), (4, 0), (16, 0), (0, 1), (0, 4), (8, 8)]]
    >>> [round(x * 1e3, 3) for x in fit_outside(s)]
    [2.0, 1.0, 3.0]
    """
    rows = [(1.0, float(s.plain), float(s.speculating), max(s.outside_s - s.draft_s, 0.0)) for s in samples
            if s.plain + s.speculating > 0]
    if not rows:
        raise ConfigError("no served steps to fit")
    data = np.array(rows)
    keep = [i for i in range(3) if data[:, i].any()]
    while True:
        coef, *_ = np.linalg.lstsq(data[:, keep], data[:, 3], rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))  # a negative price is noise: drop it and fit the rest
    out = [0.0, 0.0, 0.0]
    for i, c in zip(keep, coef):
        out[i] = max(float(c), 0.0)
    return out[0], out[1], out[2]


def fit_pass_scale(samples: Iterable[StepSample], batch: BatchProfile) -> dict[int, float]:
    """Per batch size, the served passes' seconds over the batch profile's price of the same passes."""
    served: dict[int, list[float]] = {}
    priced: dict[int, list[float]] = {}
    for s in samples:
        if s.sequences < 1 or s.sequences > batch.max_batch:
            continue
        rows = batch.priced_rows(s.rows, s.prompt_rows)
        price = batch.pass_time(s.sequences, max(rows, s.sequences), s.context / s.sequences)
        served.setdefault(s.sequences, []).append(s.pass_s)
        priced.setdefault(s.sequences, []).append(price)
    return {b: sum(served[b]) / sum(priced[b]) for b in sorted(served) if sum(priced[b]) > 0}


def served_profile(samples: Sequence[StepSample], batch: BatchProfile, *, batches: Sequence[int],
                   min_steps: int = 8, settings: Mapping[str, Any] | None = None) -> ServedProfile:
    """A :class:`ServedProfile` from the served steps ``samples`` against ``batch``; a batch size
    seen in fewer than ``min_steps`` steps gets no scale of its own (its neighbours' interpolate)."""
    counts: dict[int, int] = {}
    for s in samples:
        counts[s.sequences] = counts.get(s.sequences, 0) + 1
    scale = fit_pass_scale([s for s in samples if counts[s.sequences] >= min_steps], batch)
    if not scale:
        raise ConfigError(f"no batch size was served in {min_steps} steps or more; serve longer")
    step, plain, speculating = fit_outside(samples)
    return ServedProfile(
        model=batch.model, fingerprint=batch.fingerprint, machine_fingerprint=batch.machine_fingerprint,
        dtype=batch.dtype, batches=sorted(int(b) for b in batches), pass_scale=scale, step_seconds=step,
        per_plain=plain, per_speculating=speculating, batch_profile_created=batch.created,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"), steps=len(samples), settings=dict(settings or {}))
