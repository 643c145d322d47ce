"""A measured check on the goodput policy at batch: do the steps that follow it commit tokens
faster than plain steps would, here, now? (``serve --k auto --max-batch N``)

The policy (:mod:`.goodput_policy`) prices each step from the batch profile and each
sequence's acceptance estimate. What neither sees can turn a predicted gain into a loss: the
Python work of drafting and verifying around the pass, a pass shape the profile prices off
its measured rows. Issue 27's validation measured the policy at 0.93x plain batching at
N = 16 where it predicted 1.02x, with each pass priced within a few percent. The guard
measures what the policy cannot, each step's wall time, and turns speculation off in the
kinds of batch where following the policy measures slower than plain steps.

A *step* is one engine iteration: from the first sequence's choice of k for a pass to the
first choice for the next one (drafting, the pass, verifying, streaming). Its time is priced as
the policy's own objective prices it (:func:`~draftwise.cost.goodput.choose_ks`): a prompt
chunk (or other rows that do not choose) in the pass costs the same whatever the k's, so the
batch profile's price of those rows is taken off, and the rest is measured in units of the
profile's plain decode-only pass of the step's n sequences at their mean context. A step's
*value* is then its tokens a sequence less that time: tokens / n - (T - chunk) / T_plain(n). A
speculative step pays against a plain one when it adds more tokens a sequence than plain-step
times, whatever the chunk beside it (counting the chunk's seconds against the step's tokens,
every proposal beside a chunk would look cheap: it does not make the chunk faster). What the
profile misprices for both kinds of step alike (the chunk, Python work around the pass) cancels
in the difference:

    margin = mean value of the policy's steps - mean value of plain steps

per *kind* of step (the band of the decoding sequences' count n, by its bit length: 2-3, 4-7,
8-15, 16-31...; and whether a prompt chunk or other rows share the pass), with samples weighted
by ``decay`` per newer sample of the same mode (a window of about 1 / (1 - decay) steps:
contexts grow).

A step counts as the policy's when the guard let the policy run it (whether or not the policy
chose to speculate), as plain when the guard made it plain: a plain step drafts nothing, where
a policy step that ends up plain has built and dropped its proposals, and it is these two
decisions the guard compares. Each step the guard says whether the policy runs: yes until both
modes have ``warmup`` samples of this kind, then yes while the margin is at least 0. Either way
every ``explore``-th step of a kind runs the other mode, so both estimates stay current, and
every ``4 explore``-th once the margin is 0.1 or more either way (there a wrong mode costs more,
and the estimate is firm). One sequence alone in the pass is not guarded: its adaptive k
decides, as at N = 1.

>>> g = GoodputGuard(lambda batch, rows, context: 0.1, clock=iter([0.0, 0.12, 0.24]).__next__)
>>> g.begin(0, n=4, prefill_rows=0, prefilling=0, context=100.0)  # no samples yet: the policy
True
>>> g.observed(1, positions=3, accepted=2)  # pass 1: one sequence verified 3 rows, kept 2
>>> g.begin(1, n=4, prefill_rows=0, prefilling=0, context=100.0)
True
>>> g.begin(2, n=4, prefill_rows=0, prefilling=0, context=100.0)  # pass 1's step is complete
True
>>> g.samples(g.kind(4, prefill_rows=0))  # (policy, plain) weights of its kind
(1.0, 0.0)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ConfigError

Kind = tuple[int, bool]  # (bit length of n, other rows in the pass)
PLAIN_STEP, POLICY_STEP = "plain", "policy"


@dataclass
class _Step:
    """One step as it ran: its kind, its sequences, its prices, its span of the clock."""

    kind: Kind
    n: int
    price: float  # the plain decode-only pass of its n sequences
    chunk: float  # the price of the rows that do not choose (a prompt chunk)
    start: float
    follow: bool
    end: float | None = None
    positions: int = 0
    accepted: int = 0


@dataclass
class _Tally:
    """Decayed sums of one kind's samples, the policy's steps and plain ones: weights and values."""

    spec_weight: float = 0.0
    spec_value: float = 0.0
    spec_time: float = 0.0  # of the value's two terms, the time (in plain decode-only steps)
    plain_weight: float = 0.0
    plain_value: float = 0.0
    plain_time: float = 0.0
    steps: int = 0
    decisions: dict[str, int] = field(default_factory=lambda: {POLICY_STEP: 0, PLAIN_STEP: 0})


class GoodputGuard:
    """Measures the policy's steps against plain steps and says each step which runs (module
    docstring). ``price(batch, rows, context)``: the batch profile's pass time
    (:meth:`~draftwise.cost.batch_profile.BatchProfile.pass_time`)."""

    def __init__(self, price: Callable[[int, int, float], float], *, explore: int = 8, warmup: int = 6,
                 decay: float = 0.97, outlier: float = 4.0, clock: Callable[[], float] = time.perf_counter) -> None:
        if isinstance(explore, bool) or not isinstance(explore, int) or explore < 2:
            raise ConfigError(f"explore={explore!r} must be an integer >= 2")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ConfigError(f"warmup={warmup!r} must be an integer >= 1")
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"decay={decay!r} must be in (0, 1]")
        self.price, self.explore, self.warmup, self.decay = price, explore, warmup, decay
        self.outlier, self.clock = outlier, clock
        self.tallies: dict[Kind, _Tally] = {}
        self._steps: dict[int, _Step] = {}  # pass number -> the step that feeds it
        self.follow = True  # this step's decision
        self.dropped = 0  # steps not counted: not consecutive, or far slower than their price

    @staticmethod
    def kind(n: int, prefill_rows: int) -> Kind:
        return (max(n, 1).bit_length(), prefill_rows > 0)

    def begin(self, epoch: int, *, n: int, prefill_rows: int, prefilling: int, context: float) -> bool:
        """The first choice for pass ``epoch + 1`` (``epoch`` passes have run): closes the steps
        before it, opens this one, and returns whether the policy runs it (False: plain)."""
        now = self.clock()
        last = self._steps.get(epoch)
        if last is not None and last.end is None:
            last.end = now
        for e in [e for e in self._steps if e < epoch]:
            self._close(self._steps.pop(e))
        kind = self.kind(n, prefill_rows)
        price, chunk = self._prices(n, prefill_rows, prefilling, context)
        self.follow = self._decide(kind)
        self._steps[epoch + 1] = _Step(kind, n, price, chunk, now, self.follow)
        return self.follow

    def _prices(self, n: int, prefill_rows: int, prefilling: int, context: float) -> tuple[float, float]:
        plain = self.price(n, n, context)
        whole = self.price(n + prefilling, n + prefill_rows, context) if prefill_rows or prefilling else plain
        return plain, max(whole - plain, 0.0)

    def resize(self, epoch: int, *, n: int, prefill_rows: int, prefilling: int, context: float) -> None:
        """A sequence joined pass ``epoch + 1`` after its step began: its kind and price again."""
        step = self._steps.get(epoch + 1)
        if step is not None:
            step.kind, step.n = self.kind(n, prefill_rows), n
            step.price, step.chunk = self._prices(n, prefill_rows, prefilling, context)

    def observed(self, epoch: int, *, positions: int, accepted: int) -> None:
        """A sequence verified ``positions`` proposed rows in pass ``epoch``, ``accepted`` kept."""
        step = self._steps.get(epoch)
        if step is not None:
            step.positions += positions
            step.accepted += accepted

    def _close(self, step: _Step) -> None:
        if step.end is None or step.n < 1 or step.price <= 0:
            self.dropped += 1
            return
        seconds = step.end - step.start
        if not 0 < seconds < self.outlier * (step.price + step.chunk):
            self.dropped += 1  # an idle gap, a pause: not a step's cost
            return
        spent = (seconds - step.chunk) / step.price
        value = (step.n + step.accepted) / step.n - spent
        t = self.tallies.setdefault(step.kind, _Tally())
        t.steps += 1
        d = self.decay
        if step.follow:
            t.spec_weight, t.spec_value = d * t.spec_weight + 1.0, d * t.spec_value + value
            t.spec_time = d * t.spec_time + spent
        else:
            t.plain_weight, t.plain_value = d * t.plain_weight + 1.0, d * t.plain_value + value
            t.plain_time = d * t.plain_time + spent

    def margin(self, kind: Kind) -> float | None:
        """The policy's steps' mean value less plain steps' (None: too few of either)."""
        t = self.tallies.get(kind)
        if t is None or t.spec_weight < self.warmup or t.plain_weight < self.warmup:
            return None
        return t.spec_value / t.spec_weight - t.plain_value / t.plain_weight

    def samples(self, kind: Kind) -> tuple[float, float]:
        t = self.tallies.get(kind)
        return (0.0, 0.0) if t is None else (round(t.spec_weight, 9), round(t.plain_weight, 9))

    def _decide(self, kind: Kind) -> bool:
        t = self.tallies.setdefault(kind, _Tally())
        m = self.margin(kind)
        follow = m is None or m >= 0.0
        every = self.explore * (4 if m is not None and abs(m) >= 0.1 else 1)
        n = t.decisions[POLICY_STEP] + t.decisions[PLAIN_STEP]
        if n % every == every - 1:
            follow = not follow  # explore the other mode
        t.decisions[POLICY_STEP if follow else PLAIN_STEP] += 1
        return follow

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per kind: its samples, margin and decisions (for logs and tests)."""
        out: dict[str, dict[str, float | int | None]] = {}
        for (bits, others), t in sorted(self.tallies.items()):
            lo = 1 << (bits - 1)
            name = f"n={lo}-{2 * lo - 1}" + (" +prompt" if others else "")
            m = self.margin((bits, others))
            out[name] = {"steps": t.steps, "policy": round(t.spec_weight, 2), "plain": round(t.plain_weight, 2),
                         "margin": None if m is None else round(m, 4),
                         "policy_time": round(t.spec_time / t.spec_weight, 4) if t.spec_weight else None,
                         "plain_time": round(t.plain_time / t.plain_weight, 4) if t.plain_weight else None,
                         "policy_steps": t.decisions[POLICY_STEP],
                         "plain_steps": t.decisions[PLAIN_STEP]}
        return out
