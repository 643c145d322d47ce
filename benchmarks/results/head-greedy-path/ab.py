"""The hybrid's drafting time per pass with the head's greedy chain drafted two ways, interleaved
turn by turn in one process on the same questions:

- ``old``: ``EagleDrafter.propose`` as of commit 94335a8 (full-vocabulary logits each token, and a
  softmax over them for the chain's scores);
- ``new``: the package's (the argmax and its probability over the head's own rows).

    python benchmarks/results/head-greedy-path/ab.py --questions 12 --out OUT

Writes ``ab.json`` and ``ab.md``; every turn's output is checked equal between the two.
"""
import argparse
import json
import statistics
import subprocess
import textwrap
import types
from collections.abc import Sequence
from pathlib import Path

import torch

from draftwise.decode import generate
from draftwise.drafters import make_drafter
from draftwise.drafters.base import Draft, draft_autoregressive
from draftwise.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions

OLD = "94335a8"


def old_propose() -> types.FunctionType:
    src = subprocess.run(["git", "show", f"{OLD}:src/draftwise/drafters/eagle.py"], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).parent).stdout
    start = src.index("    def propose(self, context: Sequence[int], k: int, *, scored: bool = False)")
    end = src.index("    def propose_scored", start)
    ns = {"torch": torch, "Sequence": Sequence, "Draft": Draft, "draft_autoregressive": draft_autoregressive}
    exec(textwrap.dedent(src[start:end]), ns)
    return ns["propose"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = load_model("default")
    drafters = {"new": make_drafter("suffix+eagle:default", model), "old": make_drafter("suffix+eagle:default", model)}
    drafters["old"].head.propose = types.MethodType(old_propose(), drafters["old"].head)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for i, q in enumerate(read_questions(DEFAULT_QUESTIONS)[: args.questions]):
        for name in (("old", "new") if i % 2 else ("new", "old")):
            r = generate(model, q.turns[0], max_new_tokens=128, draft=drafters[name], k=args.k)
            runs[name].append({"question_id": q.question_id, "draft_s": r.stats.draft_seconds,
                               "passes": r.stats.target_passes, "seconds": r.seconds,
                               "tokens": r.new_tokens, "token_ids": r.token_ids})
    rows = {}
    for name, turns in runs.items():
        passes = sum(t["passes"] for t in turns)
        rows[name] = {"draft_ms_per_pass": 1e3 * sum(t["draft_s"] for t in turns) / passes, "passes": passes,
                      "tokens": sum(t["tokens"] for t in turns), "seconds": sum(t["seconds"] for t in turns)}
        rows[name]["tok_s"] = rows[name]["tokens"] / rows[name]["seconds"]
    ratio = statistics.median((b["draft_s"] / b["passes"]) / (a["draft_s"] / a["passes"])
                              for a, b in zip(runs["old"], runs["new"]))
    equal = sum(a["token_ids"] == b["token_ids"] for a, b in zip(runs["old"], runs["new"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab.json").write_text(json.dumps({"rows": rows, "median_turn_ratio": ratio, "equal": equal,
                                                  "turns": len(runs["new"]), "k": args.k, "runs": runs}, indent=1))
    lines = ["| path | drafting ms/pass | passes | tokens | tok/s (prefill included) |", "|---|--:|--:|--:|--:|"]
    lines += [f"| {n} | {r['draft_ms_per_pass']:.2f} | {r['passes']} | {r['tokens']} | {r['tok_s']:.2f} |" for n, r in rows.items()]
    lines += ["", f"Median over turns of new/old drafting ms per pass: {ratio:.3f}; outputs equal {equal}/{len(runs['new'])}."]
    (args.out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
