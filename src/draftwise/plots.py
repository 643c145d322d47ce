"""Shared plotting plumbing: every PNG draftwise writes goes through :func:`save_figure`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (folders created), close it, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` (folders created); return the path."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path
