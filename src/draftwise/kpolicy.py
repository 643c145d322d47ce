"""k policies: how many tokens the draft proposes each step.

:class:`FixedK` proposes k every step. :class:`AdaptiveK` (``--k auto``) picks, every step, the
k (or no speculation) that maximises expected tokens per second, from an online estimate of
per-position acceptance and measured costs (a profile's data; measuring one is
:mod:`draftwise.cost.profile`, and :func:`draftwise.cost.adaptive.auto_policy` builds the policy).

Each step, for k = 0..k_max::

    rate(k) = E(k) / (D(k) + step(k + 1, context)),   E(k) = 1 + sum_{i<k} prod_{j<=i} a_j

where ``a_j`` is the conditional acceptance at draft position j, estimated from the steps
seen so far with exponentially decaying counts (recent text matters more: a generation moves
between copying and free writing), each position shrunk towards the one before it, and ``D``
and ``step`` come from the profile. k = 0 is a plain step. The chosen k caps the proposal: prompt lookup may still propose fewer tokens.

When a draft costs next to nothing (prompt lookup) and the policy chose not to speculate, the
draft still proposes in the *shadow*: its first token is compared with the token the plain step
commits, so the estimate keeps learning and speculation resumes when the text turns
repetitive. A costly draft instead gets a one-token probe every ``probe_every`` plain steps.
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


class StepCosts(Protocol):
    """Measured costs :class:`AdaptiveK` reads (a :class:`draftwise.cost.profile.Profile`)."""

    max_n: int

    def step_time(self, n: int, context: float | None = None) -> float: ...

    def draft_time(self, draft: str, k: int) -> float: ...


class FixedK:
    """Propose k tokens every step (the plain policy)."""

    shadow = False

    def __init__(self, k: int) -> None:
        self.k = k
        self.k_max = k

    def choose(self, context_len: int) -> int:
        return self.k

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        pass


class AdaptiveK:
    """Chooses k per step to maximise expected tokens per second (see the module docstring)."""

    def __init__(
        self,
        profile: StepCosts,
        draft: str,
        *,
        k_max: int = 8,
        decay: float = 0.95,
        prior: tuple[float, float] = (1.0, 2.0),
        probe_every: int = 16,
    ) -> None:
        if k_max < 1:
            raise ConfigError(f"k_max={k_max} must be >= 1")
        if not 0 < decay <= 1:
            raise ConfigError(f"decay={decay} must be in (0, 1]")
        self.k_max = min(k_max, profile.max_n - 1)
        self.profile = profile
        self.draft = draft
        self.decay = decay
        self.prior_hits, self.prior_tests = prior
        self.tested = [0.0] * self.k_max
        self.hits = [0.0] * self.k_max
        self.draft_cost = [profile.draft_time(draft, k) for k in range(1, self.k_max + 1)]
        self.shadow = self.draft_cost[0] < 0.02 * profile.step_time(1)
        self.probe_every = probe_every
        self._plain_run = 0

    def rates(self) -> list[float]:
        """The current conditional acceptance estimate a_j for each draft position j.

        Position 0 starts from the prior; each deeper position starts from the estimate of the
        one before it (as ``prior_tests`` pseudo-observations), because deep positions are
        tested only after every earlier one was accepted, so they are seen rarely, and a run of
        copied text that got that far tends to go on. A flat prior there kept ``auto`` at too
        small a k on long copies (translation, rag).
        """
        out: list[float] = []
        prior_hits, prior_tests = self.prior_hits, self.prior_tests
        for h, t in zip(self.hits, self.tested):
            rate = (h + prior_hits) / (t + prior_tests)
            out.append(rate)
            prior_hits = rate * self.prior_tests
        return out

    def expected_rate(self, k: int, context_len: int, rates: Sequence[float] | None = None) -> float:
        """Expected committed tokens per second at this k."""
        rates = self.rates() if rates is None else rates
        e, run = 1.0, 1.0
        for j in range(k):
            run *= rates[j]
            e += run
        cost = self.profile.step_time(k + 1, context_len) + (self.draft_cost[k - 1] if k else 0.0)
        return e / cost

    def choose(self, context_len: int) -> int:
        rates = self.rates()
        best_k, best = 0, self.expected_rate(0, context_len, rates)
        for k in range(1, self.k_max + 1):
            r = self.expected_rate(k, context_len, rates)
            if r > best:
                best_k, best = k, r
        if best_k == 0 and not self.shadow:
            self._plain_run += 1
            if self._plain_run >= self.probe_every:
                self._plain_run = 0
                best_k = 1  # a probe keeps a costly draft's estimate alive
        else:
            self._plain_run = 0
        return best_k

    def _update(self, proposed: int, accepted: int) -> None:
        for j in range(self.k_max):
            self.tested[j] *= self.decay
            self.hits[j] *= self.decay
        for j in range(min(accepted + 1, proposed, self.k_max)):
            self.tested[j] += 1
        for j in range(min(accepted, self.k_max)):
            self.hits[j] += 1

    def observe(self, proposed: int, accepted: int) -> None:
        """A verified step: ``accepted`` of ``proposed`` tokens."""
        if proposed:
            self._update(proposed, accepted)

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        """A plain step with a shadow proposal: did its first token match what was committed?"""
        if proposal and committed:
            self._update(1, int(proposal[0] == committed[0]))
