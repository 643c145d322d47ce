"""How far a bench's speedups move with the host's run-to-run noise, from the runs it kept.

With ``repeats`` > 1 every turn runs in rounds, each round running every method once within
seconds, and each run's time is kept (``repeat_seconds`` in the turn's stats). A redraw picks a
turn's rounds again with replacement, the same rounds for every method (so what a round shared,
the host's state at that moment, stays shared), keeps each method's fastest run among them, as
bench does, and computes the speedups as :mod:`draftwise.bench.summary` does. Over many redraws
that is each speedup's spread under the host's noise, the work (tokens, passes) and the questions
held fixed. It does not say what other questions would give: a few questions per group are a
small sample of their category, and that spread is not in it. A redrawn turn is never faster
than the fastest run bench kept, so the draws' median can sit a little off bench's reading;
both are reported.

    >>> runs = {"none": {"1": ([8], [[2.0, 2.2]])}, "lookup": {"1": ([8], [[1.0, 1.6]])}}
    >>> reading = lambda groups: {g: rows["lookup"] for g, rows in groups.items()}
    >>> sorted({round(r["overall"], 3) for r in redraw(runs, [Question(1, "qa", ("",))], reading, 200)})
    [1.375, 2.0]
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from draftwise.bench.answers import choice, question_key
from draftwise.bench.methods import BASELINE
from draftwise.bench.summary import OVERALL, group_order
from draftwise.questions import Question, category_group

#: redraws of every turn's rounds behind a bench summary's intervals
DRAWS = 1000

#: method -> question key -> (new tokens of each turn, run seconds of each turn)
Runs = Mapping[str, Mapping[str, tuple[list[int], list[list[float]]]]]
#: group -> method -> speedup (mean tok/s over ``none``'s), as the summary's ``speedup``
Speedups = dict[str, dict[str, float]]


def turn_runs(record: Mapping[str, Any]) -> tuple[list[int], list[list[float]]]:
    """An answer line's new tokens per turn and each turn's run times: its ``repeat_seconds``, or
    the one time it kept (a line without stats, from another tool, counts one run a turn)."""
    c = choice(record)
    stats = c.get("stats") or [{}] * len(c["wall_time"])
    return list(c["new_tokens"]), [list(s.get("repeat_seconds") or [w]) for s, w in zip(stats, c["wall_time"])]


def runs_of(answers: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:data:`Runs` of ``answers[method][question key]``."""
    return {m: {k: turn_runs(r) for k, r in by_q.items()} for m, by_q in answers.items()}


def most_runs(runs: Runs) -> int:
    """The most runs any turn had (1: nothing to redraw)."""
    return max((len(t) for by_q in runs.values() for _, turns in by_q.values() for t in turns), default=1)


def speedups(runs: Runs, questions: Sequence[Question], pick: Callable[[str, str, int], float]) -> Speedups:
    """Each method's speedup per group, a turn's time being ``pick(method, key, turn)``: the
    summary's mean-tok/s speedup (a question's tok/s = its tokens over its time, all turns)."""
    keys = {question_key(q): category_group(q.category) for q in questions}
    rate = {m: {} for m in runs}
    for m, by_q in runs.items():
        for k in keys:
            tokens, turns = by_q[k]
            seconds = sum(pick(m, k, t) for t in range(len(turns)))
            rate[m][k] = sum(tokens) / seconds if seconds > 0 else 0.0
    out: Speedups = {}
    for group in group_order(questions):
        members = [k for k, g in keys.items() if group in (OVERALL, g)]
        base = statistics.fmean(rate[BASELINE][k] for k in members)
        out[group] = {m: statistics.fmean(r[k] for k in members) / base for m, r in rate.items() if base > 0}
    return out


def redraw(runs: Runs, questions: Sequence[Question], reading: Callable[[Speedups], dict[Any, float]],
           draws: int = DRAWS, seed: int = 0, unpaired: Collection[str] = (),
           keep: Callable[[list[float]], float] = min) -> list[dict[Any, float]]:
    """``reading`` of the speedups of ``draws`` redraws: each turn's rounds drawn again with
    replacement, the same rounds for every method, each keeping its fastest run among them (or
    ``keep`` of them). A method in ``unpaired`` (or one with another number of runs) draws its
    own rounds."""
    if draws < 1:
        raise ValueError(f"draws={draws}: redraw at least once")
    rng = random.Random(seed)
    counts = {(k, t): len(turn) for by_q in runs.values() for k, (_, turns) in by_q.items()
              for t, turn in enumerate(turns)}
    seen = []
    for _ in range(draws):
        rounds = {kt: rng.choices(range(n), k=n) for kt, n in counts.items()}

        def fastest(m: str, k: str, t: int) -> float:
            turn = runs[m][k][1][t]
            picked = rounds[k, t] if m not in unpaired and len(turn) == counts[k, t] else \
                rng.choices(range(len(turn)), k=len(turn))
            return keep([turn[i] for i in picked])

        seen.append(reading(speedups(runs, questions, fastest)))
    return seen


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank.

    >>> quantile([3.0, 1.0, 2.0, 5.0, 4.0], 0.5), quantile([3.0, 1.0, 2.0], 0.975)
    (3.0, 3.0)
    """
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def spread(values: Sequence[float]) -> dict[str, float]:
    """The 95% interval (``low``, ``high``) and the ``median`` of some draws."""
    return {"low": quantile(values, 0.025), "median": statistics.median(values), "high": quantile(values, 0.975)}


def speedup_intervals(answers: Mapping[str, Mapping[str, Mapping[str, Any]]], questions: Sequence[Question],
                      draws: int = DRAWS, seed: int = 0) -> dict[str, Any] | None:
    """Each method's speedup (mean tok/s) per group over ``draws`` redraws of the rounds: the 95%
    interval and the median. None when no turn ran more than once (nothing to redraw)."""
    runs = runs_of({m: {question_key(q): by_q[question_key(q)] for q in questions} for m, by_q in answers.items()})
    if most_runs(runs) < 2 or BASELINE not in runs:
        return None
    seen = redraw(runs, questions, lambda s: {(g, m): v for g, rows in s.items() for m, v in rows.items()},
                  draws, seed)
    out: dict[str, Any] = {}
    for group, method in seen[0]:
        out.setdefault(group, {})[method] = spread([r[group, method] for r in seen])
    return {"draws": draws, "seed": seed, "groups": out}
