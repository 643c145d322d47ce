"""How much of a sampled plan's pick is luck (the winner's curse): for each category, over every
split of its S continuations into halves, pick the candidate with the best mean predicted
speedup on one half and compare that mean with the same candidate's on the other half. The mean
of (in-half / other-half - 1) is the selection bias; each category's validation error is printed
beside it. Run from the repository root:

    python benchmarks/results/planner/selection_bias.py sampled-t07-s8-fit sampled-t07-s8 sampled-t07-pooled sampled-t07
"""
import itertools
import json
import statistics as st
import sys

for run in sys.argv[1:]:
    p = json.load(open(f"benchmarks/results/planner/{run}/plan.json"))
    meas = {c["category"]: c for c in p["validation"]["checks"]}
    biases = []
    rows = []
    for cat, cands in p["categories"].items():
        if cat == "overall" or not cands[0].get("samples") or len(cands[0]["samples"]) < 4: continue
        S = len(cands[0]["samples"])
        # all balanced splits (A picks, B estimates)
        bs = []
        for A in itertools.combinations(range(S), S // 2):
            B = [i for i in range(S) if i not in A]
            m = lambda c, I: st.mean(c["samples"][i] for i in I)
            best = max(cands, key=lambda c: m(c, A))
            bs.append(m(best, A) / m(best, B) - 1)
        biases.append(st.mean(bs))
        v = meas.get(cat)
        rows.append(f"{cat[:10]:11s} in-split bias {st.mean(bs):+.3f}  pick {v['draft']} k={v['k']} pred/meas-1 {v['predicted']/v['measured']-1:+.3f}")
    print(run, "mean selection bias %+.3f" % st.mean(biases)); print("\n".join(rows))
