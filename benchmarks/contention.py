"""N draftwise processes decoding at once: aggregate tokens/s under draftwise's OpenMP policy
and under OpenMP's own defaults.

    python benchmarks/contention.py --procs 1,2,3 --seconds 15 --out benchmarks/results/contention

Each worker is a fresh process that imports draftwise (so ``draftwise.threads`` applies its
defaults, or not), loads the model, warms up, and waits at a barrier; then all of a run's
workers decode together for ``--seconds``: plain greedy ``draftwise.stream`` over the dev
questions, ``--max-new-tokens`` per prompt, counting committed tokens until the shared
deadline. A run's aggregate is the sum of its workers' tokens/s.

Configurations (``--config NAME:VAR=VALUE,VAR=VALUE``, repeatable) are environments; the
OpenMP variables (``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY``, ``OMP_NUM_THREADS``,
``DRAFTWISE_OMP_DEFAULTS``, ``DRAFTWISE_SHARE_CORES``) are first removed from the inherited
environment so each configuration says exactly what it runs under. Without ``--config`` three
are run:

- ``draftwise``: nothing set, so draftwise's defaults apply (cores shared by thread count);
- ``openmp-default``: ``DRAFTWISE_OMP_DEFAULTS=0``, libgomp's own defaults, no sharing;
- ``spin3000``: ``DRAFTWISE_SHARE_CORES=0``, no sharing by threads, a short spin instead.

Runs are interleaved (for each repeat, for each N, every configuration). Run it alone on the
machine: anything else running changes the figures. Writes ``contention.json`` (every worker)
and ``contention.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OMP_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "DRAFTWISE_OMP_DEFAULTS", "DRAFTWISE_SHARE_CORES")
DEFAULT_CONFIGS = ("draftwise:", "openmp-default:DRAFTWISE_OMP_DEFAULTS=0", "spin3000:DRAFTWISE_SHARE_CORES=0")
HERE = Path(__file__).resolve().parent


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    """``"spin1k:GOMP_SPINCOUNT=1000,OMP_NUM_THREADS=2"`` -> ``("spin1k", {...})``."""
    name, _, rest = text.partition(":")
    env: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        var, eq, value = item.partition("=")
        if not eq or not var:
            raise SystemExit(f"error: --config {text!r}: {item!r} is not VAR=VALUE")
        env[var] = value
    if not name:
        raise SystemExit(f"error: --config {text!r} has no name before ':'")
    return name, env


# --- one worker -------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import draftwise  # first: the OpenMP defaults are applied (or not) before torch loads
    from draftwise.questions import DEFAULT_QUESTIONS, read_questions
    from draftwise.threads import set_threads

    threads = set_threads(args.threads)
    model = draftwise.load_model(args.model, dtype=args.dtype)
    prompts = [q.prompt for q in read_questions(DEFAULT_QUESTIONS)]
    draftwise.generate(model, prompts[0], max_new_tokens=8)  # warm-up
    sync = Path(args.sync)
    (sync / f"ready-{args.index}").touch()
    go = sync / "go"
    while not go.exists():
        time.sleep(0.02)
    start = float(go.read_text())
    time.sleep(max(0.0, start - time.time()))
    t0 = time.perf_counter()
    end = t0 + args.seconds
    tokens = passes = 0
    i = args.index  # workers start on different prompts
    while time.perf_counter() < end:
        s = draftwise.stream(model, prompts[i % len(prompts)], max_new_tokens=args.max_new_tokens)
        for _ in s.by_step():
            if time.perf_counter() >= end:
                break
        s.close()
        tokens += s.stats.committed
        passes += s.stats.target_passes
        i += 1
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "index": args.index, "tokens": tokens, "passes": passes, "seconds": seconds,
        "tokens_per_second": tokens / seconds, "threads": threads,
        "env": {v: os.environ.get(v) for v in OMP_VARS},
    }), flush=True)


# --- the parent -------------------------------------------------------------------------------


def run_group(args: argparse.Namespace, env_extra: dict[str, str], n: int) -> list[dict[str, Any]]:
    """Start ``n`` workers under ``env_extra``, release them together, return their results."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(env_extra)
    with tempfile.TemporaryDirectory(prefix="dw-contention-") as sync:
        base = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sync", sync,
                "--model", args.model, "--dtype", args.dtype, "--seconds", str(args.seconds),
                "--max-new-tokens", str(args.max_new_tokens)]
        if args.threads is not None:
            base += ["--threads", str(args.threads)]
        procs = [subprocess.Popen([*base, "--index", str(i)], env=env, stdout=subprocess.PIPE, text=True)
                 for i in range(n)]
        deadline = time.time() + args.load_timeout
        while sum(Path(sync, f"ready-{i}").exists() for i in range(n)) < n:
            if any(p.poll() is not None for p in procs) or time.time() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit("error: a worker failed or did not get ready in time")
            time.sleep(0.05)
        Path(sync, "go").write_text(repr(time.time() + 0.2))
        results = []
        for p in procs:
            stdout, _ = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"error: a worker exited with status {p.returncode}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def summarise(runs: list[dict[str, Any]], names: list[str], procs: list[int]) -> list[dict[str, Any]]:
    """One row per (config, N): mean aggregate over repeats, and ratios to one process alone."""
    def agg(name: str, n: int) -> float | None:
        vals = [r["aggregate"] for r in runs if r["config"] == name and r["procs"] == n]
        return sum(vals) / len(vals) if vals else None

    baseline = "openmp-default" if "openmp-default" in names else None
    rows = []
    for name in names:
        alone = agg(name, 1)
        base_alone = agg(baseline, 1) if baseline else None
        for n in procs:
            a = agg(name, n)
            per = [w["tokens_per_second"] for r in runs if r["config"] == name and r["procs"] == n
                   for w in r["workers"]]
            rows.append({
                "config": name, "procs": n, "aggregate": a,
                "per_process_min": min(per), "per_process_max": max(per),
                "vs_own_alone": a / alone if a is not None and alone else None,
                "vs_default_alone": a / base_alone if a is not None and base_alone else None,
            })
    return rows


