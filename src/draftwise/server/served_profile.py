"""Measuring the served step (:class:`draftwise.cost.served.ServedProfile`) on the server's own
worker, in this process, as ``draftwise plan --concurrency --validate`` drives it
(:mod:`draftwise.server.validate`: the intake, the worker and its batched engine, N closed-loop
clients on an event loop of their own; no HTTP).

At each N of the grid, one server at a time: N clients send plain requests (``{"draft":
"none"}``), then requests that speculate with one draft at a fixed k (``lookup`` at k = 3 by
default), each client its own dev questions, greedy, ``max_tokens`` a request. The worker records
every step (:attr:`draftwise.server.worker.Worker.step_samples`): its pass's shape and seconds,
and its seconds outside the pass. The drafts' own seconds are the ordinary profile's D(k) and are
taken out before the fit, as the goodput policy prices them apart.

The questions are a plan's own (by default the first of each Spec-Bench dev category, what a plan
traces by default), never those ``--validate`` scores a plan on; the clients take them in turn. A measurement takes one to two minutes on a 2-core
CPU; it is cached beside the batch profile and measured again when that changes.

Example::

    served = resolve_served_profile(model, batch_profile, profile, batches=[1, 2, 4, 8, 16])
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.profile import Profile
from draftwise.cost.served import (
    ServedProfile,
    StepSample,
    default_served_profile_path,
    served_profile,
)
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.policy.adaptive import resolve_profile
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions, select_questions
from draftwise.server.speculation import Speculation
from draftwise.server.validate import Served, phase

#: the draft and k of the speculating requests, and the tokens a request asks for
DRAFT, K, MAX_TOKENS = "lookup", 3, 64
REQUESTS_PER_CLIENT = 2


def _prompts(question_ids: Sequence[Any] | None = None,
             pool: Sequence[Question] | None = None) -> list[list[dict[str, Any]]]:
    """One-turn units: the first turns of the questions ``question_ids`` of ``pool`` (default: the
    dev questions; ids default: the first of each category, what a plan traces by default, and
    ``--validate`` never scores on them)."""
    questions = list(pool) if pool is not None else read_questions(DEFAULT_QUESTIONS)
    if question_ids is None:
        picked = select_questions(questions, 1)
    else:
        wanted = {str(q) for q in question_ids}
        picked = [q for q in questions if str(q.question_id) in wanted]
    if not picked:
        raise ConfigError("no dev questions to serve for the served profile")
    return [[{"question_id": q.question_id, "category": q.category, "turn": 1, "users": [q.turns[0]], "answers": []}]
            for q in picked]


def _samples_at(model: Any, n: int, units: list[list[dict[str, Any]]], *, draft: str, k: int,
                max_tokens: int, requests_per_client: int) -> list[tuple[bool, list[StepSample]]]:
    """One server at ``n``: a warm-up, then the plain phase and the speculating phase; each
    phase's steps (``True``: the speculating one)."""
    speculation = Speculation(model, draft=draft, k=k, plan=None)
    served = Served(model, None, n, k="plan", max_tokens=max_tokens, capacity=None, speculation=speculation)
    mine = [[(i * requests_per_client + j) % len(units) for j in range(requests_per_client)] for i in range(n)]
    specs = [(False, {"draft": "none"}), (True, {"draft": draft, "k": k})]

    async def run() -> list[tuple[bool, list[StepSample]]]:
        await phase(served, units[:1], "none", [[0]], 8, False, {"draft": draft, "k": k})  # warm-up, not kept
        out = []
        for speculating, spec in specs:
            served.worker.step_samples = []
            await phase(served, units, "none", mine, max_tokens, False, spec)
            out.append((speculating, served.worker.step_samples))
        served.worker.step_samples = None
        return out

    try:
        return served.run(lambda: asyncio.run(run()))
    finally:
        if hasattr(model.runtime, "allocate_slots"):
            model.runtime.allocate_slots(1)


def measure_served_profile(model: Any, batch: BatchProfile, profile: Profile | None = None, *,
                           batches: Sequence[int] = (1, 2, 4, 8, 16), draft: str = DRAFT, k: int = K,
                           max_tokens: int = MAX_TOKENS, requests_per_client: int = REQUESTS_PER_CLIENT,
                           question_ids: Sequence[Any] | None = None, pool: Sequence[Question] | None = None,
                           status: Callable[[str], None] | None = None) -> ServedProfile:
    """Serve at every N of ``batches`` (module docstring) and fit the served step against ``batch``
    (``model``'s batch profile). ``profile`` prices ``draft``'s D(k) (read or measured when it lacks it);
    ``question_ids``: the dev questions the clients send, in turn (default: :func:`_prompts`')."""
    grid = sorted({int(b) for b in batches})
    if not grid or grid[0] < 1 or grid[-1] > batch.max_batch:
        raise ConfigError(f"served batches {list(batches)}: each must be 1..{batch.max_batch}, the batch profile's")
    key = str(DraftSpec.parse(draft))
    if profile is None or key not in profile.drafts:
        profile = resolve_profile(model, [key])
    draft_s = profile.draft_time(key, k)
    units = _prompts(question_ids, pool)
    samples: list[StepSample] = []
    for n in grid:
        if status is not None:
            status(f"measuring the served step at N={n} (plain, then {key} k={k}; {n * requests_per_client} "
                   f"requests of {max_tokens} tokens each)")
        for speculating, steps in _samples_at(model, n, units, draft=key, k=k, max_tokens=max_tokens,
                                              requests_per_client=requests_per_client):
            samples += [StepSample(s.sequences, s.rows, s.prompt_rows, s.context, s.pass_s, s.outside_s, s.plain,
                                   s.speculating, s.speculating * draft_s if speculating else 0.0) for s in steps]
    settings = {"draft": key, "k": k, "max_tokens": max_tokens, "requests_per_client": requests_per_client,
                "draft_seconds": draft_s}
    return served_profile(samples, batch, batches=grid, settings=settings)


def resolve_served_profile(model: Any, batch: BatchProfile, profile: Profile | None = None, *,
                           batches: Sequence[int] = (1, 2, 4, 8, 16), path: str | Path | None = None,
                           measure: bool = True, question_ids: Sequence[Any] | None = None,
                           status: Callable[[str], None] | None = None, **settings: Any) -> ServedProfile:
    """The cached served profile (default path: :func:`default_served_profile_path`) when it was
    measured against ``batch`` and covers ``batches``; else measured (``measure``; ``settings``:
    :func:`measure_served_profile`'s) and saved."""
    target = Path(path) if path is not None else default_served_profile_path(model)
    if target.is_file():
        cached = ServedProfile.load(target)
        try:
            cached.check_batch(batch)
            if set(batches) <= set(cached.batches):
                return cached
            reason = f"it covers N = {cached.batches}, not {sorted(batches)}"
        except ConfigError as exc:
            reason = str(exc)
        if status is not None:
            status(f"the cached served profile does not fit ({reason}); measuring again")
    if not measure:
        raise ConfigError(f"no served profile at {target} for this batch profile; measure one first")
    served = measure_served_profile(model, batch, profile, batches=batches, question_ids=question_ids, status=status,
                                    **settings)
    served.save(target)
    if status is not None:
        status(f"served step: {served.step_seconds * 1e3:.2f} ms a step + {served.per_plain * 1e3:.2f} ms a plain "
               f"sequence + {served.per_speculating * 1e3:.2f} ms a speculating one; passes x "
               + ", ".join(f"{s:.2f} at {b}" for b, s in sorted(served.pass_scale.items())) + f" (cached at {target})")
    return served
