import sys, time
from pathlib import Path
from draftwise import load_model
from draftwise.cost.plan import load_plan
from draftwise.cost.profile import Profile, default_profile_path
from draftwise.cost.capacity import run_concurrency, render_concurrency_markdown
out = Path(sys.argv[1]); plan_path = Path(sys.argv[2])
model = load_model("default")
plan = load_plan(plan_path)
profile = Profile.load(default_profile_path(model))
t0 = time.time()
res = run_concurrency(model, plan, [1, 2, 4, 8, 16], out_dir=out, profile=profile, validate=True,
                      requests_per_client=2, max_new_tokens=64, plan_path=plan_path, export=["vllm", "tensorrt-llm"],
                      status=lambda s: print(s, flush=True))
print(render_concurrency_markdown(res))
print(f"took {time.time() - t0:.0f} s")
