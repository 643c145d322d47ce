"""The loop fit's two readings on k1diag.json: fit the plan's factors on the plain and k=8 runs
(one-row steps from plain; the k=8 run's excess either on its extra rows, as the plan does, or
on a per-proposing-step overhead), then price the k=1 runs both ways against their measured
seconds. Run from the repository root:

    python benchmarks/results/planner/k1-diag/fitcmp.py
"""
import json
from draftwise.cost.profile import Profile
prof = Profile.load("benchmarks/results/planner/k1-diag/profile.json")
o = json.load(open("benchmarks/results/planner/k1-diag/k1diag.json"))
def prop_one(x, _):
    # a one-row step's price at each proposing step (at 300 tokens of context: an approximation)
    return sum(prof.step_time(1, 300, sampled=True) for m, _ in x["trace"] if m)
for d in ("suffix", "lookup"):
    r = [x for x in o if x["draft"] == d]
    S = lambda k, f: sum(f(x[k]) for x in r)
    plain = S("k0", lambda y: y["s"] - y["parts"][0]) / S("k0", lambda y: y["parts"][1])
    ex = lambda k: S(k, lambda y: y["s"] - y["parts"][0] - plain * y["parts"][1])
    rows = lambda k: S(k, lambda y: y["parts"][2])
    po = lambda k: S(k, lambda y: prop_one(y, 0))
    b = ex("k8") / rows("k8"); a = (ex("k8") - rows("k8")) / po("k8")
    for k in ("k1", "k8"):
        meas = S(k, lambda y: y["s"]); base = S(k, lambda y: y["parts"][0] + plain * y["parts"][1])
        print(d, k, "plain-fac %.3f" % plain, "meas %.1f" % meas, "per-row pred %.1f" % (base + b * rows(k)), "per-step pred %.1f" % (base + rows(k) + a * po(k)), "b %.2f a %.3f" % (b, a))
