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
    draft: Annotated[
        str, typer.Option("--draft", "-d", help="none, lookup, self[:exit=L|layers=..|skip=..], model:PATH")
    ] = "none",
    k: Annotated[
        str, typer.Option("--k", help="Tokens the draft proposes per step, or 'auto' (chosen each step).")
    ] = "4",
    show_stats: Annotated[bool, typer.Option("--stats", help="Print speculation statistics.")] = False,
    stream: Annotated[bool, typer.Option("--stream", help="Print text as it is generated.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a completion of PROMPT, plainly or with a speculative draft (same output)."""
    from .bench.harness import parse_k
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
            draft=draft,
            k=parse_k(k),
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
    if show_stats:
        err.print(stats_table(result))


def stats_table(result: Any) -> Table:
    """The speculation statistics of one generation, in the verifier's vocabulary."""
    st = result.stats
    table = Table(title=f"draft {result.draft}, k={result.k}", show_header=False)
    table.add_column("stat")
    table.add_column("value", justify="right")
    rows = [
        ("target passes", st.target_passes),
        ("proposed", st.proposed),
        ("accepted", st.accepted),
        ("recovered", st.recovered),
        ("bonus", st.bonus),
        ("committed", st.committed),
        ("mean committed per pass", f"{st.mean_committed_per_pass:.2f}"),
        ("acceptance rate", f"{st.acceptance_rate:.2f}"),
        ("acceptance by position", " ".join(f"{a:.2f}" for a in st.acceptance_by_position)),
        ("draft seconds", f"{st.draft_seconds:.3f}"),
        ("verify seconds", f"{st.verify_seconds:.3f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


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


@app.command("calibrate-self")
def calibrate_self_cmd(
    model: ModelOpt = "default",
    dtype: DTypeOpt = DType.float32,
    questions: Annotated[
        Path | None, typer.Option(help="Spec-Bench-format JSONL (default: the dev questions).")
    ] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 4,
    k: Annotated[int, typer.Option("--k", min=1)] = 4,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 48,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Save the best as --draft self.")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Search the layer subset that maximises self-speculation's predicted speedup, and save it."""
    from .bench.runtime import DEFAULT_QUESTIONS, load_questions, select_prompts
    from .drafters.calibrate import calibrate_self, candidate_layer_sets, save_calibration

    with user_errors():
        rows = load_questions(questions or DEFAULT_QUESTIONS)
        prompts = [p.text for p in select_prompts(rows, min(num_prompts, len(rows)))]
        loaded = load_with_status(model, dtype.value, "native")
        total = len(candidate_layer_sets(loaded.runtime.num_layers))
        with err.status("calibrating ...") as status:
            done = [0]

            def report(c: Any) -> None:
                done[0] += 1
                status.update(
                    f"calibrating: {done[0]}/{total} candidates, last: {c.description} "
                    f"-> predicted {c.predicted_speedup:.2f}x"
                )

            results = calibrate_self(
                loaded, prompts, k=k, max_new_tokens=max_new_tokens, on_candidate=report
            )
        saved = save_calibration(loaded, results[0], k, results) if save else None
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"saved": saved, "candidates": [asdict(c) for c in results]}))
        return
    table = Table(title=f"self-speculation candidates (k={k}, {len(prompts)} prompts)")
    for col in ("layers", "cost c", "acceptance by position", "E", "predicted speedup"):
        table.add_column(col)
    for c in results:
        table.add_row(
            c.description,
            f"{c.draft_cost_ratio:.2f}",
            " ".join(f"{a:.2f}" for a in c.acceptance_by_position),
            f"{c.expected_committed:.2f}",
            f"{c.predicted_speedup:.2f}x",
        )
    out.print(table)
    best = results[0]
    verdict = "pays" if best.predicted_speedup > 1 else "does not pay on this machine"
    out.print(f"best: {best.description}: predicted {best.predicted_speedup:.2f}x ({verdict})")
    if saved:
        out.print(f"saved to {saved}; `--draft self` now uses it")


@app.command("bench-runtime")
def bench_runtime(
    model: ModelOpt = "default",
    questions: Annotated[
        Path | None, typer.Option(help="Spec-Bench-format JSONL (default: the dev questions).")
    ] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1)] = 20,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    dtypes: Annotated[str, typer.Option(help="Comma-separated: float32,bfloat16.")] = "float32,bfloat16",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write JSON + markdown here.")] = None,
) -> None:
    """Plain decoding: the native runtime against Hugging Face generate, plus the roofline."""
    from .bench.runtime import DEFAULT_QUESTIONS, render_markdown, run_runtime_benchmark

    with user_errors():
        report = run_runtime_benchmark(
            model=model,
            questions=questions or DEFAULT_QUESTIONS,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            dtypes=[d.strip() for d in dtypes.split(",") if d.strip()],
            out_dir=out_dir,
        )
    out.print(render_markdown(report), highlight=False, markup=False)


# Commands that live in their own modules register themselves on ``app`` when imported.
from . import cli_bench, cli_breakeven, cli_demo, cli_distill, cli_plan  # noqa: E402,F401


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
