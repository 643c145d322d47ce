"""Comments and docstrings say what the code does and why; run logs live in docs/benchmarks.md.

A run-log mark is a trace of one measurement in the source's prose: a date, a month with its
year, a benchmark host (``Xeon``, ``EPYC``, an "AVX-512 host", a "2-core AMD"), a run number
("goodput-policy run 32", "runs 29-34"), a commit hash beside the word commit, or a figure
quoted as measured ("measured: 1.24 ms"). Those figures, with their machine and command, belong
in ``docs/benchmarks.md``; a docstring may cite its section instead. Instruction-set names in
code that selects a kernel ("the AVX-512 path") are not marks: only a host they ran on is.

Only comments (:mod:`tokenize`) and docstrings (:mod:`ast`) are scanned; string literals the
code prints, and the code itself, are not. Consecutive comment lines are read as one text, so a
mark broken over two lines is still found, at the line where it starts.

``python tests/test_run_logs.py`` prints every mark as ``file:line: text`` and their count.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "draftwise"
#: the most marks the package may hold (each line with a mark counts once)
MAX_MARKS = 3

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
#: what a run number may be followed by and still be a quantity, not a run ("runs 2 threads")
_QUANTITY = (r"threads?|tokens?|times|sequences?|rows?|bits?|layers?|steps?|pass(?:es)?|cores?|requests?"
             r"|prompts?|seconds?|ms|drafts?|nodes?|queries|keys|positions?|rounds?|questions?")
#: one alternative per kind of mark; host names and month words are matched in their own case
#: (proper nouns), the rest in any case ("Run 3", "Commit")
RUN_LOG = re.compile("|".join([
    r"\b20\d\d-[01]\d-[0-3]\d\b",                                        # 2026-12-05
    rf"\b{_MONTH}\.?\s+(?:[0-3]?\d(?:st|nd|rd|th)?,?\s+)?20\d\d\b",       # December 2026, Dec 5, 2026
    r"\bXeon\b", r"\bEPYC\b",                                            # benchmark hosts
    r"\bAVX(?:-?512|2)\s+(?i:host|machine|box)\b",                         # "the AVX-512 host"
    r"\b\d+-core\s+(?:AMD|Intel|ARM|Apple|(?i:host|machine|box))\b",      # "a 2-core AMD ..."
    r"(?i:\bgoodput(?:-policy)?\s+runs?\b)",                               # "goodput-policy run 32"
    # "run 7", "runs 32 and 33", "runs 29-34"; not "runs 4-bit weights", "runs 2 threads"
    rf"(?i:\bruns?\s+\d+(?:\s*(?:-|–|and|to|,)\s*\d+)*\b(?![-\w.]|\s+(?:{_QUANTITY})\b))",
    r"(?i:\bcommits?\W{1,3}(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b)",              # commit 1a2b3c4
    r"(?i:\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\W{1,3}commit\b)",  # 1a2b3c4 commit
    r"(?i:\bmeasured(?:\s+here)?:\s*~?[\d.]+\s*(?:ms|s|tok/s|x|%))",       # "measured: 1.24 ms"
]))


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _comment_blocks(source: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of each run of comments on consecutive lines (``#`` and ``#:``
    stripped, lines joined by newlines)."""
    blocks: list[tuple[int, list[str]]] = []
    last = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        text = tok.string.lstrip("#").lstrip(":").strip()
        if blocks and line == last + 1:
            blocks[-1][1].append(text)
        else:
            blocks.append((line, [text]))
        last = line
    return [(line, "\n".join(texts)) for line, texts in blocks]


def _docstrings(source: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of the module's, each class's and each function's docstring, and
    of the attribute docstrings (a string statement after an assignment)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                out.append((stmt.lineno, stmt.value.value))
    return out


def _marks_in(line0: int, text: str) -> list[tuple[int, str]]:
    """``(line, excerpt)`` of each mark in ``text``, whose first line is ``line0``."""
    out = []
    for m in RUN_LOG.finditer(text):
        line = line0 + text.count("\n", 0, m.start())
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        excerpt = " ".join(text[start:end if end >= 0 else len(text)].split())
        out.append((line, excerpt))
    return out


def run_log_marks() -> list[str]:
    """Every line of a comment or docstring under ``src/draftwise`` that holds a run-log mark,
    as ``path:line: text`` (one entry per line, however many marks it holds)."""
    hits: dict[tuple[str, int], str] = {}
    for path in _sources():
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        for line0, text in _comment_blocks(source) + _docstrings(source):
            for line, excerpt in _marks_in(line0, text):
                hits.setdefault((rel, line), excerpt)
    return [f"{rel}:{line}: {text}" for (rel, line), text in sorted(hits.items())]


def test_marks_are_found() -> None:
    """The pattern finds the marks it is for and leaves ordinary prose and code words alone."""
    for text in ("on 2026-12-05 it took", "in December 2026", "a 2-core Intel Xeon", "the AVX-512 host",
                 "on the 2-core AMD box", "goodput-policy run 32", "(benchmarks.md, runs 32 and 33)",
                 "runs 29-34", "run 7)", "at commit 1a2b3c4d", "measured: 1.24 ms on it"):
        assert _marks_in(1, text), text
    for text in ("the AVX-512 kernel is chosen when the CPU has it", "q4 runs 4-bit weights",
                 "it runs 2 threads", "a run of 16 tokens", "commit the accepted tokens",
                 "each run's measured seconds", "may 20 rows", "the runs that 3 drafts make"):
        assert not _marks_in(1, text), text


def test_few_run_logs_in_comments_and_docstrings() -> None:
    """At most :data:`MAX_MARKS` run-log marks in the package's comments and docstrings."""
    hits = run_log_marks()
    for hit in hits:
        print(hit)
    assert len(hits) <= MAX_MARKS, (
        f"{len(hits)} run-log marks in comments and docstrings (at most {MAX_MARKS}); move the "
        "figures to docs/benchmarks.md and cite its section:\n" + "\n".join(hits))


if __name__ == "__main__":
    found = run_log_marks()
    print("\n".join(found))
    print(f"{len(found)} run-log marks in comments and docstrings under src/draftwise (at most {MAX_MARKS})")
    sys.exit(0 if len(found) <= MAX_MARKS else 1)
