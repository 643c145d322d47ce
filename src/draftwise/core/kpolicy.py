"""k policies: how many tokens the draft proposes each step.

The decode loop asks a :class:`KPolicy` for k before each step and tells it what happened after.
:class:`FixedK` proposes the same k every step. The adaptive policy behind ``--k auto``
(:class:`draftwise.policy.adaptive.AdaptiveK`) implements the same protocol from a measured
profile's data; it lives with the cost model, so the core loop knows nothing of profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from draftwise.errors import ConfigError

D = TypeVar("D")  # a draft (draftwise.core.draft.Draft, which sits above this module)


@runtime_checkable
class KPolicy(Protocol):
    """What the decode loop asks of a k policy: a k each step (a chain's length, or a tree's
    node budget), the part of the proposal to verify, then what happened."""

    k_max: int
    shadow: bool  # propose in the shadow of plain steps (for drafts that cost ~nothing)

    def choose(self, context_len: int) -> int: ...

    def trim(self, draft: D, context_len: int) -> D:
        """The part of ``draft`` to verify (a scored tree's best prefix; most policies: all)."""
        ...

    def observe(self, positions: int, accepted: int) -> None:
        """A verified step: ``accepted`` of ``positions`` draft positions (a chain's length, a
        tree's depth)."""
        ...

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None: ...


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

    def trim(self, draft: D, context_len: int) -> D:
        return draft

    def observe(self, positions: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        pass
