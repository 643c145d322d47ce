"""How fast could a draft be with a perfect policy? An upper bound from recorded greedy answers.

For each turn of a finished ``draftwise bench`` run (its ``answers/none.jsonl``: the plain greedy
tokens), each draft replays the turn as it would decode it (prompt lookup and suffix decoding
are pure functions of the context, see ``draftwise.planner.replay``), proposing at ``--budget``
tokens or nodes each step. An *oracle* policy then verifies only the path that the target will
accept: a step that accepts ``a`` tokens costs ``T(a + 1)`` (the profile's step time) and commits
``a + 1``. No policy that verifies a prefix or a subtree of the same proposals can do better,
and drafting costs nothing here, the prefill is left out: real runs land below these bounds.

    python benchmarks/tree_oracle.py --bench benchmarks/results/hybrid \\
        --drafts "lookup,suffix,suffix:nodes=64,depth=24,factor=16,min_prob=0" --budget 64 \\
        --out benchmarks/results/tree-oracle

Writes ``oracle.json`` and ``oracle.md``. Beyond the profile's widest pass the step time grows
with the slope of its 8..max passes.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from draftwise.bench.runner import build_prompt
from draftwise.cost.profile import Profile, default_profile_path
from draftwise.planner.replay import accepted_along, answer
from draftwise.drafters import make_drafter
from draftwise.drafters.spec import split_draft_list
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, category_group, read_questions
from draftwise.core.sampling import SamplingConfig


def extrapolated_step_time(prof: Profile) -> Callable[[int, float], float]:
    """The profile's step time for n tokens at a context; beyond its widest pass, growing with
    the slope of its 8..max passes (also used by ``hybrid_oracle.py``)."""

    def step_time(n: int, context: float) -> float:
        top = prof.max_n
        if n <= top:
            return prof.step_time(n, context)
        slope = (prof.step_time(top, context) - prof.step_time(8, context)) / (top - 8)
        return prof.step_time(top, context) + (n - top) * slope

    return step_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="A finished bench folder (answers/none.jsonl).")
    ap.add_argument("--drafts", default="lookup,suffix")
    ap.add_argument("--budget", type=int, default=15, help="Tokens or nodes a draft may propose per step.")
    ap.add_argument("--profile", type=Path, default=None, help="Default: the model's cached profile.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/tree-oracle"))
    args = ap.parse_args()
    model = load_model("default")
    prof = Profile.load(args.profile or default_profile_path(model))
    questions = {q.question_id: q for q in read_questions(DEFAULT_QUESTIONS)}
    drafts = split_draft_list(args.drafts)
    drafters = {d: make_drafter(d, model) for d in drafts}  # each its own cache, grown in bench order

    step_time = extrapolated_step_time(prof)
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in (args.bench / "answers" / "none.jsonl").read_text().splitlines():
        row = json.loads(line)
        q, choice = questions[row["question_id"]], row["choices"][0]
        for t, tokens in enumerate(choice["token_ids"]):
            prompt = build_prompt(model, list(q.turns[: t + 1]), list(choice["turns"][:t]))
            plain = sum(step_time(1, len(prompt) + i) for i in range(1, len(tokens)))
            for group in (category_group(row["category"]), "overall"):
                acc[group]["tokens"] += len(tokens) - 1
                acc[group]["plain_s"] += plain
            for name, drafter in drafters.items():
                drafter.start(list(prompt), SamplingConfig(), torch.Generator())
                context, pos, seconds, passes = list(prompt) + tokens[:1], 1, 0.0, 0
                while pos < len(tokens):
                    draft = drafter.propose(context, min(args.budget, len(tokens) - pos - 1))
                    a = accepted_along(draft, tokens[pos:]) if draft.tokens else 0
                    drafter.observe(a)
                    seconds += step_time(a + 1, len(context))
                    passes += 1
                    context.extend(tokens[pos : pos + a + 1])
                    pos += a + 1
                drafter.end(answer(tokens, model.eos_token_ids))
                for group in (category_group(row["category"]), "overall"):
                    acc[group][f"{name} seconds"] += seconds
                    acc[group][f"{name} passes"] += passes
    result = {"bench": str(args.bench), "budget": args.budget, "drafts": drafts,
              "groups": {g: {"tokens": int(v["tokens"]), **{d: {"bound": v["plain_s"] / v[f"{d} seconds"],
                                                               "mat": v["tokens"] / v[f"{d} passes"]} for d in drafts}}
                         for g, v in acc.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "oracle.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Oracle bounds: each step verifies only the path that will be accepted (budget {args.budget})", "",
             f"Answers: `{args.bench}/answers/none.jsonl`. Cells: speedup bound over plain decoding / #MAT.", "",
             "| group | tokens | " + " | ".join(f"`{d}`" for d in drafts) + " |", "|---|--:|" + "--:|" * len(drafts)]
    for g, v in result["groups"].items():
        lines.append(f"| {g} | {v['tokens']} | " + " | ".join(f"{v[d]['bound']:.2f}x / {v[d]['mat']:.2f}" for d in drafts) + " |")
    lines += ["", "```", f"python benchmarks/tree_oracle.py --bench {args.bench} --drafts \"{args.drafts}\" "
              f"--budget {args.budget} --out {args.out}", "```", ""]
    (args.out / "oracle.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
