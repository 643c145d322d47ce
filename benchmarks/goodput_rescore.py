"""Score a finished ``goodput_plan.py`` folder again, without running the model: its load test's
measurements (``measured.json``) against the prediction of the requests it sent, from the
profiles it used (``profile.json`` and ``batch-profile.json`` in the folder). Rewrites
``concurrency.json``'s validation and ``concurrency.md``.

    .venv/bin/python benchmarks/goodput_rescore.py DIR [PLAN_JSON] [--policy served|plan|goodput]

``served`` (the default since 2026-12-05) predicts what ``serve --k auto`` runs: each request's
adaptive k at N = 1, the goodput policy at N > 1; runs before then were scored against ``plan`` at
every N, though their servers ran the goodput policy at N > 1.
"""
import argparse
import json
from pathlib import Path

from draftwise import load_model
from draftwise.capacity.plan import score_load
from draftwise.capacity.report import render_concurrency_markdown
from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.profile import Profile
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.planner.plan_file import load_plan

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("dir", type=Path)
ap.add_argument("plan", type=Path, nargs="?", help="default: DIR/plan.json")
ap.add_argument("--policy", default="served")
args = ap.parse_args()
out = args.dir
model = load_model("default")
plan = load_plan(args.plan or out / "plan.json")
result = json.loads((out / "concurrency.json").read_text())
raw = json.loads((out / "measured.json").read_text())
result["validation"] = score_load(model, plan, BatchProfile.load(out / "batch-profile.json"),
                                  Profile.load(out / "profile.json"), raw, args.policy,
                                  limit=result.get("speculating_limit"))
write_json_atomic(out / "concurrency.json", result)
write_text_atomic(out / "concurrency.md", render_concurrency_markdown(result))
v = result["validation"]
print(f"{out}: policy {v['policy']}, median |error| {v['median_error'] * 100:.1f}%, max {v['max_error'] * 100:.1f}%, "
      f"crossover measured {v['measured_crossover']}, predicted {v['predicted_crossover']}")
