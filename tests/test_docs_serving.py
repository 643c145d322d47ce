"""docs/serving.md stays a complete reference: every option of ``draftwise serve`` and every
metric the server registers is named in it.

The options are read from the typer app itself (the ``serve`` command's click parameters), and
the metric names from a :class:`~draftwise.server.metrics.ServerMetrics` registry, so a new
option or metric fails here until the reference names it."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.main

from draftwise.cli import app

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _named(name: str, text: str) -> bool:
    """Whether ``name`` appears in ``text`` as a whole name (a counter with Prometheus's
    ``_total`` suffix counts): ``--max-k-cap`` does not name ``--max-k``, nor
    ``draftwise:batch_sizes`` ``draftwise:batch_size``."""
    return re.search(re.escape(name) + r"(?:_total)?(?![\w-])", text) is not None


def serve_options() -> list[str]:
    """Every option string of ``draftwise serve`` (long and short forms, ``--help`` left out)."""
    command = typer.main.get_command(app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]
    opts: list[str] = []
    for param in serve.params:
        for opt in [*param.opts, *param.secondary_opts]:
            if opt.startswith("-") and opt != "--help" and opt not in opts:
                opts.append(opt)
    return opts


def metric_names() -> list[str]:
    """Every metric family the server's metrics module registers, the prefix cache's included."""
    pytest.importorskip("prometheus_client")
    from draftwise.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")
    metrics.track_prefix_cache(SimpleNamespace(queries=0, hits=0, bytes=0))
    return sorted({family.name for family in metrics.registry.collect()})


def missing(names: list[str], text: str) -> list[str]:
    return [name for name in names if not _named(name, text)]


def test_the_option_list_is_read() -> None:
    """The reading above finds the options: a change in typer's structure must not make the
    check below pass vacuously."""
    opts = serve_options()
    for expected in ("--model", "--draft", "-d", "--k", "--max-batch", "--prefix-cache-mb", "--api-key"):
        assert expected in opts, f"{expected} not read from the serve command: {opts}"


def test_every_serve_option_is_in_the_reference() -> None:
    absent = missing(serve_options(), _doc())
    assert not absent, "docs/serving.md does not name these `draftwise serve` options: " + ", ".join(absent)


def test_every_metric_is_in_the_reference() -> None:
    names = metric_names()
    assert "draftwise:spec_decode_num_drafts" in names and "draftwise:prefix_cache_bytes" in names, names
    absent = missing(names, _doc())
    assert not absent, "docs/serving.md does not name these metrics: " + ", ".join(absent)


def test_the_check_fails_on_a_missing_name() -> None:
    """The matching is strict enough to fail: a text without an option (or with only a longer
    name that starts like it) does not count as naming it."""
    assert missing(["--max-k"], "`--max-k-cap` and `--max-kilo`") == ["--max-k"]
    assert missing(["--max-k"], "`--max-k` (default 16)") == []
    assert missing(["draftwise:batch_size"], "draftwise:batch_sizes") == ["draftwise:batch_size"]
    assert missing(["draftwise:batch_size"], "`draftwise:batch_size` histogram") == []
    assert missing(["draftwise:request_success"], "`draftwise:request_success_total{finished_reason}`") == []
