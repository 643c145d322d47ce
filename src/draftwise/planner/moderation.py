"""Each category's spread between continuations, moderated towards the others' (empirical Bayes).

A sampled plan (``plan --samples S``) has one or two prompts a category, so a category's own
variance between continuations rests on S - 1 degrees of freedom (7 at the default S = 8): too
few to trust alone, and pooling every category's into one assumes they are all alike. They are
not: on three sampled plans at S = 8 (docs/planner.md), coding's spread was 2.3 times the pooled
one in one plan and extraction's 2.6 times in another, and those were the categories the pooled
interval missed. The standard compromise is the moderated variance of Smyth (2004, "Linear models
and empirical Bayes methods for assessing differential expression", section 6.2), which limma
uses for the same problem (a few replicates per gene, thousands of genes):

- the categories' variances s_c^2 (d_c degrees of freedom each) are taken as draws of a scaled
  inverse chi-square prior with d0 degrees of freedom and scale s0^2, estimated from them by
  the method of moments on log s_c^2 (:func:`prior`);
- a category's variance is then (d0 s0^2 + d_c s_c^2) / (d0 + d_c) on d0 + d_c degrees of
  freedom: near the pooled one where the categories agree (d0 large), near its own where they
  differ (d0 small). When the spread of the s_c^2 is no more than chi-square noise would give,
  d0 is infinite and every category gets the pooled variance, as before.

Digamma and trigamma come from ``torch.special`` (torch is already a dependency).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from draftwise.cost.intervals import pooled_variance


def digamma(x: float) -> float:
    """psi(x) for x > 0.

    >>> round(digamma(1.0), 6), round(digamma(0.5), 6)  # -gamma, -gamma - 2 ln 2
    (-0.577216, -1.96351)
    """
    return float(torch.special.digamma(torch.tensor(x, dtype=torch.float64)))


def trigamma(x: float) -> float:
    """psi'(x) for x > 0.

    >>> round(trigamma(1.0), 6), round(trigamma(0.5), 6)  # pi^2 / 6, pi^2 / 2
    (1.644934, 4.934802)
    """
    return float(torch.special.polygamma(1, torch.tensor(x, dtype=torch.float64)))


def _inverse_trigamma(v: float) -> float:
    """The y > 0 with trigamma(y) = v (trigamma falls from infinity to 0; bisection on log y)."""
    lo, hi = -30.0, 30.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if trigamma(math.exp(mid)) > v:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def prior(variances: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """``(d0, s0^2)`` of the prior from groups' ``(s^2, df)``, by Smyth's moments: the log
    variances, corrected for their chi-square bias, vary by trigamma(d0 / 2) beyond what their
    own degrees of freedom explain. ``d0`` is ``math.inf`` (pool everything) when they vary no
    more than that, or with fewer than three usable groups.

    >>> d0, s0 = prior([(0.01, 7)] * 5)
    >>> d0
    inf
    >>> d0, s0 = prior([(0.002, 7), (0.01, 7), (0.05, 7), (0.004, 7), (0.03, 7)])
    >>> bool(1 < d0 < 10), bool(0.005 < s0 < 0.03)
    (True, True)
    """
    usable = [(s2, df) for s2, df in variances if s2 > 0 and df > 0]
    if len(usable) < 3:
        return math.inf, 0.0
    e = [math.log(s2) - digamma(df / 2) + math.log(df / 2) for s2, df in usable]
    mean = sum(e) / len(e)
    excess = sum((x - mean) ** 2 for x in e) / (len(e) - 1) - sum(trigamma(df / 2) for _, df in usable) / len(usable)
    if excess <= 0:
        return math.inf, math.exp(mean)
    d0 = 2 * _inverse_trigamma(excess)
    return d0, math.exp(mean + digamma(d0 / 2) - math.log(d0 / 2))


def moderated_variances(groups: Mapping[Hashable, Sequence[Sequence[float]]]) -> dict[Hashable, tuple[float, float]]:
    """Per key (a category), its moderated variance and degrees of freedom, from its groups of
    values (one group a prompt: the log speedups of its continuations), each about its own
    group's mean. With d0 infinite every key gets the variance pooled over all of them (what
    :func:`~draftwise.cost.intervals.pooled_variance` gives); the degrees of freedom never exceed
    the pooled ones.

    >>> same = {c: [[0.0, 0.1, 0.2, 0.1]] for c in "abcd"}
    >>> {c: (round(s2, 4), df) for c, (s2, df) in moderated_variances(same).items()}["a"]
    (0.0067, 12)
    """
    own = {key: pooled_variance(g) for key, g in groups.items()}
    pooled = pooled_variance([v for g in groups.values() for v in g])
    d0, s0 = prior(list(own.values()))
    if math.isinf(d0):
        return {key: pooled for key in own}
    return {key: ((d0 * s0 + df * s2) / (d0 + df), min(d0 + df, pooled[1])) for key, (s2, df) in own.items()}


def log_spreads(items: Sequence[dict[str, Any]]) -> dict[Hashable, tuple[float, float]]:
    """Per category of ``items`` (units: ``plain_s``, ``method_s``, a ``category`` and a
    ``question_id``), the variance between continuations of one prompt of the log of each
    unit's speedup, moderated towards the other categories' (:func:`moderated_variances`), and
    its degrees of freedom. The relative spread is compared on the log scale: a copying draft's
    gain varies by a similar share wherever it copies, unless a category's answers differ more.

    >>> items = [{"category": c, "question_id": c, "plain_s": 1.0, "method_s": m}
    ...          for c, ms in (("a", (0.5, 0.5)), ("b", (1.0, 0.5))) for m in ms]
    >>> {c: (round(s2, 4), df) for c, (s2, df) in log_spreads(items).items()}  # two: pooled
    {'a': (0.1201, 2), 'b': (0.1201, 2)}
    """
    groups: dict[Hashable, dict[Any, list[float]]] = {}
    for x in items:
        prompts = groups.setdefault(x["category"], {})
        prompts.setdefault(x["question_id"], []).append(math.log(x["plain_s"] / x["method_s"]))
    return moderated_variances({c: list(p.values()) for c, p in groups.items()})
