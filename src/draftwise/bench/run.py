"""``run_bench``: plain decoding, every draft and the peers on the same questions, interleaved.

What one run does, on one loaded model, in one process:

1. reads the questions (Spec-Bench JSONL, any category, or a text file with one prompt a line);
2. runs plain decoding (``none``), every draft method and the optional peers on the same
   prompts, *interleaved* question by question with the order rotating, so that the noise of a
   shared machine hits every method alike;
3. writes one Spec-Bench answer file per method (``DIR/answers/<method>.jsonl``, flushed line by
   line), then ``summary.json``, ``summary.md`` and PNG plots.

Greedy runs also check losslessness (:mod:`draftwise.bench.equality`); the conventions of the
numbers are in :mod:`draftwise.bench.summary`, the rules of the output folder and of
``--resume`` in :mod:`draftwise.bench.outdir`.

Example::

    from draftwise import load_model
    from draftwise.bench import run_bench
    model = load_model("default")
    summary = run_bench(model, drafts="lookup,suffix", k=4, max_new_tokens=64,
                        limit_per_category=1, out_dir="bench-out")
    summary["groups"]["overall"]["lookup"]["speedup"]
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from draftwise.bench.answers import answer_record, question_key
from draftwise.bench.batched import check_batch_option, check_batch_runtime, run_batched
from draftwise.bench.equality import check_equality
from draftwise.bench.methods import AUTO, DraftItem, Method, parse_methods, parse_peers
from draftwise.bench.noise import speedup_intervals
from draftwise.bench.outdir import fingerprint, prepare_out, start_run
from draftwise.bench.report import render_markdown, write_plots
from draftwise.bench.runner import (
    Runner,
    build_methods,
    build_prompt,
    load_plan_for_auto,
)
from draftwise.bench.summary import summarise
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.spec import KValue, parse_k
from draftwise.errors import ConfigError, ContextLengthError
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.planner.defaults import DEFAULT_DRAFTS
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    parse_question,
    read_questions,
    select_questions,
)
from draftwise.runtime.loaders import load_model

Answers = dict[str, dict[str, dict[str, Any]]]


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not enabled, transient=False,
    ) as bar:
        yield bar


def _questions(questions: str | Path | Sequence[Question | Mapping[str, Any]]) -> list[Question]:
    if isinstance(questions, (str, Path)):
        return read_questions(questions)
    qs = [q if isinstance(q, Question) else parse_question(q, f"questions[{i}]") for i, q in enumerate(questions)]
    if not qs:
        raise ConfigError("no questions to run")
    return qs


def _check(max_new_tokens: int, time_budget: float | None) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if time_budget is not None and not time_budget >= 0:
        raise ConfigError(f"time_budget={time_budget!r} must be a number of seconds >= 0")


def check_repeats(repeats: int, sampling: SamplingConfig) -> int:
    """``repeats`` if it is a whole number >= 1 whose runs decode the same tokens, else a
    :class:`~draftwise.errors.ConfigError`: repeats of a sampled turn need a seed."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an integer >= 1 (runs of each turn, the fastest kept)")
    if repeats > 1 and not sampling.greedy and sampling.seed is None:
        raise ConfigError(f"repeats={repeats} with sampling needs a seed (--seed), so that every run of a turn "
                          "decodes the same tokens and only the time differs")
    return repeats


def check_settle(settle: float | None, repeats: int) -> float | None:
    """``settle`` if it is None or a fraction in (0, 1) with ``repeats`` >= 2, else a
    :class:`~draftwise.errors.ConfigError`."""
    if settle is None:
        return None
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not 0 < settle < 1:
        raise ConfigError(f"settle={settle!r} must be a fraction between 0 and 1 (e.g. 0.03: the two fastest "
                          "runs of a turn within 3%)")
    if repeats < 2:
        raise ConfigError(f"settle={settle} needs repeats >= 2: it compares a turn's two fastest runs")
    return float(settle)


def _warm_up(runner: Runner, methods: Sequence[Method], answers: Answers, qs: Sequence[Question]) -> None:
    """First calls pay for lazy initialisation; keep that out of the timing."""
    saved, runner.max_new_tokens = runner.max_new_tokens, min(4, runner.max_new_tokens)
    try:
        prompt = build_prompt(runner.model, ["Say hello."], [])
        for m in methods:
            if m.kind != AUTO and any(question_key(q) not in answers[m.name] for q in qs):
                runner.turn(m, prompt, "qa")  # a draft with a cache learns nothing from it
    finally:
        runner.max_new_tokens = saved


