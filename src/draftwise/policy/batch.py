"""The goodput policy at batch: each running sequence's k, every step, from the batch as it is
(:class:`BatchGoodput`), the engine's scheduler that asks it (:class:`BatchKCoordinator`, one per
engine) and each request's k policy under it (:class:`BatchSlotPolicy`). The
model it optimises is :mod:`draftwise.cost.goodput`'s; ``serve --k auto --max-batch N`` (N > 1)
consults it each step (:mod:`draftwise.server.speculation`).

How a step goes. The engine resumes its generations before its pass; each that decodes under
this policy asks for k and waits. Once all wait, the engine's scheduler has every waiting
sequence's k chosen together by :func:`~draftwise.cost.goodput.choose_ks`, from each one's own acceptance estimate
(its :class:`~draftwise.policy.adaptive.AdaptiveK`'s online rates, which start from the prior) and
the measured batch profile. A chain proposes that k. A scored tree (suffix decoding) is proposed
whole, and once its scores are known it keeps the prefix that is its best response to the
others' k's (:meth:`BatchGoodput.respond`), never more than its own single-stream trim would.

At N = 1 (one decoding sequence and nothing else in the pass) the request's own adaptive policy
decides, exactly as ``--k auto`` does alone: the batch has nothing to share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.core.engine import PassRows
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.formulas import expected_committed_by_position
from draftwise.cost.goodput import (
    NONE,
    PLAIN,
    Choice,
    Outcome,
    StepCost,
    choose_ks,
    default_rows_budget,
    rates_outcomes,
)
from draftwise.cost.profile import Profile
from draftwise.errors import ConfigError
from draftwise.policy.outside_pass import OutsidePass

CALIBRATION_PRIOR = 8.0  # draft tokens, expected and accepted alike, before a draft's first step at batch
CALIBRATION_DECAY = 0.995  # a step: about the last 200 steps of a draft count


@dataclass(frozen=True)
class SeqState:
    """What the server knows of one decoding sequence as a step starts: its draft, its current
    per-position acceptance estimate (:meth:`~draftwise.policy.adaptive.AdaptiveK.rates`) and
    its context length. ``outcomes``, where given, are its expected tokens and rows at each k
    instead of the rates' (a simulated workload's, :mod:`draftwise.capacity.simulate`)."""

    draft: str
    rates: Sequence[float]
    context: float
    outcomes: Mapping[int, Outcome] | None = None


@dataclass
class _Step:
    """The last choice, kept so a tree can answer it: the pass's price of R rows (``curve``,
    less a plain decode-only pass's, ``base``), and each sequence's tokens, rows, seconds."""

    curve: Callable[[float], float]
    base: float
    fixed_rows: float
    budget: float
    tokens: list[float]
    rows: list[float]
    extra: list[float]


class BatchGoodput:
    """``--k auto`` at batch: given the batch as it is, each decoding sequence's k (0: plain).

    One object per server; each step, ``choose(states, prefill_rows=...)`` returns one k per
    state, by :func:`choose_ks` on E_i(k) = 1 + sum_{i<k} prod_{j<=i} a_j (the sequence's own
    online rates) and the measured costs. ``last`` keeps the k's it chose (for ``/metrics``).

    >>> # see tests/test_goodput.py: with a pass that grows steeply in rows, k falls to 0 at batch
    """

    def __init__(self, batch: BatchProfile, profile: Profile | None = None, *, k_max: int = 8,
                 rows_budget: float | None = None, cost: StepCost | None = None) -> None:
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
            raise ConfigError(f"k_max={k_max!r} must be an integer >= 1")
        top = batch.rows[-1] - 1
        if profile is not None:
            top = min(top, profile.max_n - 1)
        self.k_max = min(k_max, top)
        self.cost = cost if cost is not None else StepCost(batch, profile)
        self.rows_budget = rows_budget
        self.last: list[int] = []
        self._step: _Step | None = None
        self._drafts: list[str] = []
        #: set by :meth:`measure_outside`: a sequence's seconds outside the pass, as served
        self.outside: OutsidePass | None = None
        #: per draft, decayed (predicted, accepted) draft tokens of its batch steps; None: not calibrating
        self._calibration: dict[str, list[float]] | None = None
        #: a pass of more sequences than this steps plain (:mod:`draftwise.policy.batch_limit`); None: no limit
        self.speculate_up_to: int | None = None
        self.plain = False  # the last choice was plain because the pass held more than that

    def calibrate(self) -> None:
        """Scale each draft's expected accepted tokens by what its steps at batch accepted against
        what this policy expected of them (:meth:`record`). A step's k's go to the proposals
        whose estimates are highest, so the ones it picks can be high by chance more often than
        low, and a draft then accepts less than was expected of it (docs/benchmarks.md, "Goodput
        at N concurrent requests")."""
        if self._calibration is None:
            self._calibration = {}

    def factor(self, draft: str) -> float:
        """Accepted over expected draft tokens of ``draft`` at batch, with ``CALIBRATION_PRIOR``
        tokens of each at 1:1 (so 1.0 before any step, and when not calibrating)."""
        if self._calibration is None:
            return 1.0
        expected, accepted = self._calibration.get(draft, (0.0, 0.0))
        return (accepted + CALIBRATION_PRIOR) / (expected + CALIBRATION_PRIOR)

    def factors(self) -> dict[str, float]:
        """:meth:`factor` of every draft that has taken a step at batch (for the log)."""
        return {d: self.factor(d) for d in (self._calibration or {})}

    def record(self, draft: str, expected: float, accepted: int) -> None:
        """A step at batch: ``draft`` was expected (uncalibrated) to add ``expected`` tokens and
        ``accepted`` were; older steps fade by ``CALIBRATION_DECAY`` a step."""
        if self._calibration is None or expected <= 0:
            return
        sums = self._calibration.setdefault(draft, [0.0, 0.0])
        sums[0] = sums[0] * CALIBRATION_DECAY + expected
        sums[1] = sums[1] * CALIBRATION_DECAY + accepted

    def scaled(self, draft: str, tokens: float) -> float:
        """Committed tokens of a step expected to commit ``tokens`` (uncalibrated), calibrated."""
        return 1.0 + self.factor(draft) * (tokens - 1.0)

    def measure_outside(self) -> OutsidePass:
        """Price each sequence's work outside the pass by what the served steps measure
        (:meth:`observe_step`) instead of the profile's one overhead; returns the estimator."""
        if self.outside is None:
            prior = self.cost.profile.overhead(1) if self.cost.profile is not None else 0.0
            self.outside = OutsidePass(prior)
            self.cost.per_sequence = self.outside.estimate()
        return self.outside

    def observe_step(self, seconds: float, *, plain: int, speculating: int) -> None:
        """A served step spent ``seconds`` outside its pass on the last pass's ``plain`` and
        ``speculating`` decoding sequences (a no-op unless :meth:`measure_outside` ran)."""
        if self.outside is None:
            return
        known = sum(self.cost.draft(d, k) for d, k in zip(self._drafts, self.last))
        self.outside.observe(seconds, plain=plain, speculating=speculating, known=known)
        self.cost.per_sequence = self.outside.estimate()

    def choose(self, states: Sequence[SeqState], *, prefill_rows: float = 0, prefilling: int = 0,
               scenario: str = "point") -> list[int]:
        """One k per state; ``prefill_rows`` (priced) rows of ``prefilling`` other sequences (prompt chunks,
        plain requests) share the pass; ``scenario``: each outcome's point or interval end."""
        if not states:
            self.last, self._step, self._drafts = [], None, []
            return []
        n = len(states)
        if n + prefilling > self.cost.batch.max_batch:
            raise ConfigError(f"{n + prefilling} sequences: the batch profile covers up to "
                              f"{self.cost.batch.max_batch}; measure it with larger batches")
        context = sum(s.context for s in states) / n
        self.plain = self.speculate_up_to is not None and n + prefilling > self.speculate_up_to
        choices = []
        for s in states:
            outcomes = {0: PLAIN}
            if s.outcomes is not None and s.draft != NONE and not self.plain:
                outcomes.update({k: o for k, o in s.outcomes.items() if 0 < k <= self.k_max})
            elif s.draft != NONE and s.rates and not self.plain:  # past the limit only k = 0 is priced
                outcomes.update({k: Outcome(self.scaled(s.draft, o.tokens), o.rows, self.scaled(s.draft, o.low),
                                            self.scaled(s.draft, o.high))
                                 for k, o in rates_outcomes(s.rates, self.k_max).items()})
            extra = {k: self.cost.draft(s.draft, k) + self.cost.overhead(k, s.context) for k in outcomes}
            choices.append(Choice(outcomes, extra))
        self._drafts = [s.draft for s in states]
        self.last = [0] * n if self.plain else choose_ks(choices, self.cost, context=context, fixed_rows=prefill_rows,
                                                         fixed_batch=prefilling, rows_budget=self.rows_budget,
                                                         scenario=scenario)
        batch = self.cost.batch
        curve = batch.rows_curve(n + prefilling, context)  # the terms of choose_ks's objective
        picked = [c.outcomes[k] for c, k in zip(choices, self.last)]
        base = batch.rows_curve(n, context)(n) - curve(prefill_rows + n) + self.cost.step_overhead
        self._step = _Step(
            curve, base, float(prefill_rows),
            self.rows_budget if self.rows_budget is not None else default_rows_budget(batch, n, prefill_rows),
            [o.tokens for o in picked], [o.rows for o in picked], [c.extra[k] for c, k in zip(choices, self.last)])
        return list(self.last)

    def respond(self, index: int, tokens: Sequence[float], context: float) -> int:
        """How many nodes sequence ``index`` of the last :meth:`choose` should keep of a scored
        tree it has proposed, the others' k's as chosen: ``tokens[n]`` is its expected committed
        tokens with its best n nodes (``tokens[0]`` = 1, a plain step). The n that maximises the
        step's goodput, by the same objective as :func:`choose_ks`; recorded, so a tree that
        answers after it sees this one."""
        step = self._step
        if step is None or not 0 <= index < len(step.tokens) or not tokens:
            raise ConfigError("respond() answers the last choose(), for one of its sequences")
        if self.plain:
            self.settle(index, 0, tokens[0], context)
            return 0
        tau = self.cost.token_overhead
        t0 = sum(step.tokens) - step.tokens[index]
        r0 = step.fixed_rows + sum(step.rows) - step.rows[index]
        x0 = sum(step.extra) - step.extra[index]
        best_n, best = 0, -1.0
        for n, e in enumerate(tokens):
            if r0 + n + 1 > step.budget + 1e-9:
                break
            t, x = t0 + e, x0 + self.cost.overhead(n, context)
            value = t / (step.base + step.curve(r0 + n + 1) + x + tau * t)
            if value > best + 1e-12 * abs(best):
                best_n, best = n, value
        self.settle(index, best_n, tokens[best_n], context)
        return best_n

    def settle(self, index: int, n: int, tokens: float, context: float, draft: str = NONE) -> None:
        """Sequence ``index`` verifies ``n`` rows of proposal this step, for ``tokens`` expected
        (``draft``: whose cost to count; a tree's was paid before it was trimmed)."""
        step = self._step
        if step is not None and 0 <= index < len(step.tokens):
            step.tokens[index], step.rows[index] = tokens, n + 1.0
            step.extra[index] = self.cost.draft(draft, n) + self.cost.overhead(n, context)
            self.last[index] = n


class BatchKCoordinator:
    """The engine's scheduler under ``--k auto`` at batch (:class:`draftwise.core.engine.Scheduler`):
    one per engine, handing each request a :class:`BatchSlotPolicy` (the decode loop's
    :class:`~draftwise.core.kpolicy.KPolicy`).

    A request's policy, asked for k, waits (``wait(member)``: the engine's
    :meth:`~draftwise.core.engine.Engine.wait_for_schedule`). Once every sequence of the step
    waits, the engine calls :meth:`schedule` with the waiting policies and the rows the others
    bring (prompt chunks, plain and fixed-k requests): every k is chosen together by
    :class:`BatchGoodput`, and each policy learns its k and its place in the choice (for the
    tree's :meth:`respond`). Only the sequences that wait this step are chosen for: one that
    ended simply does not ask. ``price(others)``: the others' rows as the batch profile prices
    them (:meth:`~draftwise.cost.batch_profile.BatchProfile.priced_rows`: a prompt's at its
    share). ``on_k(draft, k)`` hears every k a sequence goes with (``/metrics``).
    """

    def __init__(self, goodput: BatchGoodput, *, wait: Callable[[BatchSlotPolicy], None],
                 price: Callable[[PassRows], float] | None = None,
                 on_k: Callable[[str, int], None] | None = None, size: Callable[[], int] | None = None) -> None:
        self.goodput = goodput
        self.wait = wait
        self.size = size
        self.price = price or (lambda others: float(others.decode_rows + others.prompt_rows))
        self.on_k = on_k or (lambda draft, k: None)
        self.alone = False  # the last choice had one sequence and nothing else in the pass

    def past_limit(self) -> bool:
        """Whether the batch (``size()``: the engine's running generations) holds more sequences
        than the speculating limit: then every sequence steps plain for real, without waiting on
        the schedule, drafting or shadowing (a plain batch pays none of it)."""
        limit = self.goodput.speculate_up_to
        return limit is not None and self.size is not None and self.size() > limit

    def policy(self, adaptive: Any, draft: str) -> BatchSlotPolicy:
        """A request's policy: ``adaptive`` (its :class:`~draftwise.policy.adaptive.AdaptiveK`)
        keeps its acceptance estimate, shadow proposals and tree trimming."""
        return BatchSlotPolicy(self, adaptive, draft)

    def schedule(self, members: Sequence[BatchSlotPolicy], others: PassRows) -> None:
        """Choose every member's k for the coming pass, together, beside ``others``."""
        self.goodput.choose([m.state() for m in members], prefill_rows=self.price(others), prefilling=others.sequences)
        self.alone = len(members) == 1 and not others.sequences
        for i, member in enumerate(members):
            member.index, member.chosen = i, self.goodput.last[i]

    def respond(self, member: BatchSlotPolicy, tokens: Sequence[float], context: float) -> int:
        return self.goodput.respond(member.index, tokens, context)

    def settle(self, member: BatchSlotPolicy, n: int, tokens: float, context: float, draft: str = NONE) -> None:
        self.goodput.settle(member.index, n, tokens, context, draft)

    def observe_step(self, seconds: float, *, plain: int, speculating: int) -> None:
        """A served step's seconds outside its pass, after a pass of ``plain`` and ``speculating``
        decoding sequences (:meth:`BatchGoodput.observe_step`); past the limit no k was chosen,
        so no draft is counted."""
        if self.past_limit():
            self.goodput.last, self.goodput._drafts = [], []
        self.goodput.observe_step(seconds, plain=plain, speculating=speculating)


class BatchSlotPolicy:
    """One request's k policy under a :class:`BatchKCoordinator` (the KPolicy protocol): k from
    the batch's goodput, everything else (the acceptance estimate, shadow proposals, probes of
    a costly draft, the tree's calibration) from its own adaptive policy. Alone in the pass, its
    adaptive policy chooses, exactly as ``--k auto`` does for one request."""

    def __init__(self, coordinator: BatchKCoordinator, adaptive: Any, draft: str) -> None:
        self.coordinator, self.adaptive, self.draft = coordinator, adaptive, draft
        self.k_max = adaptive.k_max
        self.context = 0
        self.index, self.chosen = 0, 0  # its place in the step's choice, and the k chosen for it
        self._plain_run = 0
        #: the step's expected draft tokens (uncalibrated): a chain's by depth, or a tree's one value
        self._pending: float | tuple[Sequence[float], int] | None = None

    @property
    def shadow(self) -> bool:
        """Whether a plain step drafts one token to check its estimate: as its own policy says,
        but not in a pass past the speculating limit, which steps plain whatever it estimates
        (the decode loop asks after :meth:`choose`; a suffix draft's shadow also extends its
        tries, a cost a plain batch does not pay)."""
        if self.coordinator.past_limit():
            return False
        return self.adaptive.shadow and not (self.coordinator.goodput.plain and not self.coordinator.alone)

    def state(self) -> SeqState:
        return SeqState(self.draft, self.adaptive.rates(), self.context)

    def choose(self, context_len: int) -> int:
        self.context = context_len
        self._pending = None
        if self.coordinator.past_limit():  # a plain step, as plain batching takes it
            self.coordinator.on_k(self.draft, 0)
            return 0
        self.coordinator.wait(self)  # the engine schedules every waiting sequence together
        k = self.chosen
        plain = self.coordinator.goodput.plain and not self.coordinator.alone  # past the speculating limit
        if self.adaptive.trees and not plain:  # proposed whole; trim() keeps what the batch pays for
            return self.adaptive.choose(context_len)
        if self.coordinator.alone:
            k = self.adaptive.choose(context_len)
        else:
            chosen, k = k, 0 if plain else self._probe(min(k, self.k_max))
            if k != chosen:  # a probe, or past its own k_max: later sequences price what it feeds
                self.coordinator.settle(self, k, self._expected(k), context_len, self.draft)
            rates = self.adaptive.rates()
            if k and rates:
                self._pending = (rates, k)  # priced at the depth it proposes, once observed
        self.coordinator.on_k(self.draft, k)
        return k

    def _probe(self, k: int) -> int:
        """A costly draft (no shadow proposals) that the batch keeps plain proposes one token
        every ``probe_every`` steps, as :class:`~draftwise.policy.adaptive.AdaptiveK` does alone,
        so its estimate stays alive for when the batch thins out."""
        if k or self.adaptive.shadow:
            self._plain_run = 0
            return k
        self._plain_run += 1
        if self._plain_run < self.adaptive.probe_every:
            return 0
        self._plain_run = 0
        return 1

    def _expected(self, k: int) -> float:
        rates = self.adaptive.rates()
        return self.coordinator.goodput.scaled(self.draft, rates_outcomes(rates, k)[k].tokens) if k and rates else 1.0

    def trim(self, draft: Any, context_len: int) -> Any:
        """A scored tree: the batch's best response (:meth:`BatchGoodput.respond`) caps the
        nodes, then its own trim keeps at most that many (and keeps its calibration)."""
        if not self.adaptive.trees or draft.scores is None or not draft.tokens:
            return self.adaptive.trim(draft, context_len)
        if self.coordinator.alone:
            kept = self.adaptive.trim(draft, context_len)
        else:
            raw = [1.0]
            for node in self.adaptive.node_tokens(draft.scores[: self.k_max], len(draft.tokens)):
                raw.append(raw[-1] + node)
            tokens = [self.coordinator.goodput.scaled(self.draft, t) for t in raw]
            n = self.coordinator.respond(self, tokens, context_len)
            kept = self.adaptive.trim(draft.prefix(n), context_len, size=len(draft.tokens)) if n else self.adaptive.skip(draft)
            if len(kept) < n:
                self.coordinator.settle(self, len(kept), tokens[len(kept)], context_len)
            if len(kept):
                self._pending = raw[len(kept)] - 1
        self.coordinator.on_k(self.draft, len(kept))
        return kept

    def observe(self, positions: int, accepted: int) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and positions:  # a chain proposes up to k: what it was expected to at its depth
            expected = (expected_committed_by_position(pending[0], min(positions, pending[1])) - 1
                        if isinstance(pending, tuple) else pending)
            self.coordinator.goodput.record(self.draft, expected, accepted)
        self.adaptive.observe(positions, accepted)

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        self._pending = None
        self.adaptive.observe_shadow(proposal, committed)
