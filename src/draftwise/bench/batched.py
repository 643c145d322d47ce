"""``bench --batch N``: the same questions again, N at a time on the batched engine.

After the one-at-a-time loop, every method whose draft can run in a slot (plain decoding and
every draft but the peers, ``auto`` and EAGLE heads) runs the finished questions' turns on one
:class:`draftwise.core.engine.Engine`: all first turns together, then all second turns (each built
from that question's *batched* first answer, as :func:`.runner.build_prompt` builds it), and so
on. Per method:

- ``tokens_per_s`` (aggregate) = all the new tokens of its batched phase over the phase's wall
  time (prefill included);
- ``per_request_tokens_per_s`` = the mean over requests (turns) of a request's new tokens over
  its own seconds, from the moment its slot started it;
- ``x_one_at_a_time`` = the aggregate over the one-at-a-time row's total tokens over total
  time, on the same questions (its ``speedup (total time)`` convention);
- ``equal`` = turns whose tokens equal the same method's one-at-a-time tokens (greedy only:
  with sampling, ``None``, shown as ``n/a``).

The engine re-allocates the runtime's KV cache in slots, so this runs after the one-at-a-time
loop, and one slot is restored afterwards for whatever uses the model next.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from draftwise.bench.answers import choice, question_key
from draftwise.bench.methods import AUTO, Method
from draftwise.bench.runner import build_prompt
from draftwise.core.engine import Engine, check_batch
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.factory import make_drafter
from draftwise.errors import ConfigError, DraftwiseError
from draftwise.planner.route import policy_for
from draftwise.questions import Question

#: positions a slot holds beyond the longest conversation's estimate (a tree's nodes, a chain's bonus)
CONTEXT_MARGIN = 256


def check_batch_option(batch: Any) -> int:
    """``--batch``: an integer >= 1 (1: one at a time only), or one clear line."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--batch {batch!r}: must be an integer >= 1 (how many questions decode together)")
    return batch


def batch_context(model: Any, qs: Sequence[Question], max_new_tokens: int) -> int:
    """Positions a slot needs for the longest conversation of ``qs`` (the estimate of
    :meth:`.runner.Runner.fits`, plus :data:`CONTEXT_MARGIN`), at most the model's context."""
    need = 1
    for q in qs:
        n = len(q.turns)
        need = max(need, len(build_prompt(model, q.turns, [""] * (n - 1))) + n * (max_new_tokens + 8))
    return min(model.runtime.max_context, need + CONTEXT_MARGIN)


def check_batch_runtime(model: Any, batch: int, qs: Sequence[Question], max_new_tokens: int) -> None:
    """Refuse, before anything runs, a batch the runtime cannot run or the memory cannot hold."""
    if batch > 1 and not hasattr(model.runtime, "forward_batch"):
        raise ConfigError(
            f"--batch {batch}: the {type(model.runtime).__name__} runtime runs one sequence at a time; "
            "batching needs the native runtime (Llama-family models); use --batch 1"
        )
    if batch > 1:
        check_batch(model, batch, batch_context(model, qs, max_new_tokens))


def not_batched(method: Method) -> str | None:
    """Why ``method`` is not run batched (None: it is)."""
    if method.kind == "hf":
        return "a peer (Hugging Face generate) runs one sequence at a time"
    if method.kind == AUTO:
        return "auto routes a draft per category; not run batched"
    return None


def _slots(engine: Engine, model: Any, method: Method) -> tuple[list[Any] | None, Any]:
    """One drafter per slot (sharing what the first learns across generations) and the k."""
    if method.drafter is None:
        return None, 1
    try:
        first = make_drafter(method.spec, engine.slot_models[0])
        drafters = [first] + [make_drafter(method.spec, m, share_with=first) for m in engine.slot_models[1:]]
    except DraftwiseError as exc:
        raise ConfigError(f"its drafter cannot be built on an engine slot: {exc}") from exc
    if method.k == "auto":
        caps = first.capabilities
        return drafters, lambda: policy_for(model, method.spec, "auto", capabilities=caps)
    return drafters, method.k


