"""A check that a plot was written whole: what a test can assert about an image it cannot see."""

from __future__ import annotations

from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"  # every PNG file starts so
IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # and ends with this empty IEND chunk (its CRC included)


def is_complete_png(path: str | Path) -> bool:
    """True when ``path`` holds a PNG from its signature to its closing chunk (not an empty,
    truncated or differently formatted file)."""
    data = Path(path).read_bytes()
    return data.startswith(SIGNATURE) and data.endswith(IEND) and len(data) > len(SIGNATURE) + len(IEND)
