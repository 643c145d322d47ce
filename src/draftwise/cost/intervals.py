"""Intervals on predicted speedups: every acceptance the planner uses is a binomial estimate.

A prediction rests on counts traced on a few prompts: how many steps proposed at all, and how
many of those accepted draft position i. Position i is tried only by a step that accepted
position i - 1, so its conditional rate c_i = accepted_i / accepted_{i-1} is a binomial
estimate, and committed tokens per proposing step are E = 1 + sum_i prod_{j<=i} c_j (exactly the
traced mean). The share of steps that proposed at all is another binomial estimate. The interval
here is a *prediction interval for a rerun of the same size*, which is what ``plan --validate``
measures (with sampling, a rerun decodes another random continuation):

1. each rate's posterior is Beta(x + 1/2, n - x + 1/2) (Jeffreys' prior, x successes in n);
2. a rerun's count then follows the beta-binomial distribution with those parameters; a draw
   takes it by inverting that distribution at a uniform number, and every k of one draft uses
   the same uniform numbers, so the draws of different k move together;
3. the draw's speedup is the point prediction with the time spent in steps scaled by how much
   the drawn rates change the cost per committed token, priced with the profile
   (:func:`price_per_token`);
4. the interval is the 2.5 and 97.5 percentiles of the draws.

Steps are not independent trials: a generation copies in runs (a quoted passage, a list), and a sampled
rerun may copy a different amount. :func:`dispersion` measures that on the traces, from the
autocorrelation of the tokens committed per step, and every count is divided by it (fewer,
effective trials) before step 1.

**Timing noise.** ``plan --validate`` times real runs, and a shared machine's pauses move each
unit's measured speedup. The plan times plain decoding and each traced run on every turn, side
by side, so :func:`timing_spread` measures that noise from the plan's own runs (how a run's
measured-to-priced ratio differs from the plain run's on the same unit), and every draw above
is multiplied by a log-normal factor of that variance over the units measured
(:func:`timing_draws`). A plan without timed runs has intervals on the acceptance only.

**With several continuations per prompt** (sampling, ``plan --samples S``), the binomial draws
above say nothing about how differently the next continuation goes: whether it quotes the
prompt decides most of a copying draft's gain. There a category's interval comes from the
spread between continuations (:func:`~draftwise.planner.moderation.log_spreads`, :func:`rerun_t_draws`), and an interval
over several categories bootstraps the units (:func:`rerun_draws`); see their docstrings.

>>> c = counts_from_steps([(4, 4), (4, 0), (4, 2), (0, 0)], k=4)
>>> c.accepted, c.proposing, c.steps
([2, 2, 1, 1], 3, 4)
>>> c.trials(), [round(r, 2) for r in c.rates()]
([3, 2, 2, 1], [0.67, 1.0, 0.5, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftwise.cost.formulas import mean_rate_speedup
from draftwise.cost.profile import Profile
from draftwise.drafters.spec import DraftSpec

LEVEL = 0.95


@dataclass
class Counts:
    """Binomial counts behind one (draft, k) prediction: ``accepted[i]``, the steps that accepted
    draft position i; ``proposing`` of ``steps`` proposed at all."""

    accepted: list[int] = field(default_factory=list)
    proposing: int = 0
    steps: int = 0

    def __add__(self, other: Counts) -> Counts:
        n = max(len(self.accepted), len(other.accepted))
        a = self.accepted + [0] * (n - len(self.accepted))
        b = other.accepted + [0] * (n - len(other.accepted))
        return Counts([x + y for x, y in zip(a, b)], self.proposing + other.proposing, self.steps + other.steps)

    def trials(self) -> list[int]:
        """How many steps tried each position: every proposing step tries position 0; position i
        is tried by the steps that accepted position i - 1."""
        return [self.proposing, *self.accepted[:-1]]

    def rates(self) -> list[float]:
        """The conditional rates c_i, up to the first position no step tried."""
        out = []
        for x, n in zip(self.accepted, self.trials()):
            if not n:
                break
            out.append(x / n)
        return out


def counts_from_steps(steps: Sequence[tuple[int, int]], k: int) -> Counts:
    """Counts of ``(proposed, accepted)`` steps as a draft at ``k`` sees them (a step traced at a
    larger k is cut to k; a tree step's accepted path counts like a chain's)."""
    accepted = [0] * k
    proposing = 0
    for m, acc in steps:
        if not min(m, k):
            continue
        proposing += 1
        for i in range(min(acc, m, k)):
            accepted[i] += 1
    return Counts(accepted, proposing, len(steps))


def dispersion(runs: Sequence[Sequence[tuple[int, int]]]) -> float:
    """phi = (1 + rho) / (1 - rho) >= 1, the variance inflation of a mean over steps whose
    committed tokens have lag-1 autocorrelation rho (AR(1): n steps carry n / phi trials' worth
    of information). rho is measured about each run's own mean, pooled over ``runs``, and kept
    within [0, 0.95].

    >>> dispersion([[(4, 0), (4, 4)] * 40])             # alternating: no runs
    1.0
    >>> round(dispersion([[(4, 4)] * 16 + [(4, 0)] * 16] * 3), 1)   # runs of 16 hits, 16 misses
    20.3
    """
    num = den = 0.0
    for steps in runs:
        v = np.array([1 + acc for _, acc in steps], dtype=float)
        if len(v) < 3:
            continue
        v -= v.mean()
        num += float((v[1:] * v[:-1]).sum())
        den += float((v * v).sum())
    rho = min(max(num / den, 0.0), 0.95) if den else 0.0
    return (1 + rho) / (1 - rho)


def _lgamma(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.lgamma, otypes=[float])(x)


def _rerun_rates(x: int, n: int, uniforms: np.ndarray, phi: float = 1.0) -> np.ndarray:
    """A rerun's rate at each uniform number: the inverse of the beta-binomial distribution
    over n / phi effective trials (Beta(x / phi + 1/2, (n - x) / phi + 1/2))."""
    x, n = x * max(1, round(n / phi)) / n, max(1, round(n / phi))
    a, b = x + 0.5, n - x + 0.5
    k = np.arange(n + 1)
    log_pmf = (math.lgamma(n + 1) - _lgamma(k + 1.0) - _lgamma(n - k + 1.0)
               + _lgamma(k + a) + _lgamma(n - k + b) - math.lgamma(n + a + b)
               - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
    cdf = np.cumsum(np.exp(log_pmf))
    return np.minimum(np.searchsorted(cdf / cdf[-1], uniforms), n) / n


def _expected(rates: np.ndarray, k: int) -> np.ndarray:
    """E = 1 + sum_{i<k} prod_{j<=i} c_j per row; positions past the measured ones reuse the last."""
    total = np.ones(rates.shape[0])
    run = np.ones(rates.shape[0])
    for i in range(k):
        run = run * rates[:, min(i, rates.shape[1] - 1)]
        total = total + run
    return total


def price_per_token(
    profile: Profile, draft: DraftSpec | str, k: int, expected: np.ndarray, share: np.ndarray,
    context: float, *, sampled: bool = False,
) -> np.ndarray:
    """Seconds per committed token in the chain model: a proposing step (a ``share`` of all
    steps) costs D(k) + step(k + 1) and commits ``expected`` tokens; any other step costs a plain
    step (plus a look-up that found nothing) and commits one."""
    spec = DraftSpec.parse(draft)
    idle = profile.draft_time(spec, 1) if spec.kind in ("lookup", "suffix") else 0.0
    busy_s = profile.draft_time(spec, k) + profile.step_time(k + 1, context, sampled=sampled)
    idle_s = idle + profile.step_time(1, context, sampled=sampled)
    return (share * busy_s + (1 - share) * idle_s) / (share * expected + (1 - share))


def uniforms(seed: int, k: int, draws: int = 400) -> np.ndarray:
    """The uniform numbers behind one draft's draws: ``[draws, 1 + k]`` (the share, then one
    column per draft position). Pass the same array for every k of a draft."""
    return np.random.default_rng(seed).random((draws, 1 + k))


def cost_ratio_draws(
    profile: Profile, draft: DraftSpec | str, k: int, counts: Counts, context: float,
    u: np.ndarray, *, phi: float = 1.0, sampled: bool = False,
) -> np.ndarray:
    """One factor per row of ``u`` (:func:`uniforms`) by which a rerun's time per committed
    token differs from the point prediction's, from the binomial uncertainty of ``counts``, each
    count divided by the :func:`dispersion` ``phi`` (all ones if nothing was proposed)."""
    rates = counts.rates()[:k]
    if not counts.proposing or not rates:
        return np.ones(u.shape[0])
    drawn = np.stack([_rerun_rates(x, n, u[:, 1 + i], phi) for i, (x, n) in
                      enumerate(zip(counts.accepted[: len(rates)], counts.trials()))], axis=1)
    share = _rerun_rates(counts.proposing, counts.steps, u[:, 0], phi)
    share_hat = np.array([counts.proposing / counts.steps])
    point = price_per_token(profile, draft, k, _expected(np.array([rates]), k), share_hat, context, sampled=sampled)
    return price_per_token(profile, draft, k, _expected(drawn, k), share, context, sampled=sampled) / point


def percentile_interval(values: np.ndarray, point: float) -> tuple[float, float]:
    """The central ``LEVEL`` interval of ``values``, widened to hold ``point``."""
    lo, hi = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return min(float(lo), point), max(float(hi), point)


def speedup_draws(items: Sequence[dict], ratios: Sequence[np.ndarray]) -> np.ndarray:
    """Spec-Bench speedups (mean tokens/s over plain's) of ``items`` (the planner's per-prompt
    predictions: ``new_tokens``, ``plain_s``, ``method_s``, ``fixed_s``), each prompt's time
    spent in steps scaled by its draws in ``ratios``."""
    new = np.array([x["new_tokens"] for x in items], dtype=float)
    plain = np.array([x["plain_s"] for x in items])
    fixed = np.array([x["fixed_s"] for x in items])
    steps = np.array([x["method_s"] for x in items]) - fixed
    scaled = fixed[None, :] + steps[None, :] * np.stack(list(ratios), axis=1)  # [draws, prompts]
    return (new[None, :] / scaled).mean(axis=1) / (new / plain).mean()


def rerun_draws(items: Sequence[dict], *, seed: int, draws: int = 400) -> np.ndarray:
    """Speedup draws for a rerun of ``items`` (the planner's per-unit predictions: ``category``,
    ``question_id``, ``new_tokens``, ``plain_s``, ``method_s``; a unit is a prompt and one
    sampled continuation, every prompt of a category with the same number S of them), as
    ``plan --validate`` measures it: the same prompts, S new continuations each.

    Each draw is ``point + (rerun - estimate)``, where, within each category,

    - *estimate* resamples the prompts, then each drawn prompt's S continuations, with
      replacement: the uncertainty of the plan's own mean over so few units;
    - *rerun* keeps the prompts and resamples each one's S continuations: the next S draws;

    and the difference is scaled by sqrt(S / (S - 1)), which undoes the bootstrap's shrinking
    of a variance measured on S units. Speedups are Spec-Bench's (mean tokens/s over plain's),
    pooled over the categories. ``seed`` fixes the resampling, so every candidate of a category
    resamples the same units and their intervals compare like for like.

    >>> items = [{"category": "c", "question_id": q, "new_tokens": 10, "plain_s": 1.0, "method_s": m}
    ...          for q, ms in ((1, (0.5, 0.5)), (2, (1.0, 1.0))) for m in ms]
    >>> d = rerun_draws(items, seed=0)
    >>> float(d.min()) < 1.5 < float(d.max()), round(float(np.median(d)), 2)
    (True, 1.5)
    """
    rng = np.random.default_rng(seed)
    strata: dict[Any, dict[Any, list[int]]] = {}
    for i, x in enumerate(items):
        strata.setdefault(x["category"], {}).setdefault(x["question_id"], []).append(i)
    new = np.array([x["new_tokens"] for x in items], dtype=float)
    method = new / np.array([x["method_s"] for x in items], dtype=float)
    plain = new / np.array([x["plain_s"] for x in items], dtype=float)
    point = method.mean() / plain.mean()
    est_m, est_p, fut_m, fut_p = (np.zeros(draws) for _ in range(4))
    sizes = []
    for prompts in strata.values():
        units = np.array(list(prompts.values()))  # [P, S]: every prompt has S continuations
        n_p, n_s = units.shape
        sizes.append(n_s)
        chosen = units[rng.integers(0, n_p, (draws, n_p))]  # [draws, P, S]: prompts resampled
        pick = rng.integers(0, n_s, (draws, n_p, n_s))
        est = np.take_along_axis(chosen, pick, axis=2)
        fut = units[np.arange(n_p)[None, :, None], rng.integers(0, n_s, (draws, n_p, n_s))]
        est_m += method[est].sum(axis=(1, 2))
        est_p += plain[est].sum(axis=(1, 2))
        fut_m += method[fut].sum(axis=(1, 2))
        fut_p += plain[fut].sum(axis=(1, 2))
    n_s = min(sizes)
    scale = math.sqrt(n_s / (n_s - 1)) if n_s > 1 else 1.0
    return point + scale * (fut_m / fut_p - est_m / est_p)


def pooled_variance(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """The variance of values about their own group's mean, pooled over the groups, and its
    degrees of freedom (values minus groups); (0.0, 0) with none to spare.

    >>> pooled_variance([[1.0, 3.0], [5.0]])
    (2.0, 1)
    """
    groups = list(groups)
    squares = sum(float(((np.array(v) - np.mean(v)) ** 2).sum()) for v in groups)
    df = sum(len(v) - 1 for v in groups)
    return (squares / df if df else 0.0), df


def rerun_t_draws(items: Sequence[dict], spread: tuple[float, float], *, seed: int, draws: int = 4000) -> np.ndarray:
    """Speedup draws for a rerun of ``items`` (one category's units: its prompts, S continuations
    each) with S new continuations, as ``plan --validate`` measures it.

    The rerun's mean and the plan's own each average n = len(items) continuations, so their
    difference, on the log scale, has variance 2 s^2 / n with s^2 the variance between continuations of
    :func:`~draftwise.planner.moderation.log_spreads` (the category's variance, moderated towards
    the others'); with s^2 itself estimated on its degrees of freedom, the
    difference over its standard error follows Student's t. Each draw is the point prediction
    (Spec-Bench's: mean tokens/s over plain's) times exp(se * t).

    >>> items = [{"category": "c", "question_id": 1, "new_tokens": 10, "plain_s": 1.0, "method_s": m}
    ...          for m in (0.5, 0.5, 0.5, 0.5)]
    >>> d = rerun_t_draws(items, (0.01, 30), seed=0)  # se 0.0707, t(30) 2.04: 2 exp(+-0.144)
    >>> lo, hi = np.quantile(d, [0.025, 0.975])
    >>> round(float(np.median(d)), 2), bool(1.70 < lo < 1.76), bool(2.27 < hi < 2.35)
    (2.0, True, True)
    """
    s2, df = spread
    point = mean_rate_speedup([x["new_tokens"] / x["method_s"] for x in items],
                              [x["new_tokens"] / x["plain_s"] for x in items])
    if df < 1:
        return np.full(draws, point)
    se = math.sqrt(s2 * 2.0 / len(items))
    return point * np.exp(se * np.random.default_rng(seed).standard_t(df, draws))


def timing_spread(prompts: Sequence[dict]) -> tuple[float, int]:
    """The variance of the timing noise in one unit's measured speedup, and its degrees of
    freedom, from the plan's timed runs (``runs`` of each prompt, :mod:`~draftwise.cost.loop_fit`):
    per unit and per run other than plain, d = log(measured / priced) of the run minus the same
    of plain decoding on that unit (adjacent runs, so a slow spell both share cancels, as it
    does in a validation that interleaves them), its variance about each run's mean, pooled
    over the runs. (0.0, 0) without timed runs.

    >>> runs = lambda a, b: {"runs": {"plain": {"measured_s": 1.0, "predicted_s": 1.0},
    ...                               "lookup k=8": {"measured_s": a, "predicted_s": b}}}
    >>> s2, df = timing_spread([runs(1.0, 1.0), runs(math.e, 1.0), runs(1.0, 1.0)])
    >>> round(s2, 3), df
    (0.333, 2)
    """
    per_run: dict[str, list[float]] = {}
    for p in prompts:
        runs = p.get("runs") or {}
        plain = runs.get("plain")
        if not plain or plain["predicted_s"] <= 0 or plain["measured_s"] <= 0:
            continue
        base = math.log(plain["measured_s"] / plain["predicted_s"])
        for run, t in runs.items():
            if run != "plain" and t["predicted_s"] > 0 and t["measured_s"] > 0:
                per_run.setdefault(run, []).append(math.log(t["measured_s"] / t["predicted_s"]) - base)
    return pooled_variance(per_run.values())


def timing_draws(s2: float, units: int, *, seed: int, draws: int) -> np.ndarray:
    """Factors by which timing noise moves a speedup measured over ``units`` units, each unit's
    log noise of variance ``s2`` (:func:`timing_spread`) and independent of the others: the
    exponential of a normal draw of variance s2 / units (all ones when ``s2`` is 0).

    >>> f = timing_draws(0.04, 4, seed=0, draws=20000)
    >>> round(float(np.std(np.log(f))), 2)
    0.1
    """
    if s2 <= 0 or units < 1:
        return np.ones(draws)
    return np.exp(math.sqrt(s2 / units) * np.random.default_rng(seed).standard_normal(draws))
