"""A workload to simulate: its categories, each draft's outcome at each k there, and the requests a
load sends (:class:`Workload`), built from a plan or from explicit rates by
:mod:`draftwise.capacity.simulate`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.cost.goodput import NONE, PLAIN, Choice, Outcome, StepCost
from draftwise.errors import ConfigError

SOLO = -1  # a plan's k "auto": the k that is best for the sequence alone (solo_k), at every N


@dataclass
class Kind:
    """A category of the workload: per draft, its :class:`Outcome` at each k (k = 0 is plain and
    implicit); the draft the ``goodput`` policy gives it (``none``: always plain) and the plan's
    fixed (draft, k) for it."""

    name: str
    options: dict[str, dict[int, Outcome]]
    draft: str = NONE
    plan: tuple[str, int] = (NONE, 0)

    def outcome(self, draft: str, k: int) -> Outcome:
        if k == 0 or draft == NONE:
            return PLAIN
        return self.options[draft][k]


Request = tuple[str, int, int]  # (category, prompt tokens with the history, answer tokens)


@dataclass
class Workload:
    """Categories and what a load sends: ``units``, each a conversation of one or more
    :data:`Request` s sent one after the other (a question's turns), taken in turn by the
    simulated clients."""

    kinds: dict[str, Kind]
    drafts: list[str]
    ks: list[int]
    units: list[list[Request]]
    source: str = ""

    @property
    def requests(self) -> list[Request]:
        """Every request of every unit, in order."""
        return [r for unit in self.units for r in unit]

    def check(self) -> None:
        if not self.kinds or not self.units or not all(self.units):
            raise ConfigError("the workload has no categories or no requests to simulate")
        missing = {c for c, _, _ in self.requests} - set(self.kinds)
        if missing:
            raise ConfigError(f"the workload's requests name categories it has no acceptance for: {sorted(missing)}")


def choice_for(kind: Kind, draft: str, cost: StepCost, context: float, ks: Sequence[int] | None = None) -> Choice:
    """A sequence of ``kind`` drafting with ``draft``: its outcomes at k = 0 and at each k in
    ``ks`` (default: every k its draft has), with their seconds beyond the pass."""
    outcomes: dict[int, Outcome] = {0: PLAIN}
    if draft != NONE:
        have = kind.options.get(draft, {})
        for k in (ks if ks is not None else sorted(have)):
            if k in have:
                outcomes[k] = have[k]
    extra = {k: cost.draft(draft, k) + cost.overhead(k, context) for k in outcomes}
    return Choice(outcomes, extra)