def _one_method(engine: Engine, model: Any, method: Method, qs: Sequence[Question], max_new_tokens: int,
                sampling: SamplingConfig, tick: Any) -> tuple[dict[str, list[Any]], float, int]:
    """Every turn of ``qs``, a turn at a time over all questions; (results per question, wall, passes)."""
    drafters, k = _slots(engine, model, method)
    outs: dict[str, list[Any]] = {question_key(q): [] for q in qs}
    done = 0
    passes = engine.stats.passes
    t0 = time.perf_counter()
    for t in range(max((len(q.turns) for q in qs), default=0)):
        todo = [q for q in qs if len(q.turns) > t]
        prompts = [
            build_prompt(model, q.turns[: t + 1], [r.text for r in outs[question_key(q)]]) for q in todo
        ]
        results = engine.generate_all(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                      drafters=drafters, k=k, progress=lambda n, d=done: tick(d + n))
        for q, r in zip(todo, results):
            outs[question_key(q)].append(r)
        done += len(todo)
    return outs, time.perf_counter() - t0, engine.stats.passes - passes


def _row(outs: Mapping[str, list[Any]], wall: float, passes: int, alone: Mapping[str, Any],
         qs: Sequence[Question], greedy: bool) -> dict[str, Any]:
    """The numbers of one method's batched phase against its one-at-a-time answers ``alone``."""
    results = [r for rs in outs.values() for r in rs]
    tokens = sum(len(r.token_ids) for r in results)
    mine = [choice(alone[question_key(q)]) for q in qs]
    alone_tokens = sum(sum(c["new_tokens"]) for c in mine)
    alone_wall = sum(sum(c["wall_time"]) for c in mine)
    alone_rate = alone_tokens / alone_wall if alone_wall > 0 else None
    rate = tokens / wall if wall > 0 else None
    mismatches = [
        {"question_id": q.question_id, "turn": t}
        for q, c in zip(qs, mine) for t, r in enumerate(outs[question_key(q)])
        if list(r.token_ids) != list(c["token_ids"][t])
    ]
    per_request = [len(r.token_ids) / r.seconds for r in results if r.seconds > 0]
    return {
        "requests": len(results),
        "new_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": rate,
        "per_request_tokens_per_s": statistics.mean(per_request) if per_request else None,
        "one_at_a_time_tokens_per_s": alone_rate,
        "x_one_at_a_time": rate / alone_rate if rate is not None and alone_rate else None,
        "target_passes": passes,
        "equal": len(results) - len(mismatches) if greedy else None,
        "mismatches": mismatches if greedy else [],
    }


def run_batched(model: Any, methods: Sequence[Method], qs: Sequence[Question], answers: Mapping[str, Any], *,
                batch: int, max_new_tokens: int, sampling: SamplingConfig, bar: Any) -> dict[str, Any]:
    """The batched phase of every method that can run it, on the questions every method finished
    (``answers[method][question key]``); the ``batched`` part of the summary."""
    names = [m.name for m in methods]
    done = [q for q in qs if all(question_key(q) in answers[n] for n in names)]
    skipped = {m.name: why for m in methods if (why := not_batched(m)) is not None}
    rows: dict[str, Any] = {}
    if done:
        engine = Engine(model, max_batch=batch, context=batch_context(model, done, max_new_tokens))
        try:
            warm = build_prompt(model, ["Say hello."], [])
            engine.generate_all([warm] * batch, max_new_tokens=min(4, max_new_tokens))  # lazy set-up, untimed
            for m in (m for m in methods if m.name not in skipped):
                task = bar.add_task(f"{m.name:>14} batch {batch}", total=sum(len(q.turns) for q in done))
                try:
                    outs, wall, passes = _one_method(engine, model, m, done, max_new_tokens, sampling,
                                                     lambda n, task=task: bar.update(task, completed=n))
                except DraftwiseError as exc:  # this method cannot run batched; the others still do
                    skipped[m.name] = str(exc)
                    continue
                rows[m.name] = _row(outs, wall, passes, answers[m.name], done, sampling.greedy)
        finally:
            model.runtime.allocate_slots(1)
    return {
        "batch": batch,
        "questions": len(done),
        "equality_checked": sampling.greedy,
        "methods": rows,
        "skipped": skipped,
    }
