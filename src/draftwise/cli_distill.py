"""``draftwise distill``: train a small same-tokenizer draft by distillation."""

from __future__ import annotations

from .cli import app  # noqa: F401
