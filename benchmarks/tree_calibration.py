"""Do suffix decoding's tree scores promise what the target accepts, under `--k auto` at batch?

N greedy generations of dev first turns decode together on the batched engine, each with its own
suffix drafter (one shared cache, as ``serve`` runs them) and the goodput policy choosing every
step from the batch profile (``--mode batch``), or each its own adaptive k as if alone (``--mode
alone``). For every step that kept part of a scored tree it records: the nodes proposed, the
nodes kept, the scores' sum over the kept nodes (raw), the same calibrated as the policy
priced them (``lam`` for that size of tree), and the draft tokens the target accepted. By
proposed size it reports how much of its scores a tree delivered: a policy that over-prices one
size keeps trees the batch does not pay for.

    python benchmarks/tree_calibration.py --batch 8 --mode batch --out benchmarks/results/tree-calibration/batch-8

Needs the model's batch profile (``draftwise plan --concurrency ...`` measures it). Writes
``summary.json`` (every step) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from draftwise.policy.adaptive import AdaptiveK, resolve_profile
from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from draftwise.policy.batch import BatchGoodput, BatchKCoordinator
from draftwise.drafters.factory import make_drafter
from draftwise.core.engine import Engine
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions


class Recorder:
    """A k policy that passes everything to ``inner`` and records each kept tree's outcome."""

    def __init__(self, inner: Any, adaptive: AdaptiveK, log: list[dict[str, Any]],
                 firsts: list[dict[str, Any]] | None = None) -> None:
        self.inner, self.adaptive, self.log = inner, adaptive, log
        self.firsts = firsts if firsts is not None else []
        self.k_max, self.shadow = inner.k_max, inner.shadow
        self._open: dict[str, Any] | None = None
        self._first: dict[str, Any] | None = None

    def choose(self, context_len: int) -> int:
        return self.inner.choose(context_len)

    def trim(self, draft: Any, context_len: int) -> Any:
        kept = self.inner.trim(draft, context_len)
        if not draft.scores or not draft.tokens:
            return kept
        size, n = len(draft.tokens), len(kept.tokens)
        priced = self._priced(draft.scores[: max(n, 1)], size)
        if n:
            self._open = {"proposed": size, "kept": n, "raw": sum(draft.scores[:n]), "priced": sum(priced)}
        # every proposed tree: its best node, priced and checked
        self._first = {"proposed": size, "kept": n, "score": draft.scores[0], "priced": priced[0]}
        return kept

    def _priced(self, scores: Any, size: int) -> list[float]:
        """The nodes' expected tokens as the policy priced them (before the best node was
        priced apart, every node at lam times its score; before commit 0a8f8ea, one lam for
        every size)."""
        node_tokens = getattr(self.adaptive, "node_tokens", None)
        if node_tokens:
            return node_tokens(scores, size)
        try:
            lam = self.adaptive.calibration(size)
        except TypeError:
            lam = self.adaptive.calibration()
        return [min(1.0, lam * s) for s in scores]

    def observe(self, positions: int, accepted: int) -> None:
        if self._open is not None:
            self.log.append({**self._open, "accepted": accepted})
            self._open = None
        if self._first is not None and self._first["kept"]:
            self.firsts.append({**self._first, "accepted": int(accepted > 0)})
            self._first = None
        self.inner.observe(positions, accepted)

    def observe_shadow(self, proposal: Any, committed: Any) -> None:
        if self._first is not None and not self._first["kept"] and proposal and committed:
            self.firsts.append({**self._first, "accepted": int(proposal[0] == committed[0])})
            self._first = None
        self.inner.observe_shadow(proposal, committed)

    def release(self) -> None:
        getattr(self.inner, "release", lambda: None)()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mode", choices=("batch", "alone"), default="batch")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    model = load_model(args.model)
    profile = resolve_profile(model, ["suffix"])
    batch = BatchProfile.load(default_batch_profile_path(model))
    prompts = [model.encode_prompt(q.turns[0]) for q in read_questions(DEFAULT_QUESTIONS)[: args.prompts]]
    engine = Engine(model, max_batch=args.batch, context=2048)
    shared = make_drafter("suffix", model)
    drafters = [make_drafter("suffix", m, share_with=shared) for m in engine.slot_models]
    coordinator = BatchKCoordinator(BatchGoodput(batch, profile), epoch=lambda: engine.stats.passes)
    log: list[dict[str, Any]] = []
    firsts: list[dict[str, Any]] = []  # every proposed tree's best node: priced, and whether the target took it
    try:  # one TreeSizes for every generation, as the server keeps one per draft
        from draftwise.policy.adaptive import TreeSizes
        sizes: dict[str, Any] = {"tree_sizes": TreeSizes()}
    except ImportError:  # before commit 1dbcf47: each generation on its own
        sizes = {}

    def policy() -> Recorder:
        adaptive = AdaptiveK(profile, "suffix", capabilities=shared.capabilities, **sizes)
        inner = coordinator.policy(adaptive, "suffix") if args.mode == "batch" else adaptive
        return Recorder(inner, adaptive, log, firsts)

    t0 = time.perf_counter()
    results = engine.generate_all(prompts, max_new_tokens=args.max_tokens, drafters=drafters, k=policy)
    wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    by: dict[int, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for row in log:
        b = by[row["proposed"]]
        b[0] += 1
        b[1] += row["raw"]
        b[2] += row["priced"]
        b[3] += row["accepted"]
    sizes = [{"proposed": k, "steps": int(v[0]), "raw": v[1] / v[0], "priced": v[2] / v[0], "accepted": v[3] / v[0],
              "accepted_over_raw": v[3] / v[1] if v[1] else None} for k, v in sorted(by.items())]
    first_rows = []
    for kept in (False, True):
        rows = [r for r in firsts if bool(r["kept"]) == kept]
        if rows:
            first_rows.append({"kept": kept, "steps": len(rows), "score": sum(r["score"] for r in rows) / len(rows),
                               "priced": sum(r["priced"] for r in rows) / len(rows),
                               "accepted": sum(r["accepted"] for r in rows) / len(rows)})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python benchmarks/tree_calibration.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = {"model": model.name, "batch": args.batch, "mode": args.mode, "prompts": len(prompts),
               "max_tokens": args.max_tokens, "passes": engine.stats.passes, "tokens": tokens, "seconds": wall,
               "by_size": sizes, "first_node": first_rows, "steps": log,
               "first_nodes": firsts, "commit": commit, "command": command}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "summary.json", summary)
    lines = [f"# suffix trees under k auto: {args.mode}, {args.batch} sequences a pass", "",
             f"{model.name}, {len(prompts)} dev first turns, greedy, {args.max_tokens} tokens; commit {commit}; "
             f"{tokens} tokens in {engine.stats.passes} passes, {wall:.1f} s.", "", f"    {command}", "",
             "| nodes proposed | steps | scores kept (raw) | as priced | draft tokens accepted | accepted / raw |",
             "|---:|---:|---:|---:|---:|---:|",
             *[f"| {s['proposed']} | {s['steps']} | {s['raw']:.2f} | {s['priced']:.2f} | {s['accepted']:.2f} | "
               f"{'-' if s['accepted_over_raw'] is None else format(s['accepted_over_raw'], '.2f')} |" for s in sizes],
             "", "Each proposed tree's best node (its first draft token): as the policy priced it, and how often the "
             "target took it (kept: the first draft token was accepted; not kept, a plain step: the committed "
             "token equals it).", "",
             "| tree kept | steps | score | as priced | taken |", "|---|---:|---:|---:|---:|",
             *[f"| {'yes' if r['kept'] else 'no'} | {r['steps']} | {r['score']:.2f} | {r['priced']:.2f} | "
               f"{r['accepted']:.2f} |" for r in first_rows]]
    write_text_atomic(args.out / "summary.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
