"""Shared plotting plumbing: every plot draftwise writes goes through :func:`save_figure`.

A plot's kind comes from its file's extension (``.png``, ``.pdf``, ``.svg`` ...);
:func:`check_plot_path` refuses one matplotlib cannot write in one line, so a command calls it
before any work. matplotlib is optional (``pip install 'draftwise[plot]'``). Without it :func:`pyplot` raises
:class:`PlottingUnavailable`, and a command that also writes other files calls its plot through
:func:`try_plot`, which reports one line and carries on: a missing plot never costs the user the
tables and JSON the run produced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from draftwise.errors import ConfigError

T = TypeVar("T")

#: how to get the plots; shown by every message about a missing matplotlib
PLOT_INSTALL_HINT = "pip install 'draftwise[plot]'"


class PlottingUnavailable(ConfigError, ImportError):
    """matplotlib is not installed. An ImportError too, so ``except ImportError`` still works."""


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlottingUnavailable(f"plots need matplotlib, which is not installed: {PLOT_INSTALL_HINT}") from None
    return plt


def plotting_available() -> bool:
    """Whether :func:`pyplot` will work (checked by importing matplotlib, so it is cached)."""
    try:
        pyplot()
    except PlottingUnavailable:
        return False
    return True


def _stderr_line(message: str) -> None:
    print(message, file=sys.stderr)


def try_plot(
    draw: Callable[..., T],
    *args: Any,
    label: str = "the plot",
    warn: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> T | None:
    """``draw(*args, **kwargs)``, or, when matplotlib is missing, one line naming ``label`` to
    ``warn`` (default: standard error) and None. Other errors propagate.
    """
    try:
        return draw(*args, **kwargs)
    except PlottingUnavailable:
        (warn or _stderr_line)(f"skipped {label}: matplotlib is not installed ({PLOT_INSTALL_HINT})")
        return None


def plot_formats() -> list[str]:
    """The file extensions matplotlib can write, without the dot: ``['avif', 'eps', ... 'png',
    ... 'svg', ...]`` (raises :class:`PlottingUnavailable` without matplotlib)."""
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_plot_path(path: str | Path, what: str = "the plot") -> Path:
    """``path`` if matplotlib can write a file with its extension, else a ConfigError naming the
    extensions it can write: ``check_plot_path("speedup.txt", "--plot")`` raises ``--plot
    speedup.txt: matplotlib cannot write a .txt file; end the name with one of .avif, .eps, ...
    (e.g. speedup.png)``. Needs matplotlib (:class:`PlottingUnavailable` otherwise)."""
    path = Path(path)
    formats = plot_formats()
    suffix = path.suffix.lower().removeprefix(".")
    if suffix not in formats:
        kind = f"a .{suffix} file" if suffix else "a file without an extension"
        raise ConfigError(
            f"{what} {path}: matplotlib cannot write {kind}; end the name with one of "
            f"{', '.join('.' + f for f in formats)} (e.g. {path.with_suffix('.png')})"
        )
    return path


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (folders created), close it, return the path.
    The kind of file follows the extension (:func:`check_plot_path`)."""
    try:
        path = check_plot_path(path)
    except ConfigError:
        pyplot().close(fig)
        raise
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path

