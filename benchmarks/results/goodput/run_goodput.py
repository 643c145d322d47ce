"""plan --concurrency 1,2,4,8,16 --validate on a saved plan: predictions, then the load test.

    .venv/bin/python benchmarks/results/goodput/run_goodput.py OUT_DIR PLAN_JSON

2 questions per client, every turn of each one request, up to the plan's max_new_tokens a turn
(the workload the plan's acceptance was measured on). The first run (2026-12-01 22:31) passed
max_new_tokens=64 and its load test sent first turns only, so it predicted one workload and
measured another; see docs/benchmarks.md.
"""
import sys
import time
from pathlib import Path

from draftwise import load_model
from draftwise.cost.capacity import render_concurrency_markdown, run_concurrency
from draftwise.cost.plan import load_plan
from draftwise.cost.profile import Profile, default_profile_path

out = Path(sys.argv[1]); plan_path = Path(sys.argv[2])
model = load_model("default")
plan = load_plan(plan_path)
profile = Profile.load(default_profile_path(model))
t0 = time.time()
res = run_concurrency(model, plan, [1, 2, 4, 8, 16], out_dir=out, profile=profile, validate=True,
                      requests_per_client=2, plan_path=plan_path, export=["vllm", "tensorrt-llm"],
                      status=lambda s: print(s, flush=True))
print(render_concurrency_markdown(res))
print(f"took {time.time() - t0:.0f} s")
