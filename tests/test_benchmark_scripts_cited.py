"""Every script of benchmarks/ that the README or docs/ tell a reader to run imports against the
package as it is (a module moved or renamed since the script was written fails here, as five of
the six scripts moved out of benchmarks/results did before their imports were brought up to date),
and has the ``main`` its command runs. Nothing is run: each script's own tests cover its parts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .benchmark_scripts import BENCHMARKS, load_benchmark

ROOT = BENCHMARKS.parent
CITED = re.compile(r"benchmarks/(\w+)\.py")


def _cited() -> list[str]:
    names: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        names.update(CITED.findall(doc.read_text(encoding="utf-8")))
    return sorted(names)


def test_the_docs_cite_benchmark_scripts() -> None:
    assert len(_cited()) >= 10, _cited()  # the pattern found them (a change of style would test nothing)


@pytest.mark.parametrize("name", _cited())
def test_a_cited_script_imports_and_has_its_main(name: str) -> None:
    path = BENCHMARKS / f"{name}.py"
    assert path.is_file(), f"the docs cite benchmarks/{name}.py, which does not exist"
    module = load_benchmark(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