def _loop(
    runner: Runner,
    methods: Sequence[Method],
    qs: Sequence[Question],
    answers: Answers,
    files: Mapping[str, Any],
    state: dict[str, Any],
    progress: bool,
    time_budget: float | None,
) -> None:
    """Every pending (question, method): a question's methods run turn by turn, alternating
    (:meth:`Runner.questions`), their order rotating per question; each answer is written and
    flushed as soon as its question is done. ``state`` collects ``skipped`` and ``stopped``."""
    todo = sum(1 for q in qs for m in methods if question_key(q) not in answers[m.name])
    with _progress(progress) as bar:
        task = bar.add_task("bench", total=todo)
        for qi, q in enumerate(qs):
            key = question_key(q)
            pending = [m for m in methods if key not in answers[m.name]]
            if not pending:
                continue
            if not runner.fits(q):
                state["skipped"].append({"question_id": q.question_id, "reason": "context"})
                bar.update(task, advance=len(pending))
                continue
            try:
                by_method = runner.questions(pending, q, shift=qi % len(methods))
            except ContextLengthError:
                state["skipped"].append({"question_id": q.question_id, "reason": "context"})
                bar.update(task, advance=len(pending))
                continue
            for m in pending:
                turns = by_method[m.name]
                record = answer_record(runner.model.name, m, q, turns)
                answers[m.name][key] = record
                if m.name in files:
                    files[m.name].write(json.dumps(record, ensure_ascii=False) + "\n")
                    files[m.name].flush()
                tps = sum(len(t.token_ids) for t in turns) / max(sum(t.seconds for t in turns), 1e-9)
                bar.update(task, advance=1, description=f"{m.name:>14} q{q.question_id} {tps:7.1f} tok/s")
            if time_budget is not None and time.perf_counter() - state["started"] > time_budget:
                if qi + 1 < len(qs):
                    state["stopped"] = "time_budget"
                break


