"""Acceptance and speedup of a distilled draft against its training time.

Evaluates the draft as it was at step 0 (the target's layers, untrained) and at each snapshot a
``draftwise distill --snapshot-every N`` run kept, on prompts the run held out: the held-out
first turns of the MT-bench-style categories (writing, roleplay, reasoning, stem, humanities),
where prompt lookup does not help, and of the other categories. Each prompt is decoded plainly
and speculatively back to back (greedy, order alternating), so every point's speedup is a ratio
measured in one run.

    python benchmarks/distill_curve.py --run runs/smol4-v8k --k 3 \\
        --out benchmarks/results/distill

Writes curve.json, curve.md and curve.png to --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from draftwise import load_model
from draftwise.distill import build_draft, evaluate_draft, split_questions
from draftwise.training.checkpoint import load_snapshot
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.questions import DEFAULT_QUESTIONS, read_questions

MT_BENCH_STYLE = ("writing", "roleplay", "reasoning", "stem", "humanities")


def snapshot_weights(run: Path, step: int, target: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The draft's whole state at ``step`` (0 = as initialised from the target) and its log entry."""
    from safetensors.torch import load_file

    weights = load_file(str(run / "model.safetensors"))
    if step == 0:  # the draft as distill builds it before the first step
        meta = json.loads((run / "draftwise_draft.json").read_text())
        start = build_draft(target, meta["layers"], init_layers=meta["init_layers"], hidden_size=meta["hidden_size"], seed=0)
        initial = start.state_dict()
        weights = {name: initial[name].detach().clone() for name in weights}
        return weights, {"step": 0, "seconds": 0.0, "tokens": 0, "loss": None}
    snap = load_snapshot(run / "checkpoints", step)  # torch.load(weights_only=True): a crafted file runs nothing
    weights.update(snap["weights"])
    return weights, {k: snap[k] for k in ("step", "seconds", "tokens", "loss")}


def materialise(run: Path, weights: dict[str, torch.Tensor], dest: Path) -> Path:
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"), metadata={"format": "pt"})
    for f in run.iterdir():
        if f.is_file() and f.suffix in (".json", ".jinja", ".txt") and f.name not in ("eval.json",):
            shutil.copy(f, dest / f.name)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, type=Path, help="a draftwise distill output folder with snapshots")
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="the file the run was trained from")
    ap.add_argument("--steps", default="all", help="comma-separated snapshot steps (0 = untrained), or all")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--other-per-category", type=int, default=1, help="held-out prompts per other category")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "distill")
    args = ap.parse_args()

    available = sorted(int(p.stem.split("-")[1]) for p in (args.run / "checkpoints").glob("step-*.pt"))
    steps = [0, *available] if args.steps == "all" else [int(s) for s in args.steps.split(",")]
    missing = [s for s in steps if s and s not in available]
    if missing:
        raise SystemExit(f"no snapshot for steps {missing}; the run has {available}")
    _, held = split_questions(read_questions(args.questions))
    seen: dict[str, int] = {}
    prompts: list[tuple[str, str]] = []
    for q in held:
        seen[q.category] = seen.get(q.category, 0) + 1
        if q.category in MT_BENCH_STYLE or seen[q.category] <= args.other_per_category:
            prompts.append((q.category, q.prompt))
    groups = {"mt_bench_style": [i for i, (c, _) in enumerate(prompts) if c in MT_BENCH_STYLE]}
    groups["other"] = [i for i in range(len(prompts)) if i not in groups["mt_bench_style"]]
    print(f"{len(prompts)} held-out prompts: {len(groups['mt_bench_style'])} MT-bench-style, {len(groups['other'])} other")

    target = load_model("default")
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for step in steps:
            weights, entry = snapshot_weights(args.run, step, target)
            folder = materialise(args.run, weights, Path(tmp) / f"step-{step}")
            report = evaluate_draft(target, folder, [t for _, t in prompts], max_new_tokens=args.max_new_tokens, k=args.k)
            point: dict[str, Any] = {**entry, "c": report.cost_ratio, "identical": report.identical, "prompts": report.prompts}
            for name, idx in groups.items():
                rows = [report.per_prompt[i] for i in idx]
                if not rows:
                    continue
                point[name] = {
                    # token-weighted: accepted / proposed over the group
                    "acceptance": sum(r["acceptance"] * r["tokens"] for r in rows) / max(1, sum(r["tokens"] for r in rows)),
                    "speedup": sum(r["plain_seconds"] for r in rows) / sum(r["spec_seconds"] for r in rows),
                    "mat": sum(r["mean_committed"] for r in rows) / len(rows),
                }
            points.append(point)
            mt = point.get("mt_bench_style", {})
            print(
                f"step {step:5d} ({entry['seconds'] / 60:5.1f} min): MT-bench-style a={mt.get('acceptance', 0):.3f} "
                f"speedup {mt.get('speedup', 0):.2f}x; other a={point.get('other', {}).get('acceptance', 0):.3f} "
                f"speedup {point.get('other', {}).get('speedup', 0):.2f}x; c={report.cost_ratio:.3f}; "
                f"identical {report.identical}/{report.prompts}",
                flush=True,
            )
            shutil.rmtree(folder, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    config = {"run": args.run.name, "k": args.k, "max_new_tokens": args.max_new_tokens,
              "prompts": [{"category": c} for c, _ in prompts]}
    write_json_atomic(args.out / "curve.json", {"config": config, "points": points}, indent=1)
    lines = [
        f"Distilled draft against training time (greedy, k={args.k}, {args.max_new_tokens} new tokens, "
        f"{len(groups['mt_bench_style'])} MT-bench-style + {len(groups['other'])} other held-out prompts)",
        "",
        "| step | training min | KL | MT-bench-style a | MT-bench-style speedup | other a | other speedup | c |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        mt, ot = p.get("mt_bench_style", {}), p.get("other", {})
        kl = "-" if p["loss"] is None else f"{p['loss']:.3f}"
        lines.append(
            f"| {p['step']} | {p['seconds'] / 60:.1f} | {kl} | {mt.get('acceptance', 0):.3f} | {mt.get('speedup', 0):.2f}x "
            f"| {ot.get('acceptance', 0):.3f} | {ot.get('speedup', 0):.2f}x | {p['c']:.3f} |"
        )
    write_text_atomic(args.out / "curve.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        from draftwise.plots import pyplot, save_figure

        plt = pyplot()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        minutes = [p["seconds"] / 60 for p in points]
        for name, style in (("mt_bench_style", "o-"), ("other", "s--")):
            ax1.plot(minutes, [p.get(name, {}).get("acceptance", float("nan")) for p in points], style, label=name)
            ax2.plot(minutes, [p.get(name, {}).get("speedup", float("nan")) for p in points], style, label=name)
        ax1.set(xlabel="training minutes", ylabel="acceptance (accepted / proposed)", title="acceptance")
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.set(xlabel="training minutes", ylabel=f"speedup over plain (k={args.k})", title="measured speedup")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend()
        save_figure(fig, args.out / "curve.png")
    except ImportError:
        print("matplotlib missing: no curve.png")


if __name__ == "__main__":
    main()
