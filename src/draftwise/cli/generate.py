"""``draftwise generate`` and ``draftwise models``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from draftwise.api import DEFAULT_DRAFT, DEFAULT_K
from draftwise.api import stream as start_stream
from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    DType,
    DTypeOpt,
    ModelOpt,
    Quant,
    QuantOpt,
    RuntimeChoice,
    RuntimeOpt,
    ThreadsOpt,
    err,
    load_with_status,
    out,
    plain,
    read_stdin_text,
    user_errors,
    utf8_text,
)
from draftwise.core.sampling import SamplingConfig
from draftwise.core.text import decode_escapes
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import SPEC_HELP, DraftSpec, parse_k
from draftwise.errors import ConfigError
from draftwise.planner.route import policy_for
from draftwise.policy.adaptive import resolve_profile
from draftwise.runtime.models import BUILTIN_MODELS

STOP_HELP = (
    "Stop string (repeatable); the text ends right before it. \\n, \\t, \\r and \\\\ are read as "
    "newline, tab, carriage return and a backslash, so --stop '\\n\\n' stops at a blank line."
)


def stop_strings(values: list[str] | None) -> tuple[str, ...]:
    """The ``--stop`` values with their escapes read; empty or non-UTF-8 ones are errors."""
    stops = tuple(decode_escapes(utf8_text(v, f"--stop {v!r}")) for v in values or ())
    if any(not s for s in stops):
        raise ConfigError("--stop '' can never match; pass a non-empty stop string")
    return stops


def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt ('-' reads standard input).")],
    model: ModelOpt = "default",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1)] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = off.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1 = off.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling: the same seed, --draft and --k (auto: and the "
                                             "cached costs) draw the same sample; another draft, another one.")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help=STOP_HELP)] = None,
    dtype: DTypeOpt = DType.float32,
    runtime: RuntimeOpt = RuntimeChoice.auto,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    chat: Annotated[
        bool, typer.Option("--chat/--raw", help="Wrap the prompt in the model's chat template.")
    ] = True,
    draft: Annotated[
        str, typer.Option("--draft", "-d", help=f"The draft: {SPEC_HELP}. none: plain decoding.")
    ] = DEFAULT_DRAFT,
    k: Annotated[
        str, typer.Option("--k", help="Tokens the draft proposes per step, or 'auto': chosen each step from this "
                          "machine's costs, measured on the first run for a model and draft and cached.")
    ] = DEFAULT_K,
    show_stats: Annotated[bool, typer.Option("--stats", help="Print speculation statistics.")] = False,
    stream: Annotated[bool, typer.Option("--stream", help="Print text as it is generated.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate a completion of PROMPT with a speculative draft (default: suffix, k auto), or plainly
    with --draft none; the output is the same."""
    with user_errors():  # every option is checked before the model loads
        prompt = read_stdin_text() if prompt == "-" else utf8_text(prompt, "the prompt")
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        stops = stop_strings(stop)
        spec = DraftSpec.parse(utf8_text(draft, "--draft"))
        k_value = parse_k(k)
        loaded = load_with_status(
            model, dtype.value, runtime.value, threads=threads, device=device, quant=quant.value, compile=compile_
        )
        drafter = make_drafter(spec, loaded)  # a draft that cannot run on this model fails before any measuring
        policy = k_value if drafter is None or k_value != "auto" else auto_k(loaded, spec, drafter)
        has_template = bool(loaded.tokenizer.chat_template)
        s = start_stream(
            loaded,
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=stops,
            chat=chat and has_template,
            draft=drafter,
            k=policy,
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
        payload.update(
            model=loaded.name, dtype=dtype.value, runtime=type(loaded.runtime).__name__, device=device, quant=quant.value
        )
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


def auto_k(loaded: Any, spec: DraftSpec, drafter: Any) -> Any:
    """``--k auto``'s adaptive policy for ``spec`` from this machine's profile: read from the
    cache, or measured and cached first (the first run for a model and draft: about 200 short
    passes) behind a spinner, with one line on stderr saying so."""
    with err.status("reading this machine's costs for --k auto ...", spinner="dots") as status:
        def measuring(message: str) -> None:
            err.print(f"[dim]{plain(message)}[/]", highlight=False, soft_wrap=True)
            status.update(plain(message))

        resolve_profile(loaded, spec, status=measuring)
    return policy_for(loaded, spec, "auto", capabilities=drafter.capabilities)  # reads what was just cached


def stats_table(result: Any) -> Table:
    """The speculation statistics of one generation, in the verifier's vocabulary."""
    st = result.stats
    table = Table(title=f"draft {plain(result.draft)}, k={result.k}", show_header=False)
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


def models() -> None:
    """List the built-in models and whether each is installed."""
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
            "[green]yes[/]" if ok else f"[red]no[/] ({plain(builtin.install_hint)})",
            plain(builtin.package),
            plain(builtin.description),
        )
    out.print(table)
