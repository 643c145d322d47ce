"""Would each category's variance, moderated towards the others' (draftwise.planner.moderation),
have held more validations than the variance pooled over all categories? Re-scores the stored
sampled plans' checks: for each category's pick, the plan's per-continuation speedups (its
``samples``), the error log(predicted / measured) of its validation, and three variances of
the log speedup between continuations: pooled over every category for that (draft, k) (the
planner before 2026-12-05), the category's own (S - 1 degrees of freedom), and the moderated
one. Each interval is the plan's: +-t(df) * sqrt(2 s^2 / n + timing / n) on the log scale, with
the timing noise of the plan's own timed runs (``timing_spread``) in all three, also for the
plans written before the interval held it, so that only the variance differs. This re-scores
checks the moderated variance was chosen after seeing, so it is not a test of it. Run from the
repository root:

    python benchmarks/moderation_retro.py sampled-t07-s8 sampled-t07-s8-fit sampled-t07-s8-timing
"""
import json
import math
import sys

import numpy as np

from draftwise.cost.intervals import pooled_variance, timing_spread
from draftwise.planner.moderation import moderated_variances

_T: dict[float, float] = {}


def t975(df: float) -> float:
    if df not in _T:
        _T[df] = float(np.quantile(np.random.default_rng(0).standard_t(df, 400_000), 0.975))
    return _T[df]


held = {"pooled": 0, "own": 0, "moderated": 0}
checks = 0
for run in sys.argv[1:]:
    p = json.load(open(f"benchmarks/results/planner/{run}/plan.json"))
    tau2, _ = timing_spread(p["prompts"])
    by_setting: dict[tuple[str, str], dict[str, list[list[float]]]] = {}
    for cat, cands in p["categories"].items():
        for c in cands:
            if cat != "overall" and c.get("samples"):
                by_setting.setdefault((c["draft"], str(c["k"])), {})[cat] = [[math.log(x) for x in c["samples"]]]
    print(f"{run}: timing sd {math.sqrt(tau2):.3f}; half-widths on the log scale, * = held the validation")
    for check in p["validation"]["checks"]:
        cat = check["category"]
        if cat == "overall" or (check["draft"], str(check["k"])) not in by_setting:
            continue  # the overall and routed checks span categories: a bootstrap, unchanged
        groups = by_setting[(check["draft"], str(check["k"]))]
        n = len(groups[cat][0])
        err = math.log(check["predicted"] / check["measured"])
        variances = {"pooled": pooled_variance([g[0] for g in groups.values()]),
                     "own": pooled_variance(groups[cat]), "moderated": moderated_variances(groups)[cat]}
        cells = []
        for name, (s2, df) in variances.items():
            half = t975(df) * math.sqrt(2 * s2 / n + tau2 / n)
            held[name] += abs(err) <= half
            cells.append(f"{name} {half:.3f}{'*' if abs(err) <= half else ' '}")
        checks += 1
        print(f"  {cat[:10]:10} {check['draft']:6} k={str(check['k']):4} error {err:+.3f}  " + "  ".join(cells))
print(f"held, of {checks} checks:", held)
