"""What every command shares: consoles, the common options, loading a model, and error handling.

User mistakes (a :class:`~draftwise.errors.DraftwiseError`) print one line naming the fix and
exit with status 2; they never print a traceback. Messages quote what the user typed, so they are
printed with rich markup escaped (``--draft "[/x]"`` shows ``[/x]``, it does not crash rich) and
with any undecodable byte shown as an escape.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from draftwise.cost.profile import Profile
from draftwise.drafters.spec import SPEC_HELP, DraftSpec, split_draft_list
from draftwise.errors import ConfigError, DraftwiseError
from draftwise.fsutil import check_writable
from draftwise.plots import (
    PLOT_INSTALL_HINT,
    check_plot_path,
    plotting_available,
    try_plot,
)
from draftwise.runtime.loaders import load_model
from draftwise.threads import check_threads, set_threads

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


def command_line() -> str:
    """This run's command, quoted for a shell (``draftwise distill --out 'my draft'``), for the
    files a run writes to say how they were made."""
    return shlex.join(["draftwise", *sys.argv[1:]])


def parse_number_list(text: str | None, kind: type[T], flag: str, example: str) -> list[T] | None:
    """A comma-separated option as a list of ``kind`` (None when the option is not given):
    ``parse_number_list("0,0.7", float, "--gen-temperatures", "0,0.7")`` is ``[0.0, 0.7]``."""
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]  # type: ignore[call-arg]
    except ValueError:
        raise ConfigError(f"{flag} {text!r} must be comma-separated numbers, like {example}") from None


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


def parse_drafts(text: str, flag: str) -> list[DraftSpec]:
    """The drafts of ``--draft``/``--drafts`` (profile, plan): specs, comma-separated, each listed
    once (``lookup`` and ``lookup:min=1`` are one draft). k comes from ``--ks``, not ``@k=``."""
    specs: list[DraftSpec] = []
    for item in split_draft_list(text):
        if "@" in item:
            raise ConfigError(f"{flag} takes draft specs without @k (got {item!r}); give the k values with --ks")
        spec = DraftSpec.parse(item)
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise ConfigError(f"{flag} needs at least one draft, e.g. {flag} lookup,self ({SPEC_HELP})")
    return specs


def output_file(path: Path, what: str) -> Path:
    """``path`` (``~`` expanded) can be written as a file: not a folder, and its folder writable
    (created if needed). Call it before any measuring."""
    path = path.expanduser()
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give a file path inside it, e.g. {path / 'out.json'}")
    check_writable(path.parent, f"folder of {what}")
    return path


def plot_file(path: Path | None, what: str = "--plot") -> Path | None:
    """The file a ``--plot`` option names, checked before any work: not a folder, an extension
    matplotlib can write (``.png``, ``.pdf``, ``.svg`` ...), a writable folder. Without
    matplotlib: one warning line and None, so the command still does the rest."""
    if path is None:
        return None
    path = path.expanduser()
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give a file path inside it, e.g. {path / 'plot.png'}")
    if not plotting_available():
        warn(f"skipped the plot {path}: matplotlib is not installed ({PLOT_INSTALL_HINT})")
        return None
    return output_file(check_plot_path(path, what), what)


MAKE_PROFILE = "`draftwise profile --out profile.json` writes one"


def _nearest_folder(path: Path) -> Path:
    """``path``'s closest ancestor that exists (``draftwise profile --out`` creates the rest)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def read_profile(path: Path, what: str = "--profile") -> Profile:
    """The profile a ``--profile`` option names. A folder, a device, an unreadable file, or a
    missing one whose folder cannot be written is one line that says which, and how to make a
    profile; a missing file elsewhere, or a file that is not a profile, is
    :meth:`Profile.load`'s line."""
    path = path.expanduser()
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder, not a profile file; give a profile JSON ({MAKE_PROFILE})")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{what} {path} is not a regular file; give a profile JSON ({MAKE_PROFILE})")
    if path.is_file() and not os.access(path, os.R_OK):
        raise ConfigError(f"{what} {path} cannot be read (permission denied); give a profile JSON you can read")
    if not path.exists():
        folder = _nearest_folder(path)
        if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            raise ConfigError(f"no profile at {path}, and {folder} cannot be written; make one where you can "
                              "write, e.g. `draftwise profile --out profile.json`, and pass --profile profile.json")
    return Profile.load(path)


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
TargetOpt = Annotated[  # the model a draft or a head is trained for (distill, train-head)
    str, typer.Option("--target", "-t", help="'default', a built-in name, a HF folder or a .gguf file.")
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


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask where the OS has one (a
    container limited to 2 of 64 cores has 2), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads_given(value: int | None) -> int | None:
    with user_errors():  # checked as it is parsed: one line, before anything runs
        check_threads(value)
    cores = usable_cores()
    if value is not None and value > cores:
        # a probe measured --threads 1000 on 2 cores at 0.5 tok/s, against 17 tok/s without --threads
        warn(f"--threads {value} is more than the {cores} CPU cores this process can use; threads beyond the "
             f"cores wait for each other and decode many times slower (use --threads {cores} or leave it out)")
    return value


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


def status_printer(progress: Any) -> Callable[[str], None]:
    """``on_status`` for a long run under :func:`phase_bars`: each message a dim line above the bars."""
    return lambda msg: progress.console.print(msg, style="dim", highlight=False, markup=False)


@contextmanager
def phase_bars() -> Iterator[tuple[Any, Callable[..., None]]]:
    """One rich bar per phase of a long run (data, features, training ...), kept on screen.
    Yields ``(progress, bar)``; ``bar(name, done, total, info="")`` adds or updates a phase."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
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
