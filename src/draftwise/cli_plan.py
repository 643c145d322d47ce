"""``draftwise profile`` and ``draftwise plan``: measure costs, predict, recommend."""

from __future__ import annotations

from .cli import app  # noqa: F401
