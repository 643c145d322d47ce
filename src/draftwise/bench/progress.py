"""A progress display on stderr for long benchmarks, quiet transformers, and line output off
a terminal (a log file gets one line per finished step instead of a live bar)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' warnings and download bars for the block."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class Progress:
    """A rich progress bar on stderr (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._lines = False
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            console = Console(stderr=True)
            # no live display off a terminal (a log file): print one line per finished prompt
            self._lines = not console.is_terminal
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[rate]}"),
                console=console,
                transient=False,
            )
            self._task = self._progress.add_task("starting", total=total, rate="")

    def __enter__(self) -> Progress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, description: str, rate: str = "", advance: int = 0) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description, rate=rate, advance=advance)
            if self._lines and (advance or not rate):
                print(f"{description} {rate}".rstrip(), file=sys.stderr, flush=True)
