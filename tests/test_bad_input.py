"""Every bad input from the probe gets one clear line and exit status 2, never a traceback.

One table: each row runs the CLI in-process (or, for the Python API, calls it) on the tiny
random model, and names the phrase its one error line must contain, or the whole line. A few rows
must *succeed* (a tiny temperature; a missing matplotlib, which only skips the plots; more
--threads than cores, which warns in one line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import draftwise
import draftwise.cli.common as cli_common
from draftwise import threads
from draftwise.cli import app
from draftwise.errors import ConfigError
from draftwise.plots import plot_formats

BIN = bytes(range(256))  # not UTF-8, holds NUL
WRONG_TYPED = b'{"question_id": 1, "category": 5, "turns": "x"}\n'
A_LIST = b"[1, 2]\n"
PROMPTS = b"Say hello.\n"
DAMAGED = b'{"layers": "all of them"'


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...] = ()  # CLI arguments; {tiny} is the tiny model's folder, {tmp} a temp folder
    phrase: str = ""  # the one error line must contain it
    line: str = ""  # the one error line, exactly (for ok rows: the one warning line); {formats}: plot kinds
    stdin: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # written under {tmp} first
    ok: bool = False  # the command must succeed
    no_matplotlib: bool = False
    cores: int | None = None  # the CPU cores the CLI sees
    check: Callable[[Any, Path], None] | None = None  # more assertions on (result, tmp)
    api: Callable[[Any], Any] | None = None  # call the Python API with the loaded tiny model instead


def _generated_three_tokens(res: Any, tmp: Path) -> None:
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["new_tokens"] == 3 and len(payload["token_ids"]) == 3


def _short(res: Any, tmp: Path) -> None:
    assert len(res.output) < 200 and "more" in res.output  # not 1,000 layer numbers


def _names_expanded_cache(res: Any, tmp: Path) -> None:
    assert str(tmp / "home" / "cache") in res.output and "~" not in res.output


def _demo_wrote_all_but_plots(res: Any, tmp: Path) -> None:
    demo = tmp / "demo"
    for name in ("plan.json", "plan.md", "demo.json", "bench/summary.json", "bench/summary.md"):
        assert (demo / name).is_file(), name
    assert not list(demo.rglob("*.png"))
    assert [line for line in res.stderr.splitlines() if "matplotlib" in line] == [
        "warning: skipped the plots (plan.png, bench/*.png): matplotlib is not installed "
        "(pip install 'draftwise[plot]')"
    ]


CAL = "cache/self_spec/{tinyname}.json"  # where calibrate-self's file for the tiny model lives
UNDER_A_FILE = "{tmp}/a_file/out"  # a folder nobody can create: its parent is a regular file

CASES = [
    # rich markup in user text is printed, not interpreted
    Case("markup in --draft", ("generate", "hi", "-m", "{tiny}", "--draft", "[/x]"), "'[/x]'"),
    Case("markup in --model", ("generate", "hi", "--model", "[/x]"), "'[/x]'"),
    # text that is not UTF-8
    Case("non-UTF-8 stdin", ("generate", "-", "-m", "{tiny}"), "not valid UTF-8", stdin=b"caf\xe9 \xff"),
    Case("non-UTF-8 argument", ("generate", "caf\udce9", "-m", "{tiny}"), "byte 0xe9"),
    # binary and wrong-typed files
    Case("bench binary questions", ("bench", "-m", "{tiny}", "--questions", "{tmp}/q.jsonl", "--out", "{tmp}/o"),
         "not UTF-8", files={"q.jsonl": BIN}),
    Case("bench wrong-typed questions", ("bench", "-m", "{tiny}", "--questions", "{tmp}/q.jsonl", "--out", "{tmp}/o"),
         "q.jsonl:1: 'category' must be", files={"q.jsonl": WRONG_TYPED}),
    Case("plan binary prompts", ("plan", "-m", "{tiny}", "--prompts", "{tmp}/q.jsonl", "--out", "{tmp}/o"),
         "not UTF-8", files={"q.jsonl": BIN}),
    Case("plan wrong-typed prompts", ("plan", "-m", "{tiny}", "--prompts", "{tmp}/q.jsonl", "--out", "{tmp}/o"),
         "expected a JSON object", files={"q.jsonl": A_LIST}),
    Case("breakeven binary profile", ("breakeven", "--profile", "{tmp}/p.json"), "not UTF-8", files={"p.json": BIN}),
    Case("breakeven wrong-typed profile", ("breakeven", "--profile", "{tmp}/p.json"), "not a draftwise profile",
         files={"p.json": A_LIST}),
    # sampling values
    Case("seed 2**64", ("generate", "hi", "-m", "{tiny}", "--temperature", "1", "--seed", str(2**64)), "2**64 - 1"),
    Case("NaN temperature", ("generate", "hi", "-m", "{tiny}", "--temperature", "nan"), "must be a number"),
    Case("temperature 1e-40 generates", ("generate", "hi", "-m", "{tiny}", "--temperature", "1e-40", "--seed", "0",
                                         "--draft", "lookup", "-n", "3", "--json"), ok=True, check=_generated_three_tokens),
    # draft specs
    Case("lookup range not a number", ("generate", "hi", "-m", "{tiny}", "--draft", "lookup:max=x"), "whole number"),
    Case("1,000 layers", ("generate", "hi", "-m", "{tiny}", "--draft", "self:layers=0-1000"), "does not exist",
         check=_short),
    # the Python API
    Case("token id out of range", phrase="token id", api=lambda m: draftwise.generate(m, [10**9], max_new_tokens=2)),
    # the cache
    Case("damaged calibration", ("generate", "hi", "-m", "{tiny}", "--draft", "self", "-n", "2"), "is damaged",
         env={"DRAFTWISE_CACHE": "{tmp}/cache"}, files={CAL: DAMAGED}),
    Case("DRAFTWISE_CACHE=~/x is expanded", ("generate", "hi", "-m", "{tiny}", "--draft", "self", "-n", "2"),
         "is damaged", env={"DRAFTWISE_CACHE": "~/cache", "HOME": "{tmp}/home"}, files={"home/" + CAL: DAMAGED},
         check=_names_expanded_cache),
    Case("unwritable cache with --k auto", ("generate", "hi", "-m", "{tiny}", "--draft", "lookup", "--k", "auto"),
         "DRAFTWISE_CACHE", env={"DRAFTWISE_CACHE": UNDER_A_FILE}, files={"a_file": b""}),
    # unwritable --out, refused before any work
    Case("bench unwritable --out", ("bench", "-m", "{tiny}", "--questions", "{tmp}/p.txt", "--out", UNDER_A_FILE),
         "cannot write", files={"a_file": b"", "p.txt": PROMPTS}),
    Case("plan unwritable --out", ("plan", "-m", "{tiny}", "--prompts", "{tmp}/p.txt", "--out", UNDER_A_FILE),
         "cannot write", files={"a_file": b"", "p.txt": PROMPTS}),
    Case("demo unwritable --out", ("demo", "-m", "{tiny}", "--out", UNDER_A_FILE), "cannot write",
         files={"a_file": b""}),
    # no matplotlib: one line, everything else written
    # plot files matplotlib cannot write, refused before any work (profile: before the model loads)
    Case("breakeven --plot x.txt", ("breakeven", "--plot", "{tmp}/x.txt"),
         line="error: --plot {tmp}/x.txt: matplotlib cannot write a .txt file; end the name with one of {formats} "
              "(e.g. {tmp}/x.png)"),
    Case("breakeven --plot without an extension", ("breakeven", "--plot", "{tmp}/x"),
         line="error: --plot {tmp}/x: matplotlib cannot write a file without an extension; end the name with one "
              "of {formats} (e.g. {tmp}/x.png)"),
    Case("profile --plot x.txt", ("profile", "-m", "{tmp}/no-model", "--plot", "{tmp}/t.txt"),
         line="error: --plot {tmp}/t.txt: matplotlib cannot write a .txt file; end the name with one of {formats} "
              "(e.g. {tmp}/t.png)"),
    Case("breakeven --plot without matplotlib", ("breakeven", "--plot", "{tmp}/x.txt"), ok=True, no_matplotlib=True,
         line="warning: skipped the plot {tmp}/x.txt: matplotlib is not installed (pip install 'draftwise[plot]')"),
    # options named as the user typed them, advice that can be followed
    Case("plan --ks 5-1", ("plan", "-m", "{tmp}/no-model", "--ks", "5-1"),
         line="error: --ks '5-1': k must be >= 1 and ranges low-high with low <= high"),
    Case("plan --profile a folder", ("plan", "-m", "{tmp}/no-model", "--profile", "{tmp}"),
         line="error: --profile {tmp} is a folder, not a profile file; give a profile JSON "
              "(`draftwise profile --out profile.json` writes one)"),
    Case("plan --profile /etc", ("plan", "-m", "{tmp}/no-model", "--profile", "/etc"),
         line="error: --profile /etc is a folder, not a profile file; give a profile JSON "
              "(`draftwise profile --out profile.json` writes one)"),
    Case("breakeven --profile /dev/null", ("breakeven", "--profile", "/dev/null"),
         line="error: --profile /dev/null is not a regular file; give a profile JSON "
              "(`draftwise profile --out profile.json` writes one)"),
    # more threads than cores: it runs, with one line saying why it will be slow
    Case("--threads over the cores", ("generate", "hi", "-m", "{tiny}", "-n", "2", "--threads", "3"), ok=True,
         cores=2, line="warning: --threads 3 is more than the 2 CPU cores this process can use; threads beyond the "
                       "cores wait for each other and decode many times slower (use --threads 2 or leave it out)"),
    Case("demo without matplotlib", ("demo", "-m", "{tiny}", "--num-questions", "1", "-n", "2", "--out", "{tmp}/demo"),
         ok=True, no_matplotlib=True, env={"DRAFTWISE_CACHE": "{tmp}/cache"}, check=_demo_wrote_all_but_plots),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_one_line_and_exit_2(case: Case, tiny_chat_folder, one_thread, tmp_path, monkeypatch, request):
    def fill(text: str) -> str:
        return text.format(tiny=tiny_chat_folder, tmp=tmp_path, tinyname=tiny_chat_folder.name, formats=formats)

    formats = ""
    if "{formats}" in case.line:
        pytest.importorskip("matplotlib")
        formats = ", ".join("." + f for f in plot_formats())

    for name, data in case.files.items():
        path = tmp_path / fill(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for key, value in case.env.items():
        monkeypatch.setenv(key, fill(value))
    if case.cores is not None:
        monkeypatch.setattr(cli_common, "usable_cores", lambda: case.cores)
        monkeypatch.setitem(threads._state, "pinned", threads._state["pinned"])  # --threads pins; undone after
    if case.no_matplotlib:
        monkeypatch.setitem(sys.modules, "matplotlib", None)
        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)

    if case.api is not None:
        with pytest.raises(ConfigError, match=case.phrase):
            case.api(request.getfixturevalue("tiny"))
        return

    res = CliRunner().invoke(app, [fill(a) for a in case.args], input=case.stdin)
    assert "Traceback" not in res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), repr(res.exception)
    if case.ok:
        assert res.exit_code == 0, res.output
        if case.line:
            assert [line for line in res.stderr.splitlines() if line.startswith("warning:")] == [fill(case.line)]
    else:
        assert res.exit_code == 2, res.output
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), res.output
        assert case.phrase in lines[0]
        if case.line:
            assert lines[0] == fill(case.line)
    if case.check is not None:
        case.check(res, tmp_path)
