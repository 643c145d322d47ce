"""The cost model of speculative decoding, as plain functions: every E, speedup, break-even
acceptance and best k in draftwise is computed here (the calculator, the planner, adaptive k and
calibrate-self all call these).

- T(n): wall time of one target pass over n new tokens (T(1) is a plain decode step);
- D(k): time for the draft to propose k tokens;
- a_i: acceptance at draft position i given positions < i were accepted.

Expected committed tokens per target pass, E = 1 + sum_i prod_{j<=i} a_j; with one rate a,
E(a, k) = (1 - a^(k+1)) / (1 - a), which approaches the ceiling 1 / (1 - a) as k grows.

One speculative step costs, in plain steps, R(k) = (D(k) + T(k+1) + overhead) / T(1) = k c + v(k),
where c = D(k) / (k T(1)) is the draft's cost per proposed token and v(k) = T(k+1) / T(1). The
predicted speedup is S = E / R; the break-even acceptance a*(k) solves E(a, k) = R(k).
Leviathan et al. (2023) is the case v = 1: S = (1 - a^(k+1)) / ((1 - a)(k c + 1)).

>>> round(speedup(0.8, 4, step_cost_ratio(4, c=0.1)), 3)   # 3.36 tokens for 1.4 steps
2.401
>>> best = optimal_k(0.8, lambda k: step_cost_ratio(k, c=0.1), k_max=16); best.k, round(best.speedup, 3)
(6, 2.47)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from draftwise.errors import ConfigError

CostRatio = Callable[[int], float]  # k -> R(k), one speculative step in plain steps


class KChoice(NamedTuple):
    """The best number of proposals: ``k=None`` means "no speculation" (speedup 1.0)."""

    k: int | None
    speedup: float


def check_acceptance(a: float) -> None:
    if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0 <= a < 1:
        raise ConfigError(f"acceptance a={a!r} must be in [0, 1) (1 would mean every token accepted)")


def check_k(k: int, low: int = 1) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < low:
        raise ConfigError(f"k={k!r} must be an integer >= {low} (the number of proposed tokens)")


# -- expected tokens per target pass -----------------------------------------------------
def expected_committed(a: float, k: int) -> float:
    """E(a, k) = (1 - a^(k+1)) / (1 - a): committed tokens per pass with i.i.d. acceptance a.

    >>> round(expected_committed(0.8, 4), 2), round(expected_committed(0.5, 4), 2)
    (3.36, 1.94)
    >>> round(expected_committed(0.5, 8), 3)
    1.996
    """
    check_acceptance(a)
    check_k(k, low=0)
    return (1 - a ** (k + 1)) / (1 - a)


def expected_committed_by_position(rates: Sequence[float], k: int | None = None) -> float:
    """E = 1 + sum_{i<k} prod_{j<=i} a_j, from conditional per-position rates a_0, a_1, ...

    Positions past the measured ones reuse the last measured rate.

    >>> expected_committed_by_position([0.5, 0.5, 0.5, 0.5])
    1.9375
    """
    if k is None:
        k = len(rates)
    if k and not rates:
        raise ConfigError("need at least one per-position acceptance rate")
    total, run = 1.0, 1.0
    for i in range(k):
        run *= rates[min(i, len(rates) - 1)]
        total += run
    return total


def ceiling(a: float) -> float:
    """1 / (1 - a): the most tokens a step can commit at acceptance a, however large k.

    >>> round(ceiling(0.8), 9), ceiling(0.5)
    (5.0, 2.0)
    """
    check_acceptance(a)
    return 1 / (1 - a)


# -- speedup -----------------------------------------------------------------------------
def step_cost_ratio(k: int, c: float, v: float = 1.0) -> float:
    """R(k) = k c + v: one speculative step in plain decoding steps.

    >>> step_cost_ratio(4, 0.1), step_cost_ratio(4, 0.1, v=1.25)
    (1.4, 1.65)
    """
    check_k(k)
    if not (math.isfinite(c) and c >= 0) or not (math.isfinite(v) and v > 0):
        raise ConfigError(f"draft cost c={c} must be a finite number >= 0 and verification cost v={v} > 0")
    return k * c + v


def speedup(a: float, k: int, step_cost_ratio: float) -> float:
    """S = E(a, k) / R(k): predicted speedup over plain decoding.

    >>> round(speedup(0.8, 4, 1.0), 2), round(speedup(0.5, 4, 1.0), 2), round(speedup(0.5, 8, 1.0), 3)
    (3.36, 1.94, 1.996)
    """
    check_acceptance(a)
    check_k(k)
    if not step_cost_ratio > 0:
        raise ConfigError(f"step cost ratio R={step_cost_ratio} must be > 0")
    return expected_committed(a, k) / step_cost_ratio


def predicted_speedup(
    expected: float, t1: float, verify_time: float, draft_time: float, overhead: float = 0.0
) -> float:
    """S = E T(1) / (D(k) + T(k+1) + overhead), from times in seconds: E over R(k).

    >>> predicted_speedup(3.0, 0.01, 0.012, 0.003)
    2.0
    """
    denom = draft_time + verify_time + overhead
    if not t1 > 0 or not denom > 0:
        raise ConfigError(f"times must be positive (T(1)={t1}, step={denom})")
    return expected * t1 / denom


def leviathan_speedup(a: float, k: int, c: float) -> float:
    """Leviathan et al.'s improvement factor (1 - a^(k+1)) / ((1 - a)(k c + 1)).

    The special case v(k) = 1 of :func:`speedup`, written out independently so tests can
    compare the two.

    >>> round(leviathan_speedup(0.8, 4, 0.1), 4)
    2.4011
    """
    check_acceptance(a)
    check_k(k)
    if not (math.isfinite(c) and c >= 0):
        raise ConfigError(f"draft cost c={c} must be a finite number >= 0")
    return (1 - a ** (k + 1)) / ((1 - a) * (k * c + 1))


def tokens_per_second(expected: float, step_seconds: float) -> float:
    """Committed tokens per second of a step that commits ``expected`` tokens on average."""
    if not step_seconds > 0:
        raise ConfigError(f"a step must take a positive time, got {step_seconds} s")
    return expected / step_seconds


def mean_rate_speedup(method_rates: Sequence[float], plain_rates: Sequence[float]) -> float:
    """Spec-Bench's speedup over a set of prompts: mean tokens/s of the method over mean
    tokens/s of plain decoding (not the mean of per-prompt ratios).

    >>> mean_rate_speedup([30.0, 10.0], [10.0, 10.0])
    2.0
    """
    if not method_rates or len(method_rates) != len(plain_rates):
        raise ConfigError("a speedup needs one method and one plain rate per prompt, at least one")
    return statistics.mean(method_rates) / statistics.mean(plain_rates)


# -- break-even and the best k -----------------------------------------------------------
def breakeven_acceptance(k: int, step_cost_ratio: float, *, tol: float = 1e-10) -> float | None:
    """The i.i.d. acceptance a at which speculation with k proposals just breaks even.

    ``step_cost_ratio`` R = (D(k) + T(k+1) + overhead) / (T(1) + plain overhead): what one
    speculative step costs in plain decoding steps. Break-even is E(a, k) = R. Returns 0.0
    when R <= 1 (speculation pays at any acceptance) and None when R >= k + 1 (it never pays:
    even a = 1 commits only k + 1 tokens a step).

    Leviathan's case, v = 1 and D(k) = k c T(1), is R = k c + 1:

    >>> round(breakeven_acceptance(4, 4 * 0.1 + 1), 4)   # c = 0.1
    0.2871
    >>> breakeven_acceptance(4, 1.0), breakeven_acceptance(2, 3.0)
    (0.0, None)
    """
    check_k(k)
    if math.isnan(step_cost_ratio) or step_cost_ratio < 0:
        raise ConfigError(f"step cost ratio {step_cost_ratio} must be >= 0")
    if step_cost_ratio <= 1:
        return 0.0
    if step_cost_ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0  # E(a, k) increases in a from 1 (a = 0) towards k + 1 (a -> 1)
    # ``tol`` is relative to the root: an absolute one would stop at 1e-10 when R is so close to
    # 1 that the root itself is ~1e-11 (a draft that is nearly free), and return it to no digit
    for _ in range(2_000):  # 2,000 halvings reach below the smallest float: the loop always ends
        if hi - lo <= tol * hi:
            break
        mid = (lo + hi) / 2
        if expected_committed(mid, k) < step_cost_ratio:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def effective_acceptance(mean_committed: float, k: int) -> float:
    """The i.i.d. rate a with E(a, k) = ``mean_committed``: a measured #MAT as one acceptance.

    >>> round(effective_acceptance(expected_committed(0.7, 4), 4), 6)
    0.7
    """
    check_k(k)
    if not 1 <= mean_committed <= k + 1:
        raise ConfigError(f"mean committed tokens {mean_committed} must be in [1, k + 1 = {k + 1}]")
    a = breakeven_acceptance(k, mean_committed)
    return 1.0 if a is None else a


def optimal_k(
    a: float, cost_ratio: CostRatio, k_max: int = 16, *, ks: Iterable[int] | None = None
) -> KChoice:
    """The k in ``ks`` (default 1..k_max) that maximises S(a, k); ties go to the smaller k.

    Returns ``KChoice(None, 1.0)`` when no k gives S > 1: plain decoding is faster.

    >>> optimal_k(0.5, lambda k: step_cost_ratio(k, 0.15), k_max=8).k
    2
    >>> optimal_k(0.3, lambda k: step_cost_ratio(k, 0.6), k_max=8)
    KChoice(k=None, speedup=1.0)
    """
    candidates = list(ks) if ks is not None else list(range(1, k_max + 1))
    if not candidates:
        raise ConfigError("optimal_k needs at least one k")
    best = KChoice(None, 1.0)
    for k in candidates:
        s = speedup(a, k, cost_ratio(k))
        if s > best.speedup:
            best = KChoice(k, s)
    return best


def min_breakeven(cost_ratio: CostRatio, ks: Iterable[int]) -> tuple[float, int] | None:
    """The lowest a*(k) over ``ks`` and its k: below that acceptance no k pays. None: never.

    >>> a, k = min_breakeven(lambda k: step_cost_ratio(k, 0.15), range(1, 9)); (round(a, 6), k)
    (0.15, 1)
    """
    best: tuple[float, int] | None = None
    for k in ks:
        a = breakeven_acceptance(k, cost_ratio(k))
        if a is not None and (best is None or a < best[0]):
            best = (a, k)
    return best
