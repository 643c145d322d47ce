"""What a decoding sequence costs a batched step outside the target pass, measured while serving
(:class:`OutsidePass`): the goodput policy's (:mod:`draftwise.policy.batch`) price of a
plain and of a speculating sequence beside the pass itself.
"""

from __future__ import annotations

from draftwise.errors import ConfigError


class OutsidePass:
    """What a decoding sequence costs a batched step outside the pass, measured while serving:
    seconds for a plain sequence (one row) and for a speculating one (its proposal verified,
    rolled back, observed; its next drafted), by least squares over the steps.

    The engine resumes every sequence of the last pass before it runs the next, so a step's
    seconds outside its pass (``observe``) are those sequences' work, ``plain`` and
    ``speculating`` of them, less what their drafts cost by the profile (``known``: counted as
    D(k) apart). The fit, y = a plain + b speculating, is shrunk toward ``prior`` (the
    profile's one overhead for both) with the weight of ``weight`` one-sequence steps, and older
    steps fade by ``decay`` a step; a step far above the fit (a prompt entering its drafter, a
    collection pause) counts at three times the fit plus 2 ms. Until a kind of sequence has run,
    its value stays near the prior.

    >>> est = OutsidePass(prior=0.001)
    >>> for _ in range(200):
    ...     est.observe(12 * 0.0002 + 4 * 0.0009, plain=12, speculating=4)
    ...     est.observe(16 * 0.0002, plain=16, speculating=0)
    >>> [round(x * 1e3, 2) for x in est.estimate()]
    [0.2, 0.9]
    """

    def __init__(self, prior: float, *, weight: float = 8.0, decay: float = 0.99) -> None:
        if not prior >= 0 or not weight > 0 or not 0 < decay <= 1:
            raise ConfigError(f"OutsidePass(prior={prior!r}, weight={weight!r}, decay={decay!r}): "
                              "prior >= 0, weight > 0 and 0 < decay <= 1")
        self.prior, self.weight, self.decay = float(prior), float(weight), float(decay)
        self.steps = 0
        self._sums = [0.0] * 5  # decayed sums of p^2, p s, s^2, p y, s y
        self._fit = (self.prior, self.prior)

    def observe(self, seconds: float, *, plain: int, speculating: int, known: float = 0.0) -> None:
        """One step: ``seconds`` outside its pass, after a pass of ``plain`` and ``speculating``
        decoding sequences whose drafts cost ``known`` seconds by the profile."""
        if plain < 0 or speculating < 0 or plain + speculating == 0 or not 0 <= seconds < float("inf"):
            return
        a, b = self._fit
        y = min(max(seconds - known, 0.0), 3 * (a * plain + b * speculating) + 0.002)
        d = self.decay
        for i, v in enumerate((plain * plain, plain * speculating, speculating * speculating,
                               plain * y, speculating * y)):
            self._sums[i] = self._sums[i] * d + v
        self.steps += 1
        self._fit = self._solve()

    def _solve(self) -> tuple[float, float]:
        pp, ps, ss, py, sy = self._sums
        w, p = self.weight, self.prior
        m11, m22 = pp + w, ss + w
        r1, r2 = py + w * p, sy + w * p
        det = m11 * m22 - ps * ps
        return max((r1 * m22 - r2 * ps) / det, 0.0), max((m11 * r2 - ps * r1) / det, 0.0)

    def estimate(self) -> tuple[float, float]:
        """(plain, speculating) seconds a sequence, as fitted so far."""
        return self._fit
