"""The goodput policy at batch: each running sequence's k, every step, from the batch as it is
(:class:`BatchGoodput`), and the glue that would let the server's decode loops follow it
(:class:`BatchKCoordinator`, :class:`BatchSlotPolicy`). The model it optimises is
:mod:`draftwise.cost.goodput`'s; the server does not call it yet (docs/planner.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .batch_profile import BatchProfile
from .goodput import NONE, PLAIN, Choice, StepCost, choose_ks, rates_outcomes
from .profile import Profile


@dataclass(frozen=True)
class SeqState:
    """What the server knows of one decoding sequence as a step starts: its draft, its current
    per-position acceptance estimate (:meth:`~draftwise.cost.adaptive.AdaptiveK.rates`) and
    its context length."""

    draft: str
    rates: Sequence[float]
    context: int


class BatchGoodput:
    """``--k auto`` at batch: given the batch as it is, each decoding sequence's k (0: plain).

    One object per server; each step, ``choose(states, prefill_rows=...)`` returns one k per
    state, by :func:`choose_ks` on E_i(k) = 1 + sum_{i<k} prod_{j<=i} a_j (the sequence's own
    online rates) and the measured costs. ``last`` keeps the k's it chose (for ``/metrics``).

    >>> # see tests/test_goodput.py: with a pass that grows steeply in rows, k falls to 0 at batch
    """

    def __init__(self, batch: BatchProfile, profile: Profile | None = None, *, k_max: int = 8,
                 rows_budget: float | None = None) -> None:
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ConfigError(f"k_max={k_max!r} must be an integer >= 1")
        top = batch.rows[-1] - 1
        if profile is not None:
            top = min(top, profile.max_n - 1)
        self.k_max = min(k_max, top)
        self.cost = StepCost(batch, profile)
        self.rows_budget = rows_budget
        self.last: list[int] = []

    def choose(self, states: Sequence[SeqState], *, prefill_rows: int = 0, prefilling: int = 0) -> list[int]:
        """One k per state; ``prefill_rows`` rows of ``prefilling`` other sequences (prompt chunks)
        share the pass."""
        if not states:
            self.last = []
            return []
        if len(states) + prefilling > self.cost.batch.max_batch:
            raise ConfigError(f"{len(states) + prefilling} sequences: the batch profile covers up to "
                              f"{self.cost.batch.max_batch}; measure it with larger batches")
        context = sum(s.context for s in states) / len(states)
        choices = []
        for s in states:
            outcomes = {0: PLAIN}
            if s.draft != NONE and s.rates:
                outcomes.update(rates_outcomes(s.rates, self.k_max))
            extra = {k: self.cost.draft(s.draft, k) + self.cost.overhead(k, s.context) for k in outcomes}
            choices.append(Choice(outcomes, extra))
        self.last = choose_ks(choices, self.cost, context=context, fixed_rows=prefill_rows,
                              fixed_batch=prefilling, rows_budget=self.rows_budget)
        return list(self.last)


class BatchKCoordinator:
    """The server side of ``--k auto`` at batch: one per engine, handing each request a
    :class:`BatchSlotPolicy` (the decode loop's :class:`~draftwise.kpolicy.KPolicy`).

    The engine resumes its generations one after another before each pass, and each asks its
    policy for k. The first to ask in a new step (``epoch()`` changed: the engine's pass count)
    has the k's of every sequence that asked in the step before chosen together by
    :class:`BatchGoodput`, from their own acceptance estimates and last context lengths; a
    sequence that was not among them (it just finished its prompt) has them chosen again with it.
    A sequence that did not ask in the last step (it ended, or is prefilling) drops out.
    ``prefill()`` -> (rows, sequences) of prompt chunks in the coming pass, when the server knows.
    """

    def __init__(self, goodput: BatchGoodput, *, epoch: Callable[[], int],
                 prefill: Callable[[], tuple[int, int]] | None = None) -> None:
        self.goodput = goodput
        self.epoch = epoch
        self.prefill = prefill or (lambda: (0, 0))
        self._members: dict[int, tuple[BatchSlotPolicy, int]] = {}  # id -> (policy, last epoch it asked)
        self._ks: dict[int, int] = {}
        self._epoch: int | None = None

    def policy(self, adaptive: Any, draft: str) -> BatchSlotPolicy:
        """A request's policy: ``adaptive`` (its :class:`~draftwise.cost.adaptive.AdaptiveK`)
        keeps its acceptance estimate, shadow proposals and tree trimming."""
        return BatchSlotPolicy(self, adaptive, draft)

    def k_for(self, member: BatchSlotPolicy) -> int:
        now = self.epoch()
        if now != self._epoch:
            self._members = {i: (m, e) for i, (m, e) in self._members.items() if e >= (self._epoch or 0)}
            self._epoch, self._ks = now, {}
        self._members[id(member)] = (member, now)
        if id(member) not in self._ks:
            live = [m for m, _ in self._members.values()]
            rows, seqs = self.prefill()
            ks = self.goodput.choose([m.state() for m in live], prefill_rows=rows, prefilling=seqs)
            self._ks = {id(m): k for m, k in zip(live, ks)}
        return self._ks[id(member)]


class BatchSlotPolicy:
    """One request's k policy under a :class:`BatchKCoordinator` (the KPolicy protocol): k from
    the batch's goodput, everything else from its own adaptive policy."""

    def __init__(self, coordinator: BatchKCoordinator, adaptive: Any, draft: str) -> None:
        self.coordinator, self.adaptive, self.draft = coordinator, adaptive, draft
        self.k_max = adaptive.k_max
        self.shadow = adaptive.shadow
        self.context = 0

    def state(self) -> SeqState:
        return SeqState(self.draft, self.adaptive.rates(), self.context)

    def choose(self, context_len: int) -> int:
        self.context = context_len
        if self.adaptive.trees:  # a scored tree is trimmed by its own policy once proposed
            return self.adaptive.choose(context_len)
        return min(self.coordinator.k_for(self), self.k_max)

    def trim(self, draft: Any, context_len: int) -> Any:
        return self.adaptive.trim(draft, context_len)

    def observe(self, positions: int, accepted: int) -> None:
        self.adaptive.observe(positions, accepted)

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        self.adaptive.observe_shadow(proposal, committed)
