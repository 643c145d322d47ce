"""The output folder of a run, and what makes ``--resume`` safe.

A folder that already holds bench answers is never written over by accident: a new run refuses
it unless ``--resume`` (keep the answers, run what is missing) or ``--overwrite`` (delete the
folder, and only if ``draftwise bench`` made it: it carries bench's marker file).

``--resume`` reuses an answer only if everything that shaped it is the same. The run stores a
fingerprint (``fingerprint.json``) of:

- the run: the model's identity (its folder name, which for a converted GGUF holds the file's
  hash; a hash of ``config.json``; the weight files' names and sizes; the runtime), dtype,
  sampling (temperature, top-k, top-p, seed), ``max_new_tokens`` and ``repeats``;
- each method: its canonical draft spec and k, the layers a self draft runs, the peer's
  settings, and for ``auto`` a digest of the plan's choices;
- each question: a hash of its category and turns, so another questions file whose
  ``question_id``\\ s match is refused.

Any difference refuses the resume and names it. Adding a method or questions to a resumed run is
not a difference: nothing already answered changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftwise.bench.answers import end_with_newline, question_key, read_answers
from draftwise.bench.methods import Method, method_filename
from draftwise.core.sampling import SamplingConfig
from draftwise.errors import ConfigError
from draftwise.fsutil import check_writable, claim_output_dir, write_json_atomic
from draftwise.questions import Question

COMMAND = "bench"
FINGERPRINT = "fingerprint.json"
SCHEMA = "draftwise-bench-fingerprint/1"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def holds_answers(out: Path) -> bool:
    """Whether ``out`` holds the output of an earlier bench run."""
    answers = out / "answers"
    return (out / FINGERPRINT).is_file() or (out / "summary.json").is_file() or (
        answers.is_dir() and any(answers.iterdir())
    )


def prepare_out(out: str | Path, *, resume: bool = False, overwrite: bool = False) -> Path:
    """Check (and create) the output folder before any expensive work; refuse to mix runs.

    Safe to call twice (the CLI calls it before loading the model, :func:`run_bench` again).
    """
    out = Path(out).expanduser()
    if resume and overwrite:
        raise ConfigError("pass --resume (continue the run in --out) or --overwrite (start again), not both")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder; pass another --out")
    if holds_answers(out):
        if overwrite:
            return claim_output_dir(out, COMMAND, overwrite=True, holds="bench answers")
        if not resume:
            raise ConfigError(
                f"{out} already holds bench answers; pass --resume to continue that run, "
                "--overwrite to replace it, or another --out"
            )
        if not (out / FINGERPRINT).is_file():
            raise ConfigError(
                f"cannot resume {out}: it has no {FINGERPRINT} (made by an older draftwise?), so its "
                "answers cannot be checked against this run; delete it or pass another --out"
            )
        return check_writable(out)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return claim_output_dir(out, COMMAND, overwrite=False, holds="bench answers")
    return check_writable(out)  # a folder of other things (a plan, say): bench writes beside them


def model_identity(model: Any) -> dict[str, Any]:
    """What tells one model's weights from another's, cheaply (no hash of gigabytes)."""
    folder = Path(model.folder)
    config = folder / "config.json"
    weights = {
        p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.suffix in _WEIGHT_SUFFIXES
    } if folder.is_dir() else {}
    return {
        "name": model.name,
        "folder": folder.name,  # a converted GGUF's folder name holds the file's hash
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.is_file() else None,
        "weights": weights,
        "runtime": type(model.runtime).__name__,
    }


def plan_digest(plan: Any) -> str | None:
    """A digest of a plan's choices (None for a plan object without a ``recommended`` table)."""
    recommended = getattr(plan, "recommended", None)
    if not isinstance(recommended, Mapping):
        return None
    return _digest({str(c): [str(v) for v in choice] for c, choice in recommended.items()})


