"""k policies: how many tokens the draft proposes each step.

The decode loop asks a :class:`KPolicy` for k before each step and tells it what happened after.
:class:`FixedK` proposes the same k every step. The adaptive policy behind ``--k auto``
(:class:`draftwise.cost.adaptive.AdaptiveK`) implements the same protocol from a measured
profile's data; it lives with the cost model, so the core loop knows nothing of profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .errors import ConfigError


@runtime_checkable
class KPolicy(Protocol):
    """What the decode loop asks of a k policy: a k each step, then what happened."""

    k_max: int
    shadow: bool  # propose in the shadow of plain steps (for drafts that cost ~nothing)

    def choose(self, context_len: int) -> int: ...

    def observe(self, proposed: int, accepted: int) -> None: ...

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None: ...

    # Optional: ``trim(draft, context_len) -> Draft``. A policy that has it is handed every
    # proposal that carries scores (a scored token tree) and returns the part to verify.


class FixedK:
    """Propose k tokens every step (the plain policy)."""

    shadow = False

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k={k!r} must be an integer >= 1 (the number of tokens a draft proposes)")
        self.k = k
        self.k_max = k

    def choose(self, context_len: int) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        pass
