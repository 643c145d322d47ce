"""Price a served phase's passes with the batch profile, by kind of pass (issue 27).

Reads a ``DRAFTWISE_PASS_TRACE`` file (:mod:`draftwise.server.pass_trace`: one JSON line a pass)
and the batch profile, and prices each pass as the goodput simulation does: ``pass_time(B, R,
mean context)`` over all its sequences and rows, a prompt's rows at the profile's
``prompt_share`` where it has one (from 0dac0b2; run 21's tables priced them as verified rows). Passes are grouped by whether a prompt chunk
shares them and by the decoding rows a sequence (1, 2-3, 4-6, 7+); per group, the passes, the
seconds measured and priced, and their ratio. Then how the prompts entered: the passes that
carried a chunk, their mean prompt rows, and the decoding sequences a pass held, weighted by
its seconds. A trace may be gzipped (``.gz``). No model runs.

    python benchmarks/pass_trace_price.py TRACE.jsonl PROFILE-batch.json [TRACE2.jsonl ...]
"""
import gzip
import json
import sys
from collections import defaultdict

from draftwise.cost.batch_profile import BatchProfile


def band(rows_each: float) -> str:
    return "1" if rows_each <= 1 else "2-3" if rows_each <= 3 else "4-6" if rows_each <= 6 else "7+"


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    profile = BatchProfile.load(sys.argv[2])
    for path in [sys.argv[1], *sys.argv[3:]]:
        groups: dict[tuple[bool, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        passes = [json.loads(line) for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path))]
        for p in passes:
            decoding = p["sequences"] - p["prompting"]
            rows = max(profile.priced_rows(p["rows"], p["prompt_rows"]), p["sequences"])  # a prompt row at its share
            price = profile.pass_time(min(p["sequences"], profile.max_batch), rows, p["context"] / p["sequences"])
            key = (p["prompt_rows"] > 0, band(p["rows"] / decoding) if decoding else "-")
            g = groups[key]
            g[0] += 1
            g[1] += p["seconds"]
            g[2] += price
        print(f"\n{path}\n\n| prompt chunk | rows a decoding sequence | passes | measured s | priced s | priced / measured |")
        print("|---|---|---:|---:|---:|---:|")
        for (chunk, b), (n, meas, priced) in sorted(groups.items()):
            print(f"| {'yes' if chunk else 'no'} | {b} | {n} | {meas:.2f} | {priced:.2f} | {priced / meas:.2f} |")
        n, meas, priced = (sum(g[i] for g in groups.values()) for i in range(3))
        print(f"| all | | {n} | {meas:.2f} | {priced:.2f} | {priced / meas:.2f} |")
        chunks = [p["prompt_rows"] for p in passes if p["prompt_rows"]]
        weighted = sum((p["sequences"] - p["prompting"]) * p["seconds"] for p in passes) / meas
        print(f"\n{len(chunks)} of {n} passes carried a prompt chunk, {sum(chunks) / max(len(chunks), 1):.1f} prompt "
              f"rows on average; decoding sequences a pass, weighted by its seconds: {weighted:.2f}")


if __name__ == "__main__":
    main()
