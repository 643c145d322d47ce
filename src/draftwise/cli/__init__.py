"""The ``draftwise`` command line.

Every command is a plain function in its own module; this file registers them explicitly, so
importing a command module has no side effect and no module imports this one. What the
commands share (consoles, options, loading a model, turning a user error into one line and exit
status 2) is in :mod:`draftwise.cli.common`.
"""

from __future__ import annotations

# First, before anything imports torch: libgomp reads its wait policy once, when torch loads it.
# The command line is an entry point, so it may set the process's defaults; the library never does.
from draftwise.threads import apply_omp_defaults

apply_omp_defaults()

import typer  # noqa: E402 (after the OpenMP defaults)

from draftwise.cli import (  # noqa: E402
    bench,
    bench_modes,
    bench_runtime,
    breakeven,
    calibrate,
    demo,
    distill,
    export_head,
    generate,
    plan,
    profile,
    serve,
    train_head,
)

app = typer.Typer(
    help="Lossless speculative decoding that tells you which draft pays.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("generate")(generate.generate)
app.command("models")(generate.models)
app.command("breakeven")(breakeven.breakeven)
app.command("profile")(profile.profile_cmd)
app.command("plan")(plan.plan_cmd)
app.command("bench")(bench.bench)
app.command("bench-runtime")(bench_runtime.bench_runtime)
app.command("bench-modes")(bench_modes.bench_modes)
app.command("calibrate-self")(calibrate.calibrate_self_cmd)
app.command("distill")(distill.distill_cmd)
app.command("pack-draft")(distill.pack_draft_cmd)
app.command("train-head")(train_head.train_head_cmd)
app.command("export-head")(export_head.export_head_cmd)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)


def main() -> None:  # pragma: no cover - console entry point
    from draftwise.api import share_cores_while_decoding

    share_cores_while_decoding()  # the CLI and its server share the cores with other draftwise processes
    app()


__all__ = ["app", "main"]
