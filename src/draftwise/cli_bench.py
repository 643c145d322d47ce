"""``draftwise bench``: the Spec-Bench-format harness (see draftwise.bench.harness)."""

from __future__ import annotations

from .cli import app  # noqa: F401
