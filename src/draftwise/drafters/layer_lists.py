"""Layer lists (``self:layers=0-3,7``) and integer ranges: read and written, with one-line errors."""

from __future__ import annotations

from collections.abc import Sequence

from draftwise.errors import ConfigError


def clip(text: str, limit: int = 60) -> str:
    """A user's value for an error message, cut so a huge one cannot flood the terminal."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def int_ranges(text: str) -> list[tuple[str, int, int]]:
    """``"0-3, 7"`` -> ``[("0-3", 0, 3), ("7", 7, 7)]``: each comma-separated part with its
    bounds (empty parts skipped). A part that is not ``N`` or ``N-M`` raises ``ValueError(part)``;
    callers check the bounds and word the error for their option.

    >>> int_ranges("0-3, 7")
    [('0-3', 0, 3), ('7', 7, 7)]
    """
    out: list[tuple[str, int, int]] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo_text, dash, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise ValueError(part) from None
        out.append((part, lo, hi))
    return out


def parse_layer_list(text: str) -> tuple[int, ...]:
    """``"0-3,7"`` -> ``(0, 1, 2, 3, 7)``: sorted, unique, each >= 0 (no upper bound here).

    >>> parse_layer_list("7, 0-3")
    (0, 1, 2, 3, 7)
    """
    try:
        ranges = int_ranges(text)
    except ValueError:
        raise ConfigError(f"cannot read layer list {clip(text)}; write it like '0-3,7'") from None
    out: set[int] = set()
    for part, lo, hi in ranges:
        if lo < 0 or hi < lo or hi - lo > 100_000:
            raise ConfigError(f"layer range {clip(part)} is not a range of layer numbers like '0-3'")
        out.update(range(lo, hi + 1))
    if not out:
        raise ConfigError(f"the layer list {clip(text)} is empty; write it like '0-3,7'")
    return tuple(sorted(out))


def format_layers(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3,7"`` (the inverse of :func:`parse_layer_list`).

    >>> format_layers([0, 1, 2, 3, 7, 9, 10])
    '0-3,7,9-10'
    """
    parts: list[list[int]] = []
    for i in sorted(set(layers)):
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
