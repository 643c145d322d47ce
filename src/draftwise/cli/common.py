"""What every command shares: consoles, the common options, loading a model, and error handling.

User mistakes (a :class:`~draftwise.errors.DraftwiseError`) print one line naming the fix and
exit with status 2; they never print a traceback. Messages quote what the user typed, so they are
printed with rich markup escaped (``--draft "[/x]"`` shows ``[/x]``, it does not crash rich) and
with any undecodable byte shown as an escape.
"""

from __future__ import annotations

import sys
from pathlib import Path
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ConfigError, DraftwiseError
from ..loaders import load_model
from ..plots import try_plot
from ..threads import check_threads, set_threads

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


class Quant(str, Enum):
    none = "none"
    q4 = "q4"
    int8 = "int8"


def plain(text: object) -> str:
    """``text`` safe inside a markup string: one line, markup escaped, undecodable bytes
    (surrogate escapes from a non-UTF-8 argument) shown as ``\\udcff``, not a crash."""
    line = " ".join(str(text).splitlines())
    return escape(line.encode("utf-8", "backslashreplace").decode("utf-8"))


def fail(message: str) -> None:
    """Print ``error: message`` on one line of stderr and exit with status 2."""
    err.print(f"[bold red]error:[/] {plain(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def warn(message: str) -> None:
    """Print ``warning: message`` on one line of stderr and carry on."""
    err.print(f"[yellow]warning:[/] {plain(message)}", highlight=False, soft_wrap=True)


def plot_or_warn(draw: Callable[..., T], *args: Any, label: str = "the plot", **kwargs: Any) -> T | None:
    """Draw a plot, or without matplotlib say so in one line and go on writing everything else."""
    return try_plot(draw, *args, label=label, warn=warn, **kwargs)


def utf8_text(text: str, what: str) -> str:
    """``text`` if it is valid Unicode; a non-UTF-8 argument (which Python keeps as surrogate
    escapes) is a ConfigError naming the first bad byte."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = f"0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else repr(bad)
        raise ConfigError(f"{what} is not valid UTF-8 (byte {byte} at character {exc.start}); pass UTF-8 text") from None
    return text


def read_stdin_text(what: str = "the prompt on standard input") -> str:
    """Standard input decoded as UTF-8; anything else is a ConfigError, not a traceback."""
    stream = getattr(sys.stdin, "buffer", None)
    try:
        if stream is None:  # a replaced text stream (tests): it has done the decoding
            return sys.stdin.read()
        return stream.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "pass UTF-8 text"
        ) from None


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a DraftwiseError into a one-line message and exit status 2."""
    try:
        yield
    except DraftwiseError as exc:
        fail(str(exc))


def load_with_status(
    model: str,
    dtype: str,
    runtime: str = "auto",
    max_context: int | None = None,
    *,
    device: str = "cpu",
    quant: str = "none",
    compile: bool = False,
    threads: int | None = None,
) -> Any:
    """Set ``--threads``, then load a model behind a spinner on stderr (conversion of a GGUF
    takes ~35 s the first time). ``device``, ``quant`` and ``compile`` go to
    :func:`draftwise.load_model`, which refuses what it cannot honour."""
    set_threads(threads)
    with err.status(f"loading model {plain(model)} ...", spinner="dots") as status:
        return load_model(
            model,
            dtype=dtype,  # type: ignore[arg-type]
            runtime=runtime,  # type: ignore[arg-type]
            max_context=max_context,
            device=device,
            quant=quant,
            compile=compile,
            status=lambda msg: status.update(plain(msg)),
        )


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="'default', a built-in name, a HF folder or a .gguf file.")
]
QuestionsOpt = Annotated[
    Path,
    typer.Option(
        help="Spec-Bench-format JSONL or a text file, one prompt a line.",
        show_default="the Spec-Bench dev questions shipped with draftwise",
    ),
]
DTypeOpt = Annotated[DType, typer.Option("--dtype", help="Weights and activations dtype.")]
RuntimeOpt = Annotated[
    RuntimeChoice,
    typer.Option("--runtime", help="native (Llama family), hf (any transformers model), or auto."),
]


def _threads_given(value: int | None) -> int | None:
    with user_errors():  # checked as it is parsed: one line, before anything runs
        return check_threads(value)


# the options of every command that runs a model (load_with_status takes them as they are)
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", help="CPU threads (default: torch's choice).", callback=_threads_given, show_default=False),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="Where the model runs: cpu, cuda or cuda:N.")]
QuantOpt = Annotated[Quant, typer.Option("--quant", help="Weights: none (exact), q4 or int8.")]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the model step (needs a C++ compiler).")]


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


@contextmanager
def phase_bars() -> Iterator[tuple[Any, Callable[..., None]]]:
    """One rich bar per phase of a long run (data, features, training ...), kept on screen.
    Yields ``(progress, bar)``; ``bar(name, done, total, info="")`` adds or updates a phase."""
    from rich.progress import (
        BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=False) as progress:
        tasks: dict[str, Any] = {}

        def bar(name: str, done: int, total: int, info: str = "") -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=total, info=info)
            progress.update(tasks[name], completed=done, total=total, info=info)

        yield progress, bar
