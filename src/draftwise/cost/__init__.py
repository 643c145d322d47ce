"""The cost model: what speculation costs on this machine, analytic and measured.

- the analytic model: :mod:`.formulas` (E, speedup, break-even, best k), :mod:`.intervals`,
  :mod:`.breakeven`, :mod:`.goodput` (a batched step's goodput, and the k's that maximise it);
- measurement: :mod:`.profile` (a machine profile, measured by :mod:`.measure` and
  :mod:`.timing`), :mod:`.calibrate`, :mod:`.loop_fit`, :mod:`.batch_profile` and
  :mod:`.batch_measure` (the batched pass).
"""

from draftwise.cost.formulas import (
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
