"""Score a plan's fitted and unfitted predictions on its own validation (the same measurements):
each pick's `predicted` (fitted to the loop) and `config.unfitted` (the profile as measured)
against `measured`, per category and routed.

    python benchmarks/results/planner/fit_ab.py benchmarks/results/planner/greedy-fit-amd-3/plan.json
"""
import json, statistics, sys
p = json.load(open(sys.argv[1]))
v = p["validation"]; un = p["config"].get("unfitted", {})
print("fit:", p["config"]["loop_fit"])
print("pricing:", v.get("pricing"))
fe, ue = [], []
for c in v["checks"]:
    cat = c["category"]
    if cat == "overall" and c["draft"] != "per category":
        continue
    key = cat
    if key not in un:
        continue
    u = abs(un[key] - c["measured"]) / c["measured"]
    print(f"{cat:17s} {c['draft']:22s} {str(c['k']):5s} fitted {c['predicted']:.3f} unfitted {un[key]:.3f} measured {c['measured']:.3f}  err {100*c['error']:5.1f}% / {100*u:5.1f}%")
    if cat != "overall (routed)":
        fe.append(c["error"]); ue.append(u)
print(f"per category: fitted median {100*statistics.median(fe):.1f}% max {100*max(fe):.1f}% | unfitted median {100*statistics.median(ue):.1f}% max {100*max(ue):.1f}%  (n={len(fe)})")
