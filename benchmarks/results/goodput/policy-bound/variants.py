"""Two cheap variants of the goodput policy against the best fixed k, in the simulation of
``draftwise plan --concurrency`` (no model runs), beside ``bound.py``'s own:

- ``goodput``: the policy the server runs (each sequence's k by local search, 0 included);
- ``uniform``: one k for every decoding sequence of a step, the best for that step's goodput
  (no sequence left at k = 0 while the others speculate, the tail ``bound.md`` names at N = 8);
- ``floor``: the policy's choice, with every sequence at k = 0 raised to its smallest k
  whenever any sequence of the step speculates.

Same designs as ``bound.py`` (``load``: the validation's requests and wall time; ``steady``:
12 units a client). From the repository root:

    .venv/bin/python benchmarks/results/goodput/policy-bound/variants.py DIR PLAN_JSON > OUT.md
"""
import argparse
import json
from pathlib import Path

import draftwise.cost.goodput_sim as sim
from draftwise.cost import goodput
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.capacity import load_units
from draftwise.cost.goodput import StepCost
from draftwise.cost.plan import load_plan
from draftwise.cost.profile import Profile

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("dir", type=Path, help="a run_goodput.py folder: profile.json, batch-profile.json, measured.json")
ap.add_argument("plan", type=Path)
args = ap.parse_args()
search = goodput.choose_ks


def uniform(choices, cost, *, context, fixed_rows=0.0, fixed_batch=0, rows_budget=None, scenario="point"):
    best, best_value = [0] * len(choices), -1.0
    for k in sorted({k for c in choices for k in c.outcomes}):
        ks = [max(j for j in c.outcomes if j <= k) for c in choices]
        value = goodput.step_goodput(choices, ks, cost, context=context, fixed_rows=fixed_rows,
                                     fixed_batch=fixed_batch, scenario=scenario)
        if value > best_value:
            best, best_value = ks, value
    return best


def floor(choices, cost, **kw):
    ks = search(choices, cost, **kw)
    if not any(ks):
        return ks
    return [k or min((j for j in c.outcomes if j > 0), default=0) for c, k in zip(choices, ks)]


raw = json.loads((args.dir / "measured.json").read_text())
cost = StepCost(BatchProfile.load(args.dir / "batch-profile.json"), Profile.load(args.dir / "profile.json"))
workload = sim.workload_from_plan(load_plan(args.plan), load_units(raw["workload"]))
table = {name: pol for name, pol in sim.policies(workload).items() if name != "plan"}
designs = {"load": dict(requests_per_client=int(raw["requests_per_client"]), per_phase=raw.get("units_per_phase")),
           "steady": dict(requests_per_client=12)}
print(f"Simulated on `{args.dir}`'s profiles and requests, plan `{args.plan}`: each variant over the best fixed k "
      "at that N (its / plain in brackets).\n")
print("| design | N | best fixed k (/ plain) | goodput | uniform | floor |")
print("|---|---:|---|---:|---:|---:|")
for design, kw in designs.items():
    for n in (1, 2, 4, 8, 16):
        fixed = {name: sim.simulate(workload, cost, n, pol, **kw).aggregate
                 for name, pol in table.items() if pol[0] == "fixed"}
        plain = sim.simulate(workload, cost, n, table["plain"], **kw).aggregate
        best = max(fixed, key=fixed.get)
        cells = []
        for variant in (search, uniform, floor):
            sim.choose_ks = variant  # the simulation's one call of the policy
            cells.append(sim.simulate(workload, cost, n, table["goodput"], **kw).aggregate)
        sim.choose_ks = search
        print(f"| {design} | {n} | {best} ({fixed[best] / plain:.3f}) | "
              + " | ".join(f"{c / fixed[best]:.3f} ({c / plain:.3f})" for c in cells) + " |")
