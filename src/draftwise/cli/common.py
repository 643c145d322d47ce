"""What every command shares: consoles, the common options, loading a model, and error handling.

User mistakes (a :class:`~draftwise.errors.DraftwiseError`) print one line naming the fix and
exit with status 2; they never print a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from ..errors import DraftwiseError

err = Console(stderr=True)
out = Console()
T = TypeVar("T")


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class RuntimeChoice(str, Enum):
    auto = "auto"
    native = "native"
    hf = "hf"


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a DraftwiseError into a one-line message and exit status 2."""
    try:
        yield
    except DraftwiseError as exc:
        fail(str(exc))


def load_with_status(model: str, dtype: str, runtime: str = "auto", max_context: int | None = None) -> Any:
    """Load a model behind a spinner on stderr (conversion of a GGUF takes ~35 s the first time)."""
    from ..loaders import load_model

    with err.status(f"loading model {model} ...", spinner="dots") as status:
        return load_model(
            model,
            dtype=dtype,  # type: ignore[arg-type]
            runtime=runtime,  # type: ignore[arg-type]
            max_context=max_context,
            status=lambda msg: status.update(msg),
        )


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="'default', a built-in name, a HF folder or a .gguf file.")
]
DTypeOpt = Annotated[DType, typer.Option("--dtype", help="Weights and activations dtype.")]
RuntimeOpt = Annotated[
    RuntimeChoice,
    typer.Option("--runtime", help="native (Llama family), hf (any transformers model), or auto."),
]


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[str, float], None]]:
    """A rich progress bar on stderr, driven by ``(description, fraction done)`` callbacks."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), console=err, transient=True,
    ) as bar:
        task = bar.add_task(label, total=1.0)
        yield lambda desc, frac: bar.update(task, completed=frac, description=f"{label}: {desc}")
