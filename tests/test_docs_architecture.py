"""docs/architecture.md stays true: every module under src/draftwise has its line, in the layer
the import-linter contract puts it in, and the generated layer picture matches the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "draftwise"
DOC = ROOT / "docs" / "architecture.md"
SCRIPT = ROOT / "docs" / "make_architecture_graph.py"
SECTION = "## Every module, by layer"
#: a module's line: ``- `planner/plan.py`: what it is.``
ENTRY = re.compile(r"^- `([\w/]+\.py)`: \S")
#: a layer's heading: ``### 5. `cost`: ...`` (the members in backticks before the colon)
HEADING = re.compile(r"^### (\d+)\. (.*?): ")


def _graph_script():
    spec = importlib.util.spec_from_file_location("make_architecture_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entries() -> dict[str, str | None]:
    """Each module line of the section, mapped to the members of the layer heading above it
    (None before the first heading: the package's own ``__init__.py``)."""
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"docs/architecture.md lost its {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    entries: dict[str, str | None] = {}
    members = None
    for line in section.splitlines():
        if m := HEADING.match(line):
            members = m.group(2)
        elif m := ENTRY.match(line):
            assert m.group(1) not in entries, f"{m.group(1)} is listed twice in docs/architecture.md"
            entries[m.group(1)] = members
    return entries


def _member(path: str) -> str:
    """The layer member a module belongs to: ``planner/plan.py`` -> ``cost``, ``api.py`` -> ``api``."""
    return path.split("/", 1)[0].removesuffix(".py")


def test_every_module_has_its_line_in_its_layer() -> None:
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    entries = _entries()
    missing = sorted(modules - set(entries))
    gone = sorted(set(entries) - modules)
    assert not missing, (
        "modules missing from docs/architecture.md (add a line `- `path`: one sentence.` under "
        "its layer in 'Every module, by layer'): " + ", ".join(missing)
    )
    assert not gone, "docs/architecture.md lists modules that no longer exist: " + ", ".join(gone)
    misplaced = [
        f"{path} (under {members!r})"
        for path, members in entries.items()
        if path != "__init__.py" and f"`{_member(path)}`" not in (members or "")
    ]
    assert not misplaced, "modules listed under another layer's heading: " + ", ".join(misplaced)


def test_layer_headings_follow_the_contract() -> None:
    """One heading per layer of the import-linter contract, in its order, naming its members."""
    layers = _graph_script().read_layers()
    text = DOC.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    headings = [(int(m.group(1)), m.group(2)) for m in map(HEADING.match, text.splitlines()) if m]
    want = [(i, ", ".join(f"`{n}`" for n in names)) for i, (_, names) in enumerate(layers, 1)]
    got = [(i, re.sub(r"^(`[^`]+`(?:, `[^`]+`)*).*$", r"\1", h)) for i, h in headings]
    assert got == want, f"layer headings {got} do not match the contract in pyproject.toml {want}"


def test_the_layer_picture_is_fresh() -> None:
    script = _graph_script()
    text = DOC.read_text(encoding="utf-8")
    assert script.replace_block(text, script.current_block()) == text, (
        "the generated layers in docs/architecture.md are stale: run "
        ".venv/bin/python docs/make_architecture_graph.py"
    )
