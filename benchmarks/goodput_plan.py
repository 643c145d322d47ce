"""plan --concurrency 1,2,4,8,16 --validate on a saved plan: predictions, then the load test.

    .venv/bin/python benchmarks/goodput_plan.py OUT_DIR PLAN_JSON [--passes-only]

2 questions per client, every turn of each one request, up to the plan's max_new_tokens a turn
(the workload the plan's acceptance was measured on). The first run (2026-12-01 22:31) passed
max_new_tokens=64 and its load test sent first turns only, so it predicted one workload and
measured another (benchmarks/results/goodput/NOTE.md). ``benchmarks/goodput_rescore.py``
scores a finished folder again.
"""
import sys
import time
from pathlib import Path

from draftwise import load_model
from draftwise.capacity.plan import run_concurrency
from draftwise.capacity.report import render_concurrency_markdown
from draftwise.cost.profile import Profile, default_profile_path
from draftwise.planner.plan_file import load_plan
from draftwise.server.served_profile import resolve_served_profile
from draftwise.server.validate import measure_concurrency

out = Path(sys.argv[1]); plan_path = Path(sys.argv[2])
passes_only = "--passes-only" in sys.argv[3:]  # price the passes alone, as the runs before the served step did
model = load_model("default")
plan = load_plan(plan_path)
profile = Profile.load(default_profile_path(model))
t0 = time.time()
res = run_concurrency(model, plan, [1, 2, 4, 8, 16], out_dir=out, profile=profile, validate=True,
                      requests_per_client=2, plan_path=plan_path, export=["vllm", "tensorrt-llm"],
                      status=lambda s: print(s, flush=True), measure=measure_concurrency,
                      serve_profile=None if passes_only else resolve_served_profile)
print(render_concurrency_markdown(res))
print(f"took {time.time() - t0:.0f} s")
