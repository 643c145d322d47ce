"""Offline greedy replay of copy drafts on recorded answers (`answers.jsonl`, written by
`answers.py`), each step chosen by `--k auto`'s policy and priced with the auto profile that
policy used (`auto_profile.json`, measured 2026-12-04 19:54 on the 2-core AMD EPYC, before the
attention kernel of 2f2a98a; the environment variable REPLAY_PROFILE names another). Prints,
per Spec-Bench group, the priced speedup over plain decoding (mean tokens/s over plain's) and
the tokens committed per target pass. No model runs. From the repository root:

    python benchmarks/results/planner/copy-union/replay.py "lookup;suffix;union;union:mode=fixed:prior=0.5;union:mode=choose"

`union...` is the prototype in `union.py` (options: mode=calib|fixed|choose|suffix_first,
decay, prior); `pick...` the one in `pick.py` (options: mode=request|session, decay, margin,
warm); anything else is a draft spec.
"""
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from draftwise.cost.adaptive import AdaptiveK
from draftwise.cost.profile import Profile
from draftwise.cost.replay import predict_seconds, replay_lookup
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import DraftSpec
from draftwise.questions import category_group

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pick import Pick  # noqa: E402
from union import Union  # noqa: E402

PROFILE = Profile.load(os.environ.get("REPLAY_PROFILE") or HERE / "auto_profile.json")
ROWS = [json.loads(line) for line in open(HERE / "answers.jsonl")]
EOS = {2}


def run(make, key):
    drafter = make()  # one drafter over all turns in file order, as one bench method keeps it
    out = []
    for r in ROWS:
        toks = r["tokens"]
        n = len(toks) - (1 if r["eos"] else 0)
        policy = AdaptiveK(PROFILE, key, capabilities=drafter.capabilities)
        steps = replay_lookup(drafter, r["prompt"], toks, policy, 128, eos_token_ids=EOS)
        t = predict_seconds(PROFILE, key, steps, len(r["prompt"]), 0.0, len(toks))
        plain = predict_seconds(PROFILE, "none", [(0, 0)] * (len(toks) - 1), len(r["prompt"]), 0.0, len(toks))
        out.append((r["category"], n / t, n / plain, len(toks) / (len(steps) + 1)))
    return out


def summarize(res):
    groups = defaultdict(list)
    for cat, rate, plain_rate, per_pass in res:
        groups[category_group(cat)].append((rate, plain_rate, per_pass))
        groups["overall"].append((rate, plain_rate, per_pass))
    return {g: (statistics.mean(x[0] for x in v) / statistics.mean(x[1] for x in v),
                statistics.mean(x[2] for x in v)) for g, v in groups.items()}


def per_question(name):
    """Each turn's (category, priced tokens/s, plain tokens/s, tokens a pass) for one draft name."""
    opts = dict(p.split("=") for p in name.split(":")[1:])
    if name.startswith("union"):
        kw = {k: float(v) if k in ("decay", "prior") else v for k, v in opts.items()}
        return run(lambda: Union(**kw), "suffix")
    if name.startswith("pick"):
        kw = {k: v if k == "mode" else float(v) for k, v in opts.items()}
        return run(lambda: Pick(**kw), "suffix")
    spec = DraftSpec.parse(name)
    return run(lambda: make_drafter(spec, None), str(spec))


def main():
    table = {name: summarize(per_question(name)) for name in sys.argv[1].split(";")}
    groups = list(next(iter(table.values())))
    print("| draft | " + " | ".join(groups) + " |")
    print("|---|" + "---:|" * len(groups))
    for name, res in table.items():
        print(f"| `{name}` | " + " | ".join(f"{res[g][0]:.3f}x ({res[g][1]:.2f})" for g in groups) + " |")


if __name__ == "__main__":
    main()
