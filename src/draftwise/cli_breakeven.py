"""``draftwise breakeven``: the break-even calculator (needs no model)."""

from __future__ import annotations

from .cli import app  # noqa: F401