def method_fingerprint(method: Method, plan: Any = None) -> dict[str, Any]:
    """Everything that shapes a method's answers besides the run-wide settings."""
    layers = getattr(method.drafter, "layers", None)
    return {
        "kind": method.kind,
        "spec": method.spec,
        "k": method.k,
        "layers": list(layers) if layers is not None else None,
        "peer": {key: str(v) for key, v in sorted(method.hf_kwargs.items())} or None,
        "plan": plan_digest(plan) if method.kind == "auto" else None,
    }


def question_digest(q: Question) -> str:
    """A hash of what the model is asked: the category (``auto`` follows it) and the turns."""
    return _digest({"category": q.category, "turns": list(q.turns)})


#: run settings added after schema 1, and the value a fingerprint without them had
_ADDED_RUN_SETTINGS: dict[str, Any] = {"repeats": 1, "settle": None}


def fingerprint(
    model: Any,
    sampling: SamplingConfig,
    max_new_tokens: int,
    methods: Sequence[Method],
    questions: Sequence[Question],
    plan: Any = None,
    repeats: int = 1,
    settle: float | None = None,
) -> dict[str, Any]:
    """The fingerprint of a run (see the module docstring)."""
    return {
        "schema": SCHEMA,
        "run": {
            "model": model_identity(model),
            "dtype": model.mode,
            "max_new_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "repeats": repeats,
            "settle": settle,
        },
        "methods": {m.name: method_fingerprint(m, plan) for m in methods},
        "questions": {question_key(q): question_digest(q) for q in questions},
    }


def differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between a stored fingerprint and this run's, one phrase each."""
    if before.get("schema") != SCHEMA:
        return [f"its {FINGERPRINT} has schema {before.get('schema')!r}, not {SCHEMA!r}"]
    diff = []
    for key, value in now["run"].items():
        was = before["run"].get(key, _ADDED_RUN_SETTINGS.get(key))
        if was != value:
            diff.append(f"model: {was} -> {value}" if key == "model" else f"{key}: {was!r} -> {value!r}")
    for name, fp in now["methods"].items():
        old = before["methods"].get(name)
        if old is not None and old != fp:
            changed = ", ".join(f"{f} {old.get(f)!r} -> {v!r}" for f, v in fp.items() if old.get(f) != v)
            diff.append(f"method {name}: {changed}")
    for key, digest in now["questions"].items():
        old = before["questions"].get(key)
        if old is not None and old != digest:
            diff.append(f"question {key}: its text or category differs (another questions file?)")
    return diff


def read_fingerprint(out: Path) -> dict[str, Any]:
    path = out / FINGERPRINT
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot resume {out}: {path} is unreadable ({exc}); delete the folder or pass another --out") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("run", "methods", "questions")):
        raise ConfigError(f"cannot resume {out}: {path} is not a bench fingerprint; delete the folder or pass another --out")
    return data


def start_run(
    out: Path, now: dict[str, Any], methods: Sequence[Method], questions: Sequence[Question], resume: bool
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, Any]]:
    """Check a resume against the stored fingerprint, store the (merged) fingerprint, and return
    the answers that may be reused and one open answer file per method."""
    before = read_fingerprint(out) if resume and (out / FINGERPRINT).is_file() else None
    if before is not None:
        diff = differences(before, now)
        if diff:
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            raise ConfigError(f"cannot resume {out}: it was run with other settings ({shown}); "
                              "pass --overwrite to start again or another --out")
        now = {**now, "methods": {**before["methods"], **now["methods"]},
               "questions": {**before["questions"], **now["questions"]}}
    write_json_atomic(out / FINGERPRINT, now)
    (out / "answers").mkdir(parents=True, exist_ok=True)
    wanted = {question_key(q) for q in questions}
    answers: dict[str, dict[str, dict[str, Any]]] = {m.name: {} for m in methods}
    files: dict[str, Any] = {}
    for m in methods:
        path = out / "answers" / method_filename(m.name)
        reuse = before is not None and m.name in before["methods"]
        if reuse:
            answers[m.name] = {key: r for key, r in read_answers(path).items() if key in wanted}
            end_with_newline(path)
        files[m.name] = path.open("a" if reuse else "w", encoding="utf-8")
    return answers, files
