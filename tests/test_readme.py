"""The README as a new user meets it: its install commands, the flags it shows, and its quick
starts walked in order.

Without a model (every run; `-m "not real_model"` keeps them): the parser finds the shell, Python
and server quick starts; the Install section's two commands are `make demo` and `make test`
(CI runs them) and the Makefile has both targets; its pip lines name extras the package defines;
every ``draftwise COMMAND --option`` the README shows is an option of that command; and the README
stays a short guide: at most :data:`MAX_LINES` lines, no dates or commits.

The first hour (``real_model``, on a machine where `make demo` or `make test` has set up .venv):
:func:`test_the_first_hour` walks every ``## Quick start...`` section in the README's order, in
one fresh folder, as a new user would type them:

- each shell line through the CLI app in-process (typer's CliRunner; `draftwise` is checked to be
  the venv's console script for that app); the first ``generate`` with ``--stats`` and no
  ``--draft`` must speculate, as the README says;
- each Python block as a script (``runpy``) in this process; it must load the default model and
  speculate by default;
- the server: the README's ``draftwise serve`` command runs in-process with ``uvicorn.run``
  replaced by :class:`draftwise.server.live.LiveServer` on a free loopback port (as
  tests/test_server_real.py serves), the README's ``openai`` block runs against it, and its reply
  is checked: text, and a ``speculative`` object that names a draft.

All on the session's model (``load_model("default")`` answers with it: a new process would only
repeat the import and the load, which other tests cover), with only sizes cut so the walk takes a
minute or two: `-n` / ``max_new_tokens`` become :data:`NEW_TOKENS`, ``max_tokens``
:data:`SERVER_TOKENS`, `bench` gets one question of its own (``--questions``), and the server
:data:`SERVER_BUDGET` unless the README sets those options. Everything else (drafts, k, flags,
output folders, the port the client calls) is the README's. ``--k auto`` reads the test run's
profile, measured on first use.

Left out: the activation line (the test calls the CLI directly) and the Install section's pip
lines (they install packages; the extras they name are checked).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from draftwise.cli import app, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DRAFTWISE = Path(sys.executable).with_name("draftwise")
MAX_LINES = 200
NEW_TOKENS = 4
SERVER_TOKENS = 8
#: the server's sizes unless the README's command sets them: a small KV cache, two slots (still
#: the batched engine), answers no longer than the client asks
SERVER_BUDGET = {"--context": "512", "--max-batch": "2", "--max-tokens-cap": "16"}
QUESTIONS = [  # Spec-Bench format: one short question for `bench --questions`
    {"question_id": 1, "category": "summarization",
     "turns": ["Summarise in one line: the train was late, so the meeting started late."]},
]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", flags=re.M | re.S)
#: a command shown inline: `draftwise plan --prompts FILE --validate` (it may wrap a line)
INLINE_COMMAND = re.compile(r"`(draftwise [^`]+)`")
DATE = re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b")
#: a commit id: 7-40 hex digits with at least one digit and one letter
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
#: the hosts the measurements name; the README names one, once, in its table's caption
HOSTS = re.compile(r"EPYC|Xeon|Threadripper|Ryzen|Core i\d|Apple M\d", flags=re.I)


@dataclass(frozen=True)
class Step:
    """One thing a new user does: a shell line, a Python block, or a server command with the
    Python block that queries it (``client``)."""

    section: str
    kind: str  # "shell", "python" or "server"
    text: str
    client: str = ""


def _sections(text: str | None = None) -> dict[str, str]:
    """The README's ``## `` sections by title, in order."""
    parts = re.split(r"^## (.+)$", README.read_text(encoding="utf-8") if text is None else text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _commands(block: str) -> list[str]:
    """The block's command lines, continuations joined, comments and the venv activation left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", ". ", "source "))]


def quick_starts(text: str | None = None) -> list[Step]:
    """The steps of every ``## Quick start...`` section, in the README's order. A ``draftwise
    serve`` line and the next Python block (its client) are one step.

    >>> quick_starts("## Quick start\\n```bash\\ndraftwise serve\\n```\\n```python\\nprint(1)\\n```\\n")
    [Step(section='Quick start', kind='server', text='draftwise serve', client='print(1)\\n')]
    """
    steps: list[Step] = []
    for title, body in _sections(text).items():
        if not title.startswith("Quick start"):
            continue
        server = None
        for lang, code in BLOCK.findall(body):
            if lang == "bash":
                for line in _commands(code):
                    if shlex.split(line)[:2] == ["draftwise", "serve"]:
                        server = line
                    else:
                        steps.append(Step(title, "shell", line))
            elif lang == "python" and server is not None:
                steps.append(Step(title, "server", server, client=code))
                server = None
            elif lang == "python":
                steps.append(Step(title, "python", code))
        if server is not None:
            steps.append(Step(title, "server", server))
    return steps


def _shown_commands() -> list[str]:
    """Every ``draftwise ...`` command the README shows, in code blocks and inline."""
    text = README.read_text(encoding="utf-8")
    shown = [line for lang, code in BLOCK.findall(text) if lang == "bash" for line in _commands(code)]
    return [c for c in shown if c.startswith("draftwise ")] + INLINE_COMMAND.findall(text)


# -- without a model --------------------------------------------------------------------------


def test_the_readme_has_quick_starts_to_run() -> None:
    """The parser finds a shell, a Python and a server quick start (a renamed section would
    silently test nothing); the first shell step is `draftwise generate`, and the server's
    client is the `openai` package."""
    steps = quick_starts()
    kinds = [s.kind for s in steps]
    assert {"shell", "python", "server"} <= set(kinds), f"quick starts found: {kinds}"
    shell = [s for s in steps if s.kind == "shell"]
    assert shlex.split(shell[0].text)[:2] == ["draftwise", "generate"], shell[0].text
    for s in steps:
        if s.kind == "server":
            assert "from openai import OpenAI" in s.client, f"{s.text}: no openai client block after it"


def test_the_install_section_keeps_the_two_commands() -> None:
    """`make demo` and `make test`, as CI runs them, are the Install section's first block and
    both are Makefile targets; a pip line's extras are the package's."""
    body = _sections()["Install"]
    blocks = [code for lang, code in BLOCK.findall(body) if lang == "bash"]
    assert blocks and _commands(blocks[0]) == ["make demo", "make test"], blocks[:1]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"the Makefile has no `{target}` target"
    from importlib.metadata import metadata

    extras = set(metadata("draftwise").get_all("Provides-Extra") or [])
    for code in blocks[1:]:
        for line in _commands(code):
            for group in re.findall(r"\.\[([\w,]+)\]", line):
                assert set(group.split(",")) <= extras, f"{line}: the package's extras are {sorted(extras)}"


def test_every_flag_the_readme_shows_exists() -> None:
    """Each ``draftwise COMMAND --option`` in the README is a command and an option it takes."""
    import typer

    group = typer.main.get_command(app)
    wrong = []
    for shown in _shown_commands():
        argv = shlex.split(shown)
        if len(argv) < 2 or argv[1].isupper():  # `draftwise COMMAND --help`: a placeholder
            continue
        command = group.commands.get(argv[1])  # type: ignore[attr-defined]
        if command is None:
            wrong.append(f"{shown}: no command {argv[1]!r}")
            continue
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        wrong += [f"{shown}: {a.split('=')[0]}" for a in argv[2:]
                  if a.startswith("-") and a.split("=")[0] not in options]
    assert not wrong, "the README shows options the CLI does not take:\n" + "\n".join(wrong)


def test_the_readme_stays_a_short_guide() -> None:
    """At most MAX_LINES lines, no dates, no commit ids, and one host named at most once (the
    table's caption): the history lives in docs/benchmarks.md."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"README.md has {len(text.splitlines())} lines (most: {MAX_LINES})"
    assert not DATE.findall(text), DATE.findall(text)
    assert not COMMIT.findall(text), COMMIT.findall(text)
    assert len(HOSTS.findall(text)) <= 1, HOSTS.findall(text)


def test_the_draftwise_command_is_this_cli() -> None:
    """What the shell quick start types: the venv's ``draftwise`` runs ``draftwise.cli.main``,
    which runs ``app``, the CLI that the first hour below invokes."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="draftwise")
    assert script.load() is main, script.value
    assert DRAFTWISE.is_file() and os.access(DRAFTWISE, os.X_OK), DRAFTWISE


# -- the first hour, on the real default model --------------------------------------------------


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _smaller(argv: list[str], workdir: Path) -> list[str]:
    """``argv`` with its token budget cut to :data:`NEW_TOKENS`, ``bench`` given :data:`QUESTIONS`
    and ``serve`` :data:`SERVER_BUDGET` where the README leaves them out."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("-n", "--max-new-tokens"):
            i += 2
            continue
        out.append(argv[i])
        i += 1
    if argv[1] in ("generate", "bench", "plan", "demo"):
        out += ["-n", str(NEW_TOKENS)]
    if argv[1] == "bench" and "--questions" not in argv:
        questions = workdir / "questions.jsonl"
        questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
        out += ["--questions", str(questions)]
    if argv[1] == "serve":
        out += [x for name, value in SERVER_BUDGET.items() if name not in argv for x in (name, value)]
    return out


def _failed(step: Step, done: Any) -> str:
    exc = "".join(traceback.format_exception(*done.exc_info)) if done.exc_info else ""
    return f"{step.section}: {step.text!r} exited {done.exit_code}:\n{done.output[-2000:]}\n{exc[-3000:]}"


def _shell(step: Step, workdir: Path, served: list[str]) -> None:
    argv = shlex.split(step.text)
    assert argv[0] == "draftwise", f"a quick-start line that is not a draftwise command: {step.text}"
    loads = len(served)
    done = CliRunner().invoke(app, _smaller(argv, workdir)[1:])
    assert done.exit_code == 0, _failed(step, done)
    assert len(served) > loads, f"{step.text} did not load the default model"
    if argv[1] == "generate":
        assert done.stdout.strip(), f"{step.text} printed nothing"
        title = re.search(r"draft (\S+), k=(\S+)", " ".join(done.output.split()))
        if "--stats" in argv and "--draft" not in argv and "-d" not in argv:
            assert title and title.group(1) != "none", f"the README says this speculates by default:\n{done.output}"
    if argv[1] == "bench":
        out = workdir / argv[argv.index("--out") + 1]
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["equality"]["checked"] and not summary["equality"]["mismatches"]


def _run_script(code: str, path: Path, default_model: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list]:
    """Run ``code`` as ``__main__`` from ``path``, its ``draftwise.load_model("default")`` (no
    options: float32, as the session's) answered with ``default_model``; returns its globals and
    the specs served."""
    import draftwise

    real, served = draftwise.load_model, []

    def load(spec: str = "default", **options: object) -> object:
        if spec == "default" and not options:
            served.append(spec)
            return default_model
        return real(spec, **options)

    monkeypatch.setattr(draftwise, "load_model", load)
    path.write_text(code, encoding="utf-8")
    return runpy.run_path(str(path), run_name="__main__"), served


def _python(step: Step, workdir: Path, default_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from draftwise import GenerationResult

    code = re.sub(r"max_new_tokens=\d+", f"max_new_tokens={NEW_TOKENS}", step.text)
    names, served = _run_script(code, workdir / "quick_start.py", default_model, monkeypatch)
    assert served == ["default"], "it did not load the default model"
    results = [v for v in names.values() if isinstance(v, GenerationResult)]
    assert any(r.draft != "none" for r in results), (
        f"the README says generate speculates by default; drafts: {[r.draft for r in results]}")


def _server(step: Step, workdir: Path, default_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's serve command in-process, served by LiveServer on a free port; the README's
    client block sent to it with the port swapped; the reply checked."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion

    from draftwise.server.live import LiveServer

    argv = shlex.split(step.text)
    url = re.search(r"""base_url=["']http://(?:127\.0\.0\.1|localhost):(\d+)/v1["']""", step.client)
    assert url, f"{step.section}: no base_url on this machine in the client block:\n{step.client}"
    assert url.group(1) == (_option(argv, "--port") or "8000"), "the client calls another port than the server's"
    ran: dict[str, Any] = {}

    def run(served_app: Any, **_: Any) -> None:  # what `draftwise serve` hands uvicorn
        with LiveServer(served_app) as server:
            code = step.client.replace(url.group(0), f'base_url="{server.url}/v1"')
            code = re.sub(r"max_tokens=\d+", f"max_tokens={SERVER_TOKENS}", code)
            ran["names"], _ = _run_script(code, workdir / "client.py", default_model, monkeypatch)

    monkeypatch.setattr("uvicorn.run", run)
    monkeypatch.setattr("draftwise.cli.serve._setup_logging", lambda level: None)  # no handler on the runner's stderr
    try:
        done = CliRunner().invoke(app, _smaller(argv, workdir)[1:])
    finally:  # the session's model again holds one sequence, as the other tests expect
        if hasattr(default_model.runtime, "allocate_slots"):
            default_model.runtime.allocate_slots(1)
    assert done.exit_code == 0 and "names" in ran, _failed(step, done)
    replies = [v for v in ran["names"].values() if isinstance(v, ChatCompletion)]
    assert replies, "the client block made no chat completion"
    reply = replies[-1]
    assert reply.choices[0].message.content.strip(), reply
    assert 0 < reply.usage.completion_tokens <= SERVER_TOKENS, reply.usage
    assert reply.speculative["draft"] != "none", f"the README says the server speculates: {reply.speculative}"
    assert reply.speculative["mean_committed_per_pass"] >= 1.0, reply.speculative


@pytest.mark.real_model
def test_the_first_hour(tmp_path: Path, cli_shares_default_model: list[str], default_model: Any,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every quick start in the README's order, in one fresh folder, as a new user runs them."""
    monkeypatch.chdir(tmp_path)  # the README's relative output folders land in the fresh folder
    steps = quick_starts()
    assert steps, "no quick start in the README"
    for step in steps:
        if step.kind == "shell":
            _shell(step, tmp_path, cli_shares_default_model)
        elif step.kind == "python":
            _python(step, tmp_path, default_model, monkeypatch)
        else:
            _server(step, tmp_path, default_model, monkeypatch)
