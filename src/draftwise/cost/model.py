"""The cost model of ../shared/DESIGN.md section 3, as plain functions.

- T(n): wall time of one target pass over n new tokens (T(1) is a plain decode step);
- D(k): time for the draft to propose k tokens;
- a_i: acceptance at draft position i given positions < i were accepted.

Expected committed tokens per target pass, E = 1 + sum_i prod_{j<=i} a_j; with one rate a,
E(a, k) = (1 - a^(k+1)) / (1 - a). Speedup S(k) = E * T(1) / (D(k) + T(k+1) + overhead).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError


def expected_committed(a: float, k: int) -> float:
    """E(a, k) = (1 - a^(k+1)) / (1 - a): committed tokens per pass with i.i.d. acceptance a.

    >>> round(expected_committed(0.8, 4), 2), round(expected_committed(0.5, 4), 2)
    (3.36, 1.94)
    >>> round(expected_committed(0.5, 8), 3)
    1.996
    """
    if not 0 <= a < 1:
        raise ConfigError(f"acceptance a={a} must be in [0, 1)")
    if k < 0:
        raise ConfigError(f"k={k} must be >= 0")
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


def predicted_speedup(
    expected: float, t1: float, verify_time: float, draft_time: float, overhead: float = 0.0
) -> float:
    """S = E * T(1) / (D(k) + T(k+1) + overhead)."""
    denom = draft_time + verify_time + overhead
    if t1 <= 0 or denom <= 0:
        raise ConfigError("times must be positive")
    return expected * t1 / denom


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k={k!r} must be an integer >= 1")


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
    _check_k(k)
    if step_cost_ratio < 0:
        raise ConfigError(f"step cost ratio {step_cost_ratio} must be >= 0")
    if step_cost_ratio <= 1:
        return 0.0
    if step_cost_ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0  # E(a, k) increases in a from 1 (a = 0) towards k + 1 (a -> 1)
    while hi - lo > tol:
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
    _check_k(k)
    if not 1 <= mean_committed <= k + 1:
        raise ConfigError(f"mean committed tokens {mean_committed} must be in [1, k + 1 = {k + 1}]")
    a = breakeven_acceptance(k, mean_committed)
    return 1.0 if a is None else a
