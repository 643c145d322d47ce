"""The cost model and the planner: which draft pays, with what k, on this machine.

The formulas live in :mod:`draftwise.cost.formulas` (E, speedup, break-even, best k); a machine
profile in :mod:`~draftwise.cost.profile` (measured by :mod:`~draftwise.cost.measure`); the
planner in :mod:`~draftwise.cost.plan`; adaptive k in :mod:`~draftwise.cost.adaptive`.
"""

from .formulas import (
    breakeven_acceptance,
    ceiling,
    effective_acceptance,
    expected_committed,
    expected_committed_by_position,
    optimal_k,
    predicted_speedup,
    speedup,
)

__all__ = [
    "breakeven_acceptance",
    "ceiling",
    "effective_acceptance",
    "expected_committed",
    "expected_committed_by_position",
    "optimal_k",
    "predicted_speedup",
    "speedup",
]
