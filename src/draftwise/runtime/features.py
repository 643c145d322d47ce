"""Hidden-state features for an EAGLE-style draft head: a per-position buffer beside the KV cache.

An EAGLE draft head predicts from the target's hidden states, so it needs them at every cache
position. A runtime records them on request (``capture_features``, see :mod:`.base`) into a
:class:`FeatureBuffer`, indexed by cache slot exactly as the K/V are:

- ``layers=None``: the output of the last decoder layer, *before* the final norm (EAGLE-1),
  ``d`` wide;
- ``layers=(a, b, c)``: the outputs of those decoder layers (0-based; the output of layer i is
  the input of layer i + 1), side by side in that order (EAGLE-3's low/mid/high), ``3 d`` wide.

The buffer follows the cache: a pass writes its slots, a rollback moves nothing (positions below
the length stay valid), ``keep`` copies the kept path's rows down as the K/V are copied.
``first .. valid - 1`` are the positions recorded: ``first`` is 0 unless the sequence's first
positions were copied from a prefix cache (``restart``: a copy has no features); a pass that records nothing (a
``forward(layers=...)`` self-speculation draft) or a capture turned on mid-sequence leaves a
gap, and ``features`` refuses it rather than hand back stale rows. :class:`FeatureCapture` gives
a runtime the three public members.

>>> buf = FeatureBuffer(None, num_layers=2, dim=3, limit=8)
>>> buf.taps, buf.width
((1,), 3)
>>> buf.write(0, 1, torch.arange(6.0).view(2, 3))
>>> buf.read(1, 2).tolist()
[[3.0, 4.0, 5.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from draftwise.errors import ConfigError

_MIN_CAPACITY = 256


class FeatureBuffer:
    """The recorded features ``[capacity, width]`` (runtime dtype), grown by doubling up to ``limit``
    positions; allocated on the first write, so turning capture on costs nothing until a pass."""

    def __init__(self, layers: Sequence[int] | None, *, num_layers: int, dim: int, limit: int) -> None:
        taps = (num_layers - 1,) if layers is None else tuple(int(i) for i in layers)
        if not taps or any(not 0 <= i < num_layers for i in taps):
            raise ConfigError(
                f"capture_features layers={list(taps)} must be a non-empty list of decoder layer "
                f"indices in [0, {num_layers}), or None for the last layer"
            )
        self.taps = taps  # the layers recorded, in column order
        self.stops = tuple(sorted(set(taps)))  # the same layers in the order a pass reaches them
        self.num_layers = num_layers
        self.dim = dim
        self.width = len(taps) * dim
        self.limit = limit
        self.valid = 0  # positions first .. valid - 1 hold recorded features
        self.first = 0  # the first recorded position (> 0 after a prefix copied without features)
        self._buf: torch.Tensor | None = None

    def write(self, start: int, layer: int, x: torch.Tensor) -> None:
        """Record ``x`` (``[n, d]``, or ``[1, n, d]``), the output of decoder ``layer`` for slots
        ``start .. start + n - 1``; the write of the last stop completes the pass."""
        x = x.reshape(-1, self.dim)
        end = start + x.shape[0]
        if self._buf is None or end > self._buf.shape[0]:
            self._grow(end, x)
        assert self._buf is not None
        for k, tap in enumerate(self.taps):
            if tap == layer:
                self._buf[start:end, k * self.dim : (k + 1) * self.dim] = x
        if layer == self.stops[-1] and start <= self.valid:
            self.valid = end
            if start == 0:  # a sequence prefilled from its first position
                self.first = 0

    def restart(self, at: int) -> None:
        """A sequence whose first ``at`` positions were copied in without features (a prefix
        cache's): what is recorded starts at ``at``, from the next pass on."""
        self.first = self.valid = at

    def forget(self, start: int) -> None:
        """A pass from ``start`` that was not recorded: slots ``>= start`` are stale now."""
        self.valid = min(self.valid, start)

    def move(self, src: torch.Tensor, dst: int) -> None:
        """Copy slots ``src`` (``[r]``, ascending) to ``dst .. dst + r - 1`` (a kept tree path)."""
        if self._buf is not None:  # gathered before the write: the two ranges may overlap
            self._buf[dst : dst + src.numel()] = self._buf.index_select(0, src.to(self._buf.device))

    def _grow(self, needed: int, like: torch.Tensor) -> None:
        capacity = 0 if self._buf is None else self._buf.shape[0]
        new = max(needed, min(max(2 * capacity, _MIN_CAPACITY), self.limit))
        # a normal tensor even inside inference_mode: a compiled pass (no_grad) writes it too
        with torch.inference_mode(False), torch.no_grad():
            buf = torch.empty(new, self.width, dtype=like.dtype, device=like.device)
            if self._buf is not None:
                buf[:capacity] = self._buf
        self._buf = buf

    def read(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, width]`` float32, a copy (later passes may overwrite the slots)."""
        if self._buf is None:  # nothing recorded yet: only an empty range gets here
            return torch.empty(0, self.width, dtype=torch.float32)
        return self._buf[start:end].to(torch.float32, copy=True)

    def run_recorded(
        self, run: Callable[[tuple[int, ...], torch.Tensor], torch.Tensor], x: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Run all decoder layers over ``x`` as ``run(layers, x) -> x`` segments that end at the
        recorded layers, recording ``x`` after each (a pass from slot ``start``)."""
        return run_recorded(run, x, [(self, 0, x.shape[-2], start)], self.num_layers)

    @classmethod
    def for_layers(cls, held: FeatureBuffer | None, layers: Sequence[int] | None, *, num_layers: int, dim: int,
                   limit: int) -> FeatureBuffer:
        """``held`` if it records ``layers`` already (what it holds stays), else a new empty buffer:
        what ``capture_features`` (and a slot's, ``capture_slot_features``) asks for."""
        new = cls(layers, num_layers=num_layers, dim=dim, limit=limit)
        return held if held is not None and held.taps == new.taps else new

    def features(self, start: int, end: int, length: int) -> torch.Tensor:
        """``read(start, end)`` of a sequence of ``length`` positions, refused where the range is
        outside it or was not recorded (see the module docstring)."""
        if not 0 <= start <= end <= length:
            raise ConfigError(f"features({start}, {end}) needs 0 <= start <= end <= length ({length})")
        if start < self.first and end > start:
            raise ConfigError(f"features of positions {start}..{self.first - 1} were not recorded: they were "
                              "copied from a prefix cache; read from feature_start on")
        if end > self.valid and end > start:
            raise ConfigError(
                f"features of positions {max(start, self.valid)}..{end - 1} were not recorded (capture was turned "
                "on later, or a forward(layers=...) draft pass wrote them); re-run them with capture on"
            )
        return self.read(start, end)


#: one sequence's rows in a batched pass: its buffer, its rows ``lo:hi`` of ``x`` and its first slot
Writer = tuple[FeatureBuffer, int, int, int]


def run_recorded(run: Callable[[tuple[int, ...], torch.Tensor], torch.Tensor], x: torch.Tensor,
                 writers: Sequence[Writer], num_layers: int) -> torch.Tensor:
    """Run all ``num_layers`` decoder layers over ``x`` (``[R, d]``: the rows of every sequence in
    a pass) as ``run(layers, x) -> x`` segments that end at the layers any writer records, each
    writer recording its rows after each of its layers. The segments run the same layers in the
    same order as one ``run`` over all of them, so recording changes no bit of the pass."""
    stops = sorted({stop for buf, *_ in writers for stop in buf.stops})
    done = 0
    for stop in (*stops, num_layers - 1):
        if stop >= done:
            x = run(tuple(range(done, stop + 1)), x)
            for buf, lo, hi, start in writers:
                if stop in buf.stops:
                    buf.write(start, stop, x[..., lo:hi, :])
            done = stop + 1
    return x


class _Host(Protocol):
    """What :class:`FeatureCapture` needs of the runtime it is mixed into."""

    _feats: FeatureBuffer | None
    _feature_dim: int  # d, the width of one decoder layer's output

    @property
    def length(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def max_context(self) -> int: ...

    def _capture_changed(self) -> None: ...


class FeatureCapture:
    """``capture_features``, ``features`` and ``feature_width`` (documented in :mod:`.base`) for
    a runtime that sets ``_feature_dim`` and writes ``_feats`` in its passes; it may override
    ``_capture_changed`` (the Hugging Face adapter adds or removes its hooks there)."""

    _feats: FeatureBuffer | None = None

    def capture_features(self: _Host, layers: Sequence[int] | None = None, *, enabled: bool = True) -> None:
        """Record hidden states per cache slot from the next pass on; ``enabled=False`` turns it
        off and frees the buffer. Asking again for the same layers keeps what is recorded."""
        self._feats = None if not enabled else FeatureBuffer.for_layers(
            self._feats, layers, num_layers=self.num_layers, dim=self._feature_dim, limit=self.max_context)
        try:
            self._capture_changed()
        except BaseException:
            self._feats = None
            raise

    def _capture_changed(self) -> None:
        pass

    @property
    def feature_width(self) -> int:
        """Columns of ``features``: ``len(layers) * d``; 0 while capture is off."""
        return 0 if self._feats is None else self._feats.width

    @property
    def feature_start(self) -> int:
        """The first position ``features`` can read (0 unless a prefix was copied in without them)."""
        return 0 if self._feats is None else self._feats.first

    def features(self: _Host, start: int, end: int) -> torch.Tensor:
        """``[end - start, width]`` float32 features of cache positions ``start .. end - 1``."""
        if self._feats is None:
            raise ConfigError("features are off: call runtime.capture_features() before the passes that need them")
        return self._feats.features(start, end, self.length)
