"""Option help is rendered as rich markup, which swallows an unescaped ``[word]`` (``pip install
'draftwise[corpus]'`` printed as ``'draftwise'``): every option's help escapes its brackets."""

from __future__ import annotations

import re

import typer

from draftwise.cli import app

SWALLOWED = re.compile(r"(?<!\\)\[[a-z][\w,=/ -]*\]")  # what rich reads as a style tag


def _options() -> list[tuple[str, str, str]]:
    out = []
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            help_text = getattr(param, "help", None) or ""
            out.append((name, param.name or "", help_text))
    return out


def test_the_scan_reads_every_command_s_options() -> None:
    assert len({name for name, _, _ in _options()}) >= 10 and len(_options()) >= 100


def test_no_option_help_has_a_bracket_rich_would_swallow() -> None:
    bad = [f"{cmd} --{opt}: {m.group(0)}" for cmd, opt, text in _options() for m in SWALLOWED.finditer(text)]
    assert not bad, "escape these as \\[...] (rich markup drops them): " + "; ".join(bad)
    assert SWALLOWED.search("pip install 'draftwise[corpus]'") and not SWALLOWED.search("'draftwise\\[corpus]'")