def render(report: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = [
        "# Contention: N draftwise processes at once",
        "",
        f"`{report['command']}`",
        "",
        f"Model `{report['model']}` ({report['dtype']}), {report['cpus']} CPUs, "
        f"{report['seconds']} s of plain greedy decoding per run, {report['repeats']} repeat(s), "
        "runs interleaved. Aggregate = sum of the processes' tokens/s (mean over repeats).",
        "",
        "| config | environment | N | aggregate tok/s | per process (min-max) | x own alone | x openmp-default alone |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in report["summary"]:
        env = ", ".join(f"{k}={v}" for k, v in report["configs"][r["config"]].items()) or "(draftwise defaults)"
        lines.append(
            f"| {r['config']} | {env} | {r['procs']} | {f(r['aggregate'])} | "
            f"{f(r['per_process_min'])}-{f(r['per_process_max'])} | {f(r['vs_own_alone'], '.2f')} | "
            f"{f(r['vs_default_alone'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--procs", default="1,2,3", help="comma-separated process counts")
    parser.add_argument("--seconds", type=float, default=15.0, help="timed decoding per run")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per prompt")
    parser.add_argument("--threads", type=int, default=None, help="--threads for every worker")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--config", action="append", help="NAME:VAR=VALUE,... (repeatable)")
    parser.add_argument("--load-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "contention")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sync", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    from draftwise.fsutil import check_writable, write_json_atomic, write_text_atomic

    check_writable(args.out)
    configs = dict(parse_config(c) for c in (args.config or DEFAULT_CONFIGS))
    procs = [int(p) for p in args.procs.split(",") if p.strip()]
    if not procs or min(procs) < 1 or args.repeats < 1 or args.seconds <= 0:
        raise SystemExit("error: --procs, --repeats and --seconds must be positive")
    if 1 not in procs:
        procs = [1, *procs]  # the ratios need a process alone
    runs = []
    for rep in range(args.repeats):
        for n in procs:
            for name, env in configs.items():
                workers = run_group(args, env, n)
                total = sum(w["tokens_per_second"] for w in workers)
                runs.append({"config": name, "procs": n, "repeat": rep, "aggregate": total, "workers": workers})
                print(f"{name:>16} N={n} aggregate {total:6.1f} tok/s  "
                      "(" + " + ".join(f"{w['tokens_per_second']:.1f}" for w in workers) + ")", file=sys.stderr, flush=True)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    report = {
        "command": command, "model": args.model, "dtype": args.dtype, "cpus": os.cpu_count(),
        "seconds": args.seconds, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
        "threads": args.threads, "configs": configs, "runs": runs,
        "summary": summarise(runs, list(configs), procs),
    }
    write_json_atomic(args.out / "contention.json", report)
    md = render(report)
    write_text_atomic(args.out / "contention.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
