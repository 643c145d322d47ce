"""The concurrency prediction for run 35 (issue 27): the plan of `benchmarks/results/goodput/run-kernel/`
(copied to plan/plan.json) with this machine's cached profiles, 2 questions a client, every turn,
N = 1-16; writes plan/concurrency.json (.md, .png), which `serve --plan plan/plan.json` reads.

    python benchmarks/results/goodput-policy/run35-limit/predict.py
"""
from pathlib import Path

from draftwise.cost.adaptive import resolve_profile
from draftwise.cost.capacity import run_concurrency
from draftwise.cost.plan import load_plan
from draftwise.loaders import load_model

here = Path(__file__).parent / "plan"
model = load_model("default")
plan = load_plan(here / "plan.json")
profile = resolve_profile(model, list(plan.drafts))
result = run_concurrency(model, plan, [1, 2, 4, 8, 16], out_dir=here, profile=profile, requests_per_client=2,
                         status=print)
for row in result["rows"]:
    g = row["policies"]["goodput"]
    print(row["n"], round(g["vs_plain"], 3), [round(x, 3) for x in g["vs_plain_interval"]])
