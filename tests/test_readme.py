"""The README's quick starts run as written, on a machine where `make demo` has run.

Each command of the shell quick start runs in a fresh folder through the CLI app in-process
(typer's CliRunner), `draftwise` is checked to be the venv's console script for that app, and the
Python quick start runs as a script (``runpy``, in a fresh folder) in this process; both on the
session's model (its ``load_model("default")`` gets it: a new process would only repeat the import
and the model load, which other tests cover), with only their sizes cut so the whole file takes
well under a minute: `-n` / `max_new_tokens` become 4, and `bench` gets one question of its own
(`--questions`). Everything else (drafts, `--k auto`, flags, output folders) is the README's.
`--k auto` reads the profile `make demo` cached (it measures one otherwise, once).

Left out, each with its reason: the server quick start (it needs a server listening, and
installs packages; `tests/test_server_real.py` serves the model end to end with the `openai`
client) and the activation line (the test calls the CLI directly).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftwise.cli import app, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DRAFTWISE = Path(sys.executable).with_name("draftwise")
NEW_TOKENS = 4
SKIP = {
    "Quick start: server": "needs a running server (tests/test_server_real.py covers it end to end)",
}
QUESTIONS = [  # Spec-Bench format: one short question for `bench --questions`
    {"question_id": 1, "category": "summarization",
     "turns": ["Summarise in one line: the train was late, so the meeting started late."]},
]

pytestmark = pytest.mark.real_model


def _sections() -> dict[str, str]:
    """The README's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", README.read_text(encoding="utf-8"), flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _blocks(body: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", body, flags=re.M | re.S)


def _commands(block: str) -> list[str]:
    """The block's command lines, continuations joined, comments and the venv activation left out."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", ". ", "source "))]


def _cases() -> list:
    cases = []
    for title, body in _sections().items():
        if not title.startswith("Quick start"):
            continue
        for lang in ("bash", "python"):
            for i, block in enumerate(_blocks(body, lang)):
                items = _commands(block) if lang == "bash" else [block]
                for text in items:
                    name = text.split()[1] if lang == "bash" and len(text.split()) > 1 else f"block{i}"
                    marks = [pytest.mark.skip(reason=SKIP[title])] if title in SKIP else []
                    cases.append(pytest.param(lang, text, id=f"{title.split(': ')[-1]}-{lang}-{name}", marks=marks))
    return cases


CASES = _cases()


def test_the_readme_has_quick_starts_to_run() -> None:
    """The parser found the README's quick starts (a renamed section would silently test nothing)."""
    runnable = [c for c in CASES if not c.marks]
    assert any(c.values[0] == "bash" for c in runnable) and any(c.values[0] == "python" for c in runnable), (
        f"no shell or Python quick start found in {README.name}: {[c.id for c in CASES]}"
    )


def _smaller(argv: list[str], workdir: Path) -> list[str]:
    """``argv`` with its token budget cut to :data:`NEW_TOKENS`, and ``bench`` given :data:`QUESTIONS`."""
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
    return out


def test_the_draftwise_command_is_this_cli() -> None:
    """What the shell quick start types: the venv's ``draftwise`` runs ``draftwise.cli.main``,
    which runs ``app``, the CLI that the shell cases below invoke."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="draftwise")
    assert script.load() is main, script.value
    assert DRAFTWISE.is_file() and os.access(DRAFTWISE, os.X_OK), DRAFTWISE


def _run_script(script: Path, default_model: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run ``script`` as ``__main__`` here, its ``draftwise.load_model("default")`` (no options:
    float32, as the session's) answered with ``default_model``; returns the specs it served."""
    import draftwise

    real, served = draftwise.load_model, []

    def load(spec: str = "default", **options: object) -> object:
        if spec == "default" and not options:
            served.append(spec)
            return default_model
        return real(spec, **options)

    monkeypatch.setattr(draftwise, "load_model", load)
    runpy.run_path(str(script), run_name="__main__")
    return served


@pytest.mark.parametrize(("lang", "text"), CASES)
def test_quick_start_runs(lang: str, text: str, tmp_path: Path, cli_shares_default_model: list[str],
                          default_model: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the README's relative output folders land in the fresh folder
    if lang == "python":
        script = tmp_path / "quick_start.py"
        script.write_text(re.sub(r"max_new_tokens=\d+", f"max_new_tokens={NEW_TOKENS}", text), encoding="utf-8")
        assert _run_script(script, default_model, monkeypatch) == ["default"], "it did not load the default model"
        return
    argv = shlex.split(text)
    assert argv[0] == "draftwise", f"a quick-start line that is not a draftwise command: {text}"
    done = CliRunner().invoke(app, _smaller(argv, tmp_path)[1:])
    assert done.exit_code == 0, f"{text} exited {done.exit_code}:\n{done.output[-2000:]}\n{done.exception!r}"
    assert cli_shares_default_model, f"{text} did not load the default model"
    if argv[1] == "generate":
        assert done.stdout.strip(), f"{text} printed nothing"
    if argv[1] == "bench":
        out = tmp_path / argv[argv.index("--out") + 1]
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["equality"]["checked"] and not summary["equality"]["mismatches"]
