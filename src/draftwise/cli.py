"""The ``draftwise`` command line: ``generate``, ``models``, ``bench-runtime``.

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

from .errors import DraftwiseError

app = typer.Typer(
    help="Lossless speculative decoding that tells you which draft pays.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
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


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a DraftwiseError into a one-line message and exit status 2."""
    try:
        yield
    except DraftwiseError as exc:
        _fail(str(exc))


def load_with_status(model: str, dtype: str, runtime: str = "auto", max_context: int | None = None) -> Any:
    """Load a model behind a spinner on stderr (conversion of a GGUF takes ~35 s the first time)."""
    from .loaders import load_model

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


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt ('-' reads standard input).")],
    model: ModelOpt = "default",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = off.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1 = off.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")] = None,
    dtype: DTypeOpt = DType.float32,
    runtime: RuntimeOpt = RuntimeChoice.auto,
    chat: Annotated[
        bool, typer.Option("--chat/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    stream: Annotated[bool, typer.Option("--stream", help="Print text as it is generated.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a completion of PROMPT."""
    from .decode import stream as start_stream
    from .sampling import SamplingConfig

    if prompt == "-":
        prompt = sys.stdin.read()
    with user_errors():
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        loaded = load_with_status(model, dtype.value, runtime.value)
        has_template = bool(loaded.tokenizer.chat_template)
        s = start_stream(
            loaded,
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=stop or (),
            chat=chat and has_template,
        )
        if stream and not as_json:
            for piece in s:
                out.print(piece, end="", highlight=False, markup=False, soft_wrap=True)
            out.print()
        else:
            for _ in s:
                pass
    result = s.result
    assert result is not None
    if as_json:
        payload = result.to_dict()
        payload.update(model=loaded.name, dtype=dtype.value, runtime=type(loaded.runtime).__name__)
        print(json.dumps(payload, ensure_ascii=False))
        return
    if not stream:
        out.print(result.text, highlight=False, markup=False, soft_wrap=True)
    err.print(
        f"[dim]{result.new_tokens} tokens in {result.seconds:.2f} s "
        f"({result.tokens_per_second:.1f} tokens/s, finish: {result.finish_reason})[/]"
    )


@app.command()
def models() -> None:
    """List the built-in models and whether each is installed."""
    from .models import BUILTIN_MODELS

    table = Table(title="built-in models")
    table.add_column("name")
    table.add_column("installed")
    table.add_column("package")
    table.add_column("description")
    seen = set()
    for name, builtin in BUILTIN_MODELS.items():
        if id(builtin) in seen:
            continue
        seen.add(id(builtin))
        aliases = [n for n, b in BUILTIN_MODELS.items() if b is builtin]
        ok = builtin.installed()
        table.add_row(
            ", ".join(aliases),
            "[green]yes[/]" if ok else f"[red]no[/] ({builtin.install_hint})",
            builtin.package,
            builtin.description,
        )
    out.print(table)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
