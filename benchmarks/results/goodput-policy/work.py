"""The work each phase of a ``run_policy.py`` run did, from its servers' saved /metrics: no
timing, so none of the phase-to-phase noise of these shared cores. Per N and policy (median over
rounds; greedy outputs are the same in every round, so the counts repeat): generated tokens,
sequence-steps (one sequence in one pass: tokens - accepted - requests, since each pass commits a
sequence's accepted tokens plus one and its prompt's pass gives the first), speculative steps,
draft tokens proposed (tree nodes kept) and accepted, and rows verified (sequence-steps plus
proposed). Two policies that commit the same tokens in the same sequence-steps ran the same number
of passes; the one with fewer rows did less work in them.

    python benchmarks/results/goodput-policy/work.py DIR
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


COUNTED = ("generation_tokens_total", "request_success_total", "spec_decode_num_drafts_total",
           "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


def counters(text: str) -> dict[str, float]:
    """The counters ``work`` reads from a /metrics page, each summed over its labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("draftwise:")
            if name in COUNTED:
                out[name] = out.get(name, 0.0) + sample.value
    return out


def work(c: dict[str, float]) -> dict[str, float]:
    tokens, requests = c.get("generation_tokens_total", 0.0), c.get("request_success_total", 0.0)
    accepted, proposed = c.get("spec_decode_num_accepted_tokens_total", 0.0), c.get("spec_decode_num_draft_tokens_total", 0.0)
    steps = tokens - accepted - requests
    return {"tokens": tokens, "steps": steps, "spec_steps": c.get("spec_decode_num_drafts_total", 0.0),
            "proposed": proposed, "accepted": accepted, "rows": steps + proposed}


def main(folder: Path) -> None:
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for f in folder.glob("metrics-n*-*.txt"):
        m = re.match(r"metrics-n(\d+)-(.+?)(?:-r\d+)?\.txt$", f.name)
        if m:
            runs.setdefault((int(m.group(1)), m.group(2)), []).append(work(counters(f.read_text())))
    print("| N | policy | tokens | sequence-steps | tokens / step | speculative steps | proposed | accepted | "
          "rows verified | rows / step |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    order = {"plain": 0, "goodput": 1}
    for (n, pol), ws in sorted(runs.items(), key=lambda x: (x[0][0], order.get(x[0][1], 2), x[0][1])):
        w = {k: statistics.median(x[k] for x in ws) for k in ws[0]}
        print(f"| {n} | {pol} | {w['tokens']:.0f} | {w['steps']:.0f} | {w['tokens'] / w['steps']:.2f} | "
              f"{w['spec_steps']:.0f} | {w['proposed']:.0f} | {w['accepted']:.0f} | {w['rows']:.0f} | "
              f"{w['rows'] / w['steps']:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
