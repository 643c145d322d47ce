"""The architecture as tests: the import layers, the function limits, a package that stands alone.

- ``lint-imports`` checks the contracts in ``pyproject.toml`` (layers from the CLI down to the
  core, and no import cycle between sibling modules at any depth); see ``docs/architecture.md``.
- No function (``def`` to its end) is longer than :data:`MAX_FUNCTION_LINES_CORE` in the core
  (``runtime``, ``core``, ``drafters``) or :data:`MAX_FUNCTION_LINES` elsewhere: a function a
  reader can hold. Files have no size limit: a file is a concept (docs/architecture.md).
- Nothing the package ships or documents points outside the package: no ``../shared`` and no
  machine's absolute path (a build machine's home, cache or work folder). A line that must show
  one on purpose (a doctest of the code that removes them) says ``path-check: ignore``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "draftwise"
MAX_FUNCTION_LINES_CORE = 60
MAX_FUNCTION_LINES = 100
#: the core: the layers below ``cost`` in pyproject.toml's contract
CORE_PACKAGES = ("runtime", "core", "drafters")
CORE_MODULES: tuple[str, ...] = ()

#: a path that only exists on one machine: ``/home/<user>``, ``/root/``, ``/Users/<user>``,
#: ``/work/``, ``C:\\Users\\``. The look-behind skips URLs (``https://x.org/home/...``) and
#: relative or home-relative paths (``~/.cache``, ``a/work/b``).
MACHINE_PATH = re.compile(r"(?<![\w.~/-])(?:/(?:home|Users)/[\w.-]+|/root/|/work/|[A-Za-z]:\\Users\\)")
OUTSIDE_REPO = re.compile(r"\.\./shared|shared/DESIGN\.md|shared/STYLE\.md")
#: a line that shows such a path on purpose (a doctest of the code that strips machine paths)
#: carries this marker and is not reported
ALLOW_MARKER = "path-check: ignore"

#: generated or third-party folders that are not the project's own text
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}


def _lint_imports() -> Path:
    """The ``lint-imports`` console script of the Python running the tests (the venv's)."""
    exe = Path(sys.executable).parent / "lint-imports"
    if exe.exists():
        return exe
    found = shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: `pip install -e '.[dev]'` (import-linter is a dev dependency)")
    return Path(found)


def test_import_contracts_hold() -> None:
    """The layers and the no-cycle contract of pyproject.toml are kept."""
    proc = subprocess.run(
        [str(_lint_imports()), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0 and re.search(r"\b0 broken\b", report), report[-6000:]
    kept = re.search(r"Contracts: (\d+) kept", report)
    assert kept and int(kept.group(1)) >= 2, f"expected the layers and the cycles contracts:\n{report}"


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not SKIP_DIRS.intersection(p.parts))


def _text_files() -> list[Path]:
    """Every text file of the package source, the README and the docs (binaries skipped)."""
    files = [ROOT / "README.md"]
    for folder in (ROOT / "src", ROOT / "docs"):
        files += [
            p for p in folder.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    out = []
    for p in files:
        data = p.read_bytes()
        if b"\0" in data[:8192]:
            continue  # a binary (safetensors weights)
        out.append(p)
    return out


def _offending_lines(pattern: re.Pattern[str]) -> list[str]:
    hits = []
    for p in _text_files():
        text = p.read_bytes().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            m = pattern.search(line)
            if m and ALLOW_MARKER not in line:
                start = max(m.start() - 40, 0)
                hits.append(f"{p.relative_to(ROOT).as_posix()}:{n}: ...{line[start:m.end() + 40]}...")
    return hits


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    r"""``(name, lines)`` of every function in ``source`` longer than ``limit`` lines, ``def`` to
    end (decorators not counted; a nested function counts inside its parent and on its own).

    >>> long_functions("def f():\n    x = 1\n    return x\n", 2)
    [('f', 3)]
    """
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > limit:
                out.append((node.name, lines))
    return out


def test_no_function_over_the_limit() -> None:
    """Functions a reader can hold: 60 lines in the core, 100 elsewhere."""
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        core = rel.parts[0] in CORE_PACKAGES or (len(rel.parts) == 1 and rel.name in CORE_MODULES)
        limit = MAX_FUNCTION_LINES_CORE if core else MAX_FUNCTION_LINES
        over += [f"{rel}:{name} ({n} > {limit})" for name, n in long_functions(path.read_text(encoding="utf-8"), limit)]
    assert not over, f"{len(over)} function(s) over the limit; split them: " + ", ".join(over)


def test_package_and_docs_do_not_refer_outside_the_repository() -> None:
    hits = _offending_lines(OUTSIDE_REPO)
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_no_machine_paths_in_package_and_docs() -> None:
    hits = _offending_lines(MACHINE_PATH)
    assert not hits, "absolute paths of one machine:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ('"prompts": "/work/shared/data/q.jsonl"', True),
        ('"folder": "/root/.cache/draftwise/converted/x"', True),
        ("see /home/alice/runs/smol4", True),
        ("C:\\Users\\bob\\draftwise", True),
        ("~/.cache/draftwise/profiles", False),
        ("https://example.org/home/index.html", False),
        ("out/work/x and src/draftwise/work/", False),
    ],
)
def test_machine_path_pattern(line: str, bad: bool) -> None:
    """The pattern the check above uses catches machine paths and spares ordinary ones."""
    assert bool(MACHINE_PATH.search(line)) is bad


#: a path in backticks in the docs: ``src/draftwise/core/verify.py``, ``cost/formulas.py``, ``bench/``
DOC_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:/|\.py|\.md|\.jsonl|\.toml))`")
#: a relative markdown link: ``[the planner](planner.md)``
DOC_LINK = re.compile(r"\]\(([^)#:\s]+)\)")


def test_paths_named_in_the_docs_exist() -> None:
    """Every file or folder the README and docs/ name in backticks, and every relative link,
    exists (relative to the repository or to ``src/draftwise``): docs that name a moved or
    deleted module fail here instead of misleading a reader."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOC_PATH.finditer(line):
                name = m.group(1)
                if "/" not in name.rstrip("/") and not name.endswith("/"):
                    continue  # a bare file name ("model.py") is named in the context around it
                if name.startswith("out/"):
                    continue  # where commands write their output
                if not any((base / name).exists() for base in (ROOT, PACKAGE, doc.parent)):
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: `{name}`")
            for m in DOC_LINK.finditer(line):
                if not (doc.parent / m.group(1)).exists():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: link ({m.group(1)})")
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)
