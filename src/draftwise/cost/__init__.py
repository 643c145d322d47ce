"""The cost model: expected tokens per target pass, predicted speedup, break-even acceptance."""

from .model import (
    breakeven_acceptance,
    effective_acceptance,
    expected_committed,
    expected_committed_by_position,
    predicted_speedup,
)

__all__ = [
    "breakeven_acceptance",
    "effective_acceptance",
    "expected_committed",
    "expected_committed_by_position",
    "predicted_speedup",
]
