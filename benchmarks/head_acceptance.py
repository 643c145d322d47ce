"""Is the exported EAGLE-3 head as good in vLLM as in draftwise? The same head, the same k, the same
prompts: vLLM's ``spec_decode`` counters from a ``peer_bench.py`` run against draftwise's own
statistics, decoding those prompts here.

    python benchmarks/head_acceptance.py --peer-run out/peer-f32 --clients 1,2,4 --k 3 \\
        --out benchmarks/results/peers/head-acceptance

1. vLLM: the ``vllm:eagle3`` rows of the peer run (``summary.json``) at the given N, their counters'
   growth over each phase summed: draft tokens proposed and accepted (vLLM's ``eagle3`` method
   proposes one chain of ``num_speculative_tokens``).
2. draftwise: the very prompts those phases sent (``run.json``'s assignment), as the server
   encodes a one-message chat, decoded greedily here with ``eagle:default,topk=1`` (one chain) at
   the same fixed k and ``max_tokens``, one after the other: proposed and accepted draft tokens.
3. The goal: draftwise's acceptance (accepted / proposed) and vLLM's within 10% of each other.

Writes ``head_acceptance.json`` and ``head_acceptance.md`` in ``--out``. Run it when nothing else
runs (it loads the model), though it times nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from draftwise.api import generate
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.loaders import load_model


def vllm_counts(summary: dict[str, Any], ns: list[int], dtype: str) -> dict[str, int]:
    """Draft tokens proposed and accepted by ``vllm:eagle3`` over the phases at ``ns``."""
    out = {"draft_tokens": 0, "accepted": 0, "drafts": 0}
    rows = [r for r in summary["rows"] if r["config"] == "vllm:eagle3" and r["dtype"] == dtype and r["n"] in ns]
    if {r["n"] for r in rows} != set(ns):
        raise SystemExit(f"the peer run has no vllm:eagle3 ({dtype}) rows at every N of {ns}")
    for r in rows:
        spec = r.get("spec") or {}
        for key in out:
            out[key] += int(spec.get(key) or 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-run", type=Path, required=True, help="a peer_bench.py output folder with vllm:eagle3")
    ap.add_argument("--clients", default="1,2,4", help="the N whose prompts are compared")
    ap.add_argument("--k", type=int, default=3, help="the head's fixed k (vLLM's num_speculative_tokens)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft", default="eagle:default,topk=1", help="draftwise's spec of the same head, one chain")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ns = [int(x) for x in args.clients.split(",")]
    summary = json.loads((args.peer_run / "summary.json").read_text())
    run = json.loads((args.peer_run / "run.json").read_text())
    if summary["config"]["num_spec_tokens"] != args.k:
        raise SystemExit(f"the peer run's vLLM proposed k={summary['config']['num_spec_tokens']}, not --k {args.k}")
    vllm = vllm_counts(summary, ns, args.dtype)
    indices = sorted({p for n in ns for client in run["assignment"][str(n)] for p in client})
    model = load_model("default", dtype=args.dtype)
    proposed = accepted = tokens = 0
    t0 = time.perf_counter()
    for i in indices:
        ids = encode_conversation(model.tokenizer, [run["prompts"][i]["text"]], [], chat=True)
        result = generate(model, ids, draft=args.draft, k=args.k, max_new_tokens=summary["config"]["max_tokens"])
        proposed, accepted, tokens = proposed + result.stats.proposed, accepted + result.stats.accepted, \
            tokens + len(result.token_ids)
    ours = accepted / proposed if proposed else float("nan")
    theirs = vllm["accepted"] / vllm["draft_tokens"] if vllm["draft_tokens"] else float("nan")
    out = {"clients": ns, "k": args.k, "dtype": args.dtype, "prompts": len(indices), "draft": args.draft,
           "draftwise": {"proposed": proposed, "accepted": accepted, "acceptance": ours, "new_tokens": tokens,
                         "seconds": time.perf_counter() - t0},
           "vllm": {**vllm, "acceptance": theirs}, "ratio": theirs / ours if ours else None,
           "within_10pct": abs(theirs / ours - 1) <= 0.10 if ours else False, "peer_run": str(args.peer_run)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "head_acceptance.json", out)
    md = ("| engine | draft tokens proposed | accepted | acceptance |\n|---|---:|---:|---:|\n"
          f"| draftwise `{args.draft}` k={args.k} | {proposed} | {accepted} | {ours:.3f} |\n"
          f"| vLLM `eagle3` k={args.k} | {vllm['draft_tokens']} | {vllm['accepted']} | {theirs:.3f} |\n\n"
          f"vLLM / draftwise: {out['ratio']:.3f} ({'within' if out['within_10pct'] else 'outside'} 10%), "
          f"on the {len(indices)} prompts the peer run sent at N = {args.clients} ({args.dtype}).\n")
    write_text_atomic(args.out / "head_acceptance.md", md)
    print(md)


if __name__ == "__main__":
    main()