def _config(model: Any, questions: Any, qs: Sequence[Question], methods: Sequence[Method],
            sampling: SamplingConfig, k: KValue, max_new_tokens: int, peer_names: Sequence[str],
            limit_per_category: int | None, plan: Any, repeats: int, settle: float | None) -> dict[str, Any]:
    """The summary's ``config``: what the run was."""
    names = [m.name for m in methods]
    return {
        "model": model.name,
        "folder": str(model.folder),
        "dtype": model.mode,
        "runtime": type(model.runtime).__name__,
        "max_new_tokens": max_new_tokens,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "k": k,
        "methods": names,
        "drafts": {m.name: {"spec": m.spec, "k": m.k} for m in methods if m.kind != "hf"},
        "peers": list(peer_names),
        "limit_per_category": limit_per_category,
        "questions": str(questions) if isinstance(questions, (str, Path)) else f"{len(qs)} given",
        "plan": str(plan) if plan is not None and not hasattr(plan, "choose") else None,
        "repeats": repeats,
        "settle": settle,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def run_bench(
    model: Any,
    questions: str | Path | Sequence[Question | Mapping[str, Any]] = DEFAULT_QUESTIONS,
    *,
    drafts: str | Sequence[DraftItem] = DEFAULT_DRAFTS,
    k: KValue = 4,
    max_new_tokens: int = 128,
    limit_per_category: int | None = None,
    sampling: SamplingConfig | None = None,
    peers: str | Sequence[str] = (),
    out_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    time_budget: float | None = None,
    progress: bool = True,
    plan: Any = None,
    dtype: str = "float32",
    warmup: bool = True,
    batch: int = 1,
    repeats: int = 1,
    settle: float | None = None,
) -> dict[str, Any]:
    """Benchmark plain decoding (``none``), each draft and each peer on a workload.

    ``model`` is a loaded :class:`draftwise.Model` or a spec (``"default"``, a folder, a .gguf;
    loaded with ``dtype``). ``questions`` is a Spec-Bench JSONL path or a text file (one prompt a
    line), or a list of :class:`~draftwise.questions.Question` (or dicts shaped like JSONL lines).
    ``drafts`` are specs (``"lookup"``, ``"self"``, ``"model:PATH"``, ``"lookup@k=8"``, ``"auto"``
    = the plan's choice per category) or ``(spec, k)`` pairs; ``k`` is an int or ``"auto"``.
    ``peers=("hf",)`` adds Hugging Face ``generate``. ``plan`` is a plan object or path (default
    ``out_dir/plan.json``; only ``auto`` needs one).

    With ``out_dir``: answer files, ``summary.json``, ``summary.md`` and plots are written there.
    A folder that already holds bench answers is refused unless ``resume=True`` (reuse the answers
    of an identical run and run what is missing; any difference in settings is refused) or
    ``overwrite=True`` (replace a folder bench made). ``time_budget`` (seconds) stops after the
    question during which it ran out. On Ctrl-C the summary of the finished questions is written
    and KeyboardInterrupt re-raised. ``batch`` > 1 (native runtime only) then runs the finished
    questions again ``batch`` at a time on the batched engine (:mod:`draftwise.bench.batched`):
    the summary's ``batched`` part. ``repeats`` > 1 runs every turn that many times, the methods
    alternating run by run, and keeps the fastest (a timing with less of a shared machine's noise in it; sampling needs a
    seed), each run decoding the same tokens: only the kept answer teaches a draft that learns.
    ``settle`` (a fraction; needs ``repeats`` >= 2) runs another round of every method's turn
    while any one's two fastest runs differ by more than that, up to 3 x ``repeats`` rounds.

    Returns the summary: ``{"groups": {group: {method: {"tokens_per_s", "speedup",
    "speedup_total_time", "new_tokens", "wall_s", "mat", "acceptance", "draft_time_share",
    "questions"}}}, "equality", "config", "acceptance_by_position", "run"}`` (``"batched"`` with
    ``batch`` > 1; ``"noise"``, :mod:`draftwise.bench.noise`, with ``repeats`` > 1); the two
    speedups are defined in :mod:`draftwise.bench.summary`.
    """
    started = time.perf_counter()
    sampling = sampling or SamplingConfig()
    _check(max_new_tokens, time_budget)
    repeats = check_repeats(repeats, sampling)
    settle = check_settle(settle, repeats)
    batch = check_batch_option(batch)
    k = parse_k(k)
    peer_names = parse_peers(peers)
    out = Path(out_dir).expanduser() if out_dir is not None else None
    if (resume or overwrite) and out is None:
        raise ConfigError("resume and overwrite need out_dir, the folder of the run")
    qs = select_questions(_questions(questions), limit_per_category)
    parsed = parse_methods(drafts, k)  # validate before loading anything
    plan_obj = load_plan_for_auto(plan, out) if any(spec == AUTO for _, spec, _ in parsed) else None
    if out is not None:
        prepare_out(out, resume=resume, overwrite=overwrite)
    if isinstance(model, (str, Path)):
        model = load_model(model, dtype=dtype)  # type: ignore[arg-type]
    check_batch_runtime(model, batch, qs, max_new_tokens)
    methods = build_methods(model, drafts, k, peer_names)
    names = [m.name for m in methods]
    config = _config(model, questions, qs, methods, sampling, k, max_new_tokens, peer_names, limit_per_category,
                     plan, repeats, settle)
    answers: Answers = {m.name: {} for m in methods}
    files: dict[str, Any] = {}
    if out is not None:
        now = fingerprint(model, sampling, max_new_tokens, methods, qs, plan_obj, repeats, settle)
        answers, files = start_run(out, now, methods, qs, resume)
    reused = sum(len(a) for a in answers.values())
    runner = Runner(model, max_new_tokens, sampling, plan_obj, repeats, settle)
    state: dict[str, Any] = {"started": started, "skipped": [], "stopped": None, "reused": reused}
    try:
        if warmup and any(question_key(q) not in answers[n] for q in qs for n in names):
            _warm_up(runner, methods, answers, qs)
        _loop(runner, methods, qs, answers, files, state, progress, time_budget)
        if batch > 1:
            with _progress(progress) as bar:
                state["batched"] = run_batched(model, methods, qs, answers, batch=batch, bar=bar,
                                               max_new_tokens=max_new_tokens, sampling=sampling)
    except KeyboardInterrupt:
        for f in files.values():
            f.close()
        state["stopped"] = "interrupted"
        _finish(model, answers, qs, names, config, out, sampling, state)
        raise
    finally:
        for f in files.values():
            f.close()
    return _finish(model, answers, qs, names, config, out, sampling, state)


def _finish(
    model: Any,
    answers: Answers,
    qs: Sequence[Question],
    names: Sequence[str],
    config: dict[str, Any],
    out: Path | None,
    sampling: SamplingConfig,
    state: Mapping[str, Any],
) -> dict[str, Any]:
    """Summarise what finished; write summary.json, summary.md and plots when ``out`` is set."""
    groups, by_position, complete = summarise(answers, qs, names)
    if sampling.greedy:
        equality = check_equality(model, answers, complete, names)
    else:
        equality = {"checked": False, "reason": "sampling (temperature > 0): outputs are equal only in distribution"}
    summary: dict[str, Any] = {
        "groups": groups,
        "equality": equality,
        "config": config,
        "acceptance_by_position": by_position,
        "run": {
            "questions_total": len(qs),
            "questions_finished": len(complete),
            "stopped": state["stopped"],
            "skipped": state["skipped"],
            "answers_reused": state["reused"],
            "elapsed_s": time.perf_counter() - state["started"],
        },
    }
    if state.get("batched") is not None:
        summary["batched"] = state["batched"]
    if config.get("repeats", 1) > 1 and complete and state["stopped"] != "interrupted":  # Ctrl-C: write, now
        summary["noise"] = speedup_intervals(answers, complete)
    if out is not None:
        summary["run"]["plots"] = write_plots(summary, out)
        write_text_atomic(out / "summary.md", render_markdown(summary))
        write_json_atomic(out / "summary.json", summary)
    return summary
