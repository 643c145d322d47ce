"""Reading the value lists of ``draftwise breakeven`` and ``draftwise plan``: acceptances
(``0.8``, ``0.5,0.7``, a sweep ``0.1:0.95:0.05``), numbers of proposals (``4``, ``1-8``,
``2,4,8``), plain number lists and draft kinds. Each bad value is one ConfigError line naming it.
"""

from __future__ import annotations

import math

from draftwise.cost.breakeven import DRAFT_KIND_COSTS
from draftwise.drafters.spec import int_ranges
from draftwise.errors import ConfigError

MAX_K = 256  # a sweep wider than this is almost certainly a typo (e.g. ``1-1000``)


def _float(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a number") from None
    if math.isnan(x) or math.isinf(x):
        raise ConfigError(f"{what}: {text!r} is not a finite number")
    return x


def parse_floats(text: str, what: str = "value") -> list[float]:
    """``"1.0,1.05"`` -> [1.0, 1.05].

    >>> parse_floats("1, 1.05,1.1")
    [1.0, 1.05, 1.1]
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise ConfigError(f"{what}: {text!r} is not a comma-separated list of numbers")
    return [_float(p, what) for p in parts]


def parse_acceptances(text: str) -> list[float]:
    """Acceptance values: ``0.8``, ``0.5,0.6,0.7`` or a sweep ``start:stop:step`` (stop included).

    >>> parse_acceptances("0.8"), parse_acceptances("0.5,0.7")
    ([0.8], [0.5, 0.7])
    >>> parse_acceptances("0.1:0.3:0.05")
    [0.1, 0.15, 0.2, 0.25, 0.3]
    """
    text = str(text).strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(f"acceptance sweep {text!r} must be start:stop:step, e.g. 0.1:0.95:0.05")
        start, stop, step = (_float(p.strip(), "acceptance sweep") for p in parts)
        if step <= 0 or stop < start:
            raise ConfigError(f"acceptance sweep {text!r} needs step > 0 and stop >= start")
        n = math.floor((stop - start) / step + 1e-9) + 1
        if n > 10_000:
            raise ConfigError(f"acceptance sweep {text!r} has {n} points; use a larger step")
        values = [round(start + i * step, 10) for i in range(n)]
    else:
        values = parse_floats(text, "acceptance")
    for a in values:
        if not 0 <= a < 1:
            raise ConfigError(f"acceptance {a} must be in [0, 1) (1 would mean every token accepted)")
    return values


def parse_ks(text: str) -> list[int]:
    """Numbers of proposals: ``4``, ``1-8``, ``2,4,8`` or a mix ``1-4,8``; sorted, unique.

    >>> parse_ks("4"), parse_ks("1-4"), parse_ks("8,2,4,2")
    ([4], [1, 2, 3, 4], [2, 4, 8])
    """
    ks: set[int] = set()
    try:
        ranges = int_ranges(text)
    except ValueError as exc:
        raise ConfigError(f"--k {text!r}: {exc.args[0]!r} is not a k, a range like 1-8, or a list like 2,4,8") from None
    if not ranges:
        raise ConfigError(f"--k {text!r}: give a k, a range like 1-8, or a list like 2,4,8")
    for part, lo, hi in ranges:
        if lo < 1 or hi < lo:
            raise ConfigError(f"--k {text!r}: k must be >= 1 and ranges low-high with low <= high")
        if hi > MAX_K:
            raise ConfigError(f"--k {text!r}: k up to {MAX_K} is supported")
        ks.update(range(lo, hi + 1))
    return sorted(ks)


def parse_draft_kinds(text: str) -> list[str]:
    """``lookup``, ``self``, ``model``, a comma list of them, or ``all``."""
    kinds = [p.strip() for p in str(text).split(",")]
    if kinds == ["all"]:
        return list(DRAFT_KIND_COSTS)
    for kind in kinds:
        if kind not in DRAFT_KIND_COSTS:
            raise ConfigError(
                f"unknown draft kind {kind!r}; use one of: {', '.join(DRAFT_KIND_COSTS)} (or all)"
            )
    return list(dict.fromkeys(kinds))
