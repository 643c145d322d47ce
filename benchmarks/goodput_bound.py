"""How much can the goodput policy beat the best fixed k, in the goodput model itself? No model
runs: the simulation of ``draftwise plan --concurrency`` (:func:`draftwise.capacity.simulate.simulate`)
on a finished validation folder's profiles and requests, each policy at each N, in two designs:

- ``load``: the requests the validation sent, shared as it shared them (the same U units at
  every N, client i the units i, i + N, ...: 2 a client at N = 16), its wall time from the
  first request to the last answer, as the load test and ``goodput_policy.py`` measure;
- ``steady``: every client sends R units (``--steady R``, default 12; the units taken in turn,
  repeated), so the first requests' burst of prompts and the last requests' drain are a small
  share of the phase and N requests are in flight most of the time.

For each N: goodput / plain, the best fixed k of every draft and k in the plan, and goodput over
it. From the repository root:

    .venv/bin/python benchmarks/goodput_bound.py benchmarks/results/goodput/run-interleaved-profile \
        benchmarks/results/goodput/run-kernel/plan.json > benchmarks/results/goodput/policy-bound/bound.md
"""
import argparse
import json
from pathlib import Path

from draftwise.capacity.plan import load_units
from draftwise.capacity.simulate import policies, simulate, workload_from_plan
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.goodput import StepCost
from draftwise.cost.profile import Profile
from draftwise.planner.plan_file import load_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="a goodput_plan.py folder: profile.json, batch-profile.json, measured.json")
    ap.add_argument("plan", type=Path)
    ap.add_argument("--steady", type=int, default=12, help="units a client in the steady design")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    args = ap.parse_args()

    raw = json.loads((args.dir / "measured.json").read_text())
    cost = StepCost(BatchProfile.load(args.dir / "batch-profile.json"), Profile.load(args.dir / "profile.json"))
    workload = workload_from_plan(load_plan(args.plan), load_units(raw["workload"]))
    table = {name: pol for name, pol in policies(workload).items() if name != "plan"}
    designs = {
        "load": dict(requests_per_client=int(raw["requests_per_client"]), per_phase=raw.get("units_per_phase")),
        "steady": dict(requests_per_client=args.steady),
    }
    print(f"Simulated on `{args.dir}`'s profiles and requests ({len(workload.units)} units), plan `{args.plan}`.\n")
    print("| design | N | goodput / plain | best fixed k | its / plain | goodput / best fixed k | mean k (goodput) |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for design, kw in designs.items():
        for n in (int(x) for x in args.concurrency.split(",")):
            sims = {name: simulate(workload, cost, n, pol, **kw) for name, pol in table.items()}
            plain = sims["plain"].aggregate
            fixed = {name: s.aggregate for name, s in sims.items() if table[name][0] == "fixed"}
            best = max(fixed, key=fixed.get)
            g = sims["goodput"]
            print(f"| {design} | {n} | {g.aggregate / plain:.3f} | {best} | {fixed[best] / plain:.3f} | "
                  f"{g.aggregate / fixed[best]:.3f} | {g.mean_k:.2f} |")


if __name__ == "__main__":
    main()
