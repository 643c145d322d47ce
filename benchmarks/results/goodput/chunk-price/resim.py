"""What pricing prompt-chunk rows apart would do to the validation's predictions (no model run).

The simulation of ``benchmarks/results/goodput/run-avx2-kernel`` (its plan, profiles and the requests
its load test sent) with one change: a step's prompt-chunk rows are priced at a constant CHUNK_ROW
seconds a row on top of the decoding pass (the pass priced with one row for each prefilling
request), instead of inside the batch profile's pass. A what-if, not a remedy: one constant for
every batch size, taken from ``chunk_price.py``'s pass at 16 sequences.

    python benchmarks/results/goodput/chunk-price/resim.py > resim.txt
"""
import inspect, json, textwrap
from pathlib import Path
import draftwise.cost.goodput as G
import draftwise.cost.goodput_sim as S
from draftwise.cost.plan import load_plan
from draftwise.cost.profile import Profile
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.capacity import load_units
D = Path("/work/main/benchmarks/results/goodput/run-avx2-kernel")
plan = load_plan(D / "plan.json"); bp = BatchProfile.load(D / "batch-profile.json"); pr = Profile.load(D / "profile.json")
raw = json.load(open(D / "measured.json"))
w = S.workload_from_plan(plan, load_units(raw["workload"]))
cost = G.StepCost(bp, pr)
src = inspect.getsource(S.simulate)
old = "dt = cost.seconds(len(live), rows, context, extra, sum(made))"
assert old in src
new = "dt = cost.seconds(len(live), rows - pre_rows + len(pre), context, extra, sum(made)) + CHUNK_ROW * max(pre_rows - len(pre), 0)"
ns = dict(vars(S)); exec(textwrap.dedent(src.replace(old, new)), ns)
kw = dict(requests_per_client=int(raw["requests_per_client"]), per_phase=raw.get("units_per_phase"))
tab = S.policies(w)
meas = {int(n): v for n, v in raw["measured"].items()}
for chunk_row in [None, 0.0015, 0.0012]:  # as the batch profile prices it; 1.5 and 1.2 ms a row
    out = []
    for n in [1, 2, 4, 8, 16]:
        if chunk_row is None:
            p = S.simulate(w, cost, n, tab["plain"], **kw).aggregate; g = S.simulate(w, cost, n, tab["goodput" if n > 1 else "plan"], **kw).aggregate
        else:
            ns["CHUNK_ROW"] = chunk_row
            p = ns["simulate"](w, cost, n, tab["plain"], **kw).aggregate; g = ns["simulate"](w, cost, n, tab["goodput" if n > 1 else "plan"], **kw).aggregate
        out.append(f"N={n}: plain {p:.1f} ({p/meas[n]['plain']-1:+.1%}) spec {g:.1f} ({g/meas[n]['auto']-1:+.1%}) spec/plain {g/p:.2f}")
    print("chunk row", chunk_row); print("\n".join(out))
