"""When a run_policy.py phase had its N requests in flight, from its server log (issue 27).

Each request's log line gives its end and its e2e latency, so its span; the first request (the
warm-up) is left out. Per log: the phase's wall time and tokens/s, the time-weighted mean of
requests in flight, the last moment ``--full`` were in flight, and tokens/s before and after it
(each request's tokens spread evenly over its span). No model runs.

    python benchmarks/results/goodput-policy/timeline.py DIR/server-n16-*.log [--full 16]
"""
import argparse
import datetime as dt
import re

LINE = re.compile(r"^(\S+ \S+) INFO draftwise: \S+ draft=\S+ .*tokens=(\d+) .*e2e=([\d.]+)s")


def spans(path: str) -> list[tuple[float, float, int]]:
    out = []
    for line in open(path):
        m = LINE.match(line)
        if m:
            end = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((end - float(m[3]), end, int(m[2])))
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--full", type=int, default=16, help="requests in flight that count as a full batch")
    args = ap.parse_args()
    print("| log | wall s | tok/s | mean in flight | full until s | tok/s full | tok/s after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in args.logs:
        reqs = spans(path)
        if not reqs:
            continue
        t0, t1 = min(r[0] for r in reqs), max(r[1] for r in reqs)
        events = sorted([(r[0], 1) for r in reqs] + [(r[1], -1) for r in reqs])
        live, last, area, full_until = 0, t0, 0.0, t0
        for t, d in events:
            area += live * (t - last)
            last, live = t, live + d
            if live >= args.full:
                full_until = t
        tokens = sum(r[2] for r in reqs)
        before = sum(r[2] * max(0.0, min(r[1], full_until) - r[0]) / (r[1] - r[0]) for r in reqs)
        head = before / (full_until - t0) if full_until > t0 else float("nan")
        tail = (tokens - before) / (t1 - full_until) if t1 > full_until else float("nan")
        print(f"| {path.split('/')[-1]} | {t1 - t0:.1f} | {tokens / (t1 - t0):.1f} | {area / (t1 - t0):.2f} | "
              f"{full_until - t0:.1f} | {head:.1f} | {tail:.1f} |")


if __name__ == "__main__":
    main()
