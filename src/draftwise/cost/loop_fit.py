"""The profile fitted to the decode loop as it ran during a plan.

A profile is measured once, in about a minute, and cached; on a shared machine its shape is
not stable: profiles of one machine, measured the same way, can price a nine-row step against
a one-row step differently enough to matter (docs/planner.md, "Validation").
A plan's speedups
are ratios of one-row steps (plain decoding) to multi-row ones (verification), so such a
profile moves every prediction, and a validation disagrees with the plan by as much
(docs/planner.md, "The profile fitted to the loop").

So the plan times, beside the runs it traces anyway, plain decoding and one draft that costs
only a host search, on every turn, and fits three kinds of factor to what the loop took
(:func:`fit_loop`), each over the sums of all turns:

- ``plain``: one-row steps, from plain decoding;
- ``verify``: what extra rows add to a step, from the host-search draft's run (its own cost is
  a search, nil in the profile);
- ``drafts``: each draft with a cost of its own (a head, a model), from its traced runs, once
  the steps are priced with the two factors above.

:func:`fitted_profile` returns the profile with these applied; the plan prices every candidate
with it, and ``plan.json`` keeps the factors (``config.loop_fit``) and each run's measured and
predicted seconds under the profile as measured (``runs`` of each prompt; ``config.pricing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from draftwise.cost.profile import Profile

#: a factor outside this range is not a drifting machine but a fit on too little (a run that
#: barely proposed): it is clipped, and the raw value kept in the plan
BOUNDS = (0.5, 2.0)
#: below this share of a run's priced seconds, a part is too small to fit a factor to
MIN_SHARE = 0.02


def _sums(prompts: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per run, [measured, fixed, one-row, extra rows, drafting] summed over the prompts."""
    out: dict[str, list[float]] = {}
    for p in prompts:
        for run, t in (p.get("runs") or {}).items():
            if "parts" in t:
                acc = out.setdefault(run, [0.0] * 5)
                for i, v in enumerate([t["measured_s"], *t["parts"]]):
                    acc[i] += v
    return out


def _ratio(num: float, den: float, total: float) -> float | None:
    return num / den if den > MIN_SHARE * total and num > 0 else None


def fit_loop(prompts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The factors (module docstring) from the plan's prompts (``runs`` with ``parts``); None
    without a timed plain run. A factor the runs cannot tell (no host-search run, or a part
    too small) takes the one before it: ``verify`` the plain factor, ``drafts`` the verify one.

    >>> prompts = [{"runs": {"plain": {"measured_s": 2.2, "parts": [0.2, 2.0, 0.0, 0.0]},
    ...                      "lookup k=8": {"measured_s": 1.6, "parts": [0.2, 1.0, 0.4, 0.0]},
    ...                      "x+eagle:h k=8": {"measured_s": 1.5, "parts": [0.2, 0.8, 0.3, 0.1]}}}]
    >>> fit = fit_loop(prompts)
    >>> fit["plain"], fit["verify"], fit["drafts"]
    (1.0, 1.0, {'x+eagle:h': 2.0})
    """
    sums = _sums(prompts)
    if "plain" not in sums:
        return None
    m, fixed, one, _, _ = sums["plain"]
    plain = _ratio(m - fixed, one, m) or 1.0
    raw: dict[str, float] = {"plain": plain}
    host = [s for run, s in sums.items() if run != "plain" and s[4] <= MIN_SHARE * s[0]]
    rest = sum(s[0] - s[1] - plain * s[2] for s in host)
    verify = _ratio(rest, sum(s[3] for s in host), sum(s[0] for s in host)) if host else None
    raw["verify"] = verify if verify is not None else plain
    drafts: dict[str, float] = {}
    per_draft: dict[str, list[float]] = {}
    for run, s in sums.items():
        if run != "plain" and s[4] > MIN_SHARE * s[0]:
            acc = per_draft.setdefault(run.rsplit(" k=", 1)[0], [0.0, 0.0, 0.0])
            acc[0] += s[0] - s[1] - plain * s[2] - raw["verify"] * s[3]
            acc[1] += s[4]
            acc[2] += s[0]
    for d, (num, den, total) in per_draft.items():
        drafts[d] = _ratio(num, den, total) or raw["verify"]
    clip = lambda v: round(min(max(v, BOUNDS[0]), BOUNDS[1]), 4)  # noqa: E731
    return {"plain": clip(plain), "verify": clip(raw["verify"]), "drafts": {d: clip(v) for d, v in drafts.items()},
            "raw": {"plain": round(plain, 4), "verify": round(raw["verify"], 4),
                    **{d: round(v, 4) for d, v in drafts.items()}}}


def fitted_profile(profile: Profile, fit: dict[str, Any] | None) -> Profile:
    """``profile`` with a :func:`fit_loop` applied: each step of n rows costs ``plain`` times
    its one-row step plus ``verify`` times what its other rows add; each fitted draft's
    proposals cost its factor times the profile's.

    >>> p = Profile("m", "f", "float32", "hf", {128: [1.0, 1.5]}, {128: [1.0, 1.5]}, {"d": [0.1, 0.2]})
    >>> q = fitted_profile(p, {"plain": 1.1, "verify": 2.0, "drafts": {"d": 0.5}})
    >>> q.step[128], q.drafts["d"], q.forward[128]
    ([1.1, 2.1], [0.05, 0.1], [1.0, 1.5])
    """
    if not fit:
        return profile

    def curves(table: dict[int, list[float]]) -> dict[int, list[float]]:
        return {c: [fit["plain"] * v[0] + fit["verify"] * (x - v[0]) for x in v] for c, v in table.items()}

    drafts = {d: [fit["drafts"].get(d, 1.0) * x for x in v] for d, v in profile.drafts.items()}
    return replace(profile, step=curves(profile.step), step_sampled=curves(profile.step_sampled), drafts=drafts)
