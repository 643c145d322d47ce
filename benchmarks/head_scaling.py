"""How does an EAGLE head's acceptance grow with its training text? A scaling study on fixed
conversations (issue 29, item 3), sound where ``head_data_limit.py`` was not:

- the sizes are numbers of *conversations* (nested seeded samples of one corpus, one kind of
  text), not resamples of the same prompts;
- every size trains for the same number of *passes* over its data (``--passes``, a full cosine
  schedule each), not the same number of steps, and logs its held-out curve, so the reader sees
  whether it had flattened;
- every size is scored on the same held-out conversations (those of the largest pool), and on as
  many of its own training sequences (the gap is memorisation);
- ``--seeds``: each size is trained once per seed (initialisation and batch order); the corpus
  sample is the same for every seed.

Drafting acceptance on held-out MT-bench questions comes from ``draftwise bench`` over the saved
heads (``--report`` reads its summary). One process trains one list of (size, seed) runs; a
finished run is skipped, and a run cut short resumes from its last checkpoint (at each evaluation,
every sixth of its steps, and at Ctrl-C: ``checkpoints/NAME/last.pt``, weights, optimizer, RNG and
curve), so an interrupted study carries on by running the same command, to the same weights (a
Ctrl-C adds one point to the curve, where it stopped).

    python benchmarks/head_scaling.py train --data-dir out/sg/data --pool 1024 --sizes 256,512,1024 \\
        --seeds 0 --out benchmarks/results/head-scaling
    python benchmarks/head_scaling.py add --data-dir out/head-2048-data --pool 2048 --head out/head-2048 \\
        --tag passes6 --out benchmarks/results/head-scaling      # a head `train-head --corpus` trained
    python benchmarks/head_scaling.py report --out benchmarks/results/head-scaling [--bench DIR]

``--answers FILE`` (with its own ``--tag``) trains on the target's answers to the same training
conversations (``head_answers.py``: the same prompts and tokens), scored on the same held-out ShareGPT.

Writes ``runs/NAME.json`` (and ``heads/NAME/``, a head ``eagle:PATH`` loads) per run, then
``summary.md``, ``result.json`` and ``scaling.png``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from draftwise.training.checkpoint import LAST, load_safely, save_checkpoint
from draftwise.eagle.data import corpus_sequences, read_corpus
from draftwise.training.data import frequent_tokens
from draftwise.eagle.features import extract_features
from draftwise.eagle.data import conversation_ids
from draftwise.eagle.train import TargetParts, build_head, evaluate_head, train_head_loop
from draftwise.training.loop import RunProgress, resume_from
from draftwise.eagle.head import default_aux_layers
from draftwise.eagle.files import save_head, target_fingerprint
from draftwise.runtime.loaders import load_model
from draftwise.threads import set_threads


def _name(tag: str, size: int, seed: int) -> str:
    return f"{tag}-{size}-s{seed}"


def _data(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]], list[int], list[int], dict[str, Any]]:
    """``(target, store, sequences, training ids, held-out ids, corpus counts)`` for the pool."""
    set_threads(args.threads)
    target = load_model("default")
    seqs, lens, held_flags, stats = corpus_sequences(
        args.corpus, target.tokenizer, conversations=args.pool, seq_len=args.seq_len, seed=args.corpus_seed,
        holdout_percent=args.holdout_percent,
    )
    if args.answers:
        _use_answers(args, target.tokenizer, seqs, lens)
    aux = default_aux_layers(int(target.runtime.num_layers)) if args.arch == "eagle3" else None
    train_ids = [i for i, h in enumerate(held_flags) if not h]
    held = [i for i, h in enumerate(held_flags) if h]
    # features of the conversations these sizes train on and of the held-out ones only (the
    # store is keyed by content: a larger size later extracts just what it adds)
    use = sorted(train_ids[: max(args.sizes)] + held)
    at = {i: n for n, i in enumerate(use)}
    seqs, lens = [seqs[i] for i in use], [lens[i] for i in use]
    store = extract_features(target, seqs, lens, args.data_dir, aux_layers=aux, on_status=print)
    return target, store, seqs, [at[i] for i in train_ids[: max(args.sizes)]], [at[i] for i in held], stats


def _use_answers(args: argparse.Namespace, tokenizer: Any, seqs: list[list[int]], lens: list[int]) -> None:
    """Put the target's answers (``head_answers.py``'s file) in place of the training
    conversations of the sizes trained, each checked against its conversation's key; the
    held-out conversations stay ShareGPT's."""
    want = max(args.sizes)
    keys = [c.key for c in read_corpus(args.corpus, seed=args.corpus_seed, holdout_percent=args.holdout_percent).train[:want]]
    got = {}
    for line in args.answers.read_text().splitlines():
        rec = json.loads(line)
        if rec["index"] < want:
            if rec["key"] != keys[rec["index"]]:
                raise SystemExit(f"{args.answers}: index {rec['index']} is another conversation than this corpus's")
            got[rec["index"]] = rec["messages"]
    if len(got) < want:
        raise SystemExit(f"{args.answers} answers {len(got)} of the {want} conversations; run head_answers.py --size {want}")
    for i, messages in got.items():
        seqs[i], lens[i] = conversation_ids(tokenizer, messages, args.seq_len)


def _resume(folder: Path, settings: dict[str, Any], steps: int, head: Any, opt: Any, log: io.StringIO) -> RunProgress:
    """The run's progress: from ``folder``'s checkpoint (weights, optimizer, RNG and the curve so
    far loaded into ``head``, ``opt`` and ``log``) when there is one, else from step 0. A
    checkpoint of other settings is refused in one line: resuming it would mix two runs."""
    if not (folder / LAST).is_file():
        return RunProgress()
    ckpt = load_safely(folder / LAST, "checkpoint")
    if ckpt.get("settings") != settings or ckpt.get("planned_steps") != steps:
        raise SystemExit(f"{folder / LAST} is of another run ({ckpt.get('settings')}, {ckpt.get('planned_steps')} "
                         f"steps); delete {folder} to start this one over")
    run = resume_from(ckpt, head, opt)
    log.write(ckpt.get("log", ""))
    return run


def vocab(args: argparse.Namespace) -> None:
    """How often the target's argmax at a held-out response position is inside the draft
    vocabulary of the V most frequent tokens of the largest training size: the ceiling the
    reduced vocabulary puts on acceptance."""
    target, store, seqs, train_ids, held, _ = _data(args)
    eos = sorted(int(t) for t in target.eos_token_ids)
    tops = torch.cat([store.rows("top", i, store.prompt_lens[i], store.lengths[i]).long() for i in held])
    rows = []
    for v in args.sizes_v:
        kept = torch.tensor(frequent_tokens([seqs[i] for i in train_ids[: max(args.sizes)]], v,
                                            int(target.runtime.vocab_size), eos))
        rows.append({"vocab": v, "coverage": round(float(torch.isin(tops, kept).float().mean()), 4)})
        print(json.dumps(rows[-1]), flush=True)
    (args.out).mkdir(parents=True, exist_ok=True)
    (args.out / "vocab.json").write_text(json.dumps({"positions": int(tops.numel()), "rows": rows}, indent=1) + "\n")


def train(args: argparse.Namespace) -> None:
    target, store, seqs, train_ids, held, stats = _data(args)
    cpu = torch.device("cpu")
    eos = set(int(t) for t in target.eos_token_ids)
    d, vocab = int(target.config.hidden_size), int(target.runtime.vocab_size)
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        for seed in args.seeds:
            name = _name(args.tag, size, seed)
            path = args.out / "runs" / f"{name}.json"
            if path.is_file():
                print(f"{name}: done already", flush=True)
                continue
            keep = train_ids[:size]
            tokens = sum(store.lengths[i] for i in keep)
            steps = math.ceil(args.passes * len(keep) / args.batch)
            draft = frequent_tokens([seqs[i] for i in keep], args.vocab, vocab, sorted(eos)) if 0 < args.vocab < vocab else None
            parts = TargetParts.of(target.runtime, draft, cpu)
            head = build_head(target, init="layer", seed=seed, arch=args.arch)
            opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
            settings = {"batch": args.batch, "seq_len": args.seq_len, "lr": args.lr, "seed": seed, "reg_weight": 0.0,
                        "noise": args.noise, "response_only": False, "ttt": args.ttt}
            every = {**settings, "arch": args.arch, "weight_decay": args.weight_decay, "vocab": args.vocab,
                     "conversations": len(keep), "pool": args.pool, "corpus_seed": args.corpus_seed}
            log, folder = io.StringIO(), args.out / "checkpoints" / name
            run = _resume(folder, every, steps, head, opt, log)
            print(f"{name}: {len(keep)} conversations, {tokens:,} tokens, {steps} steps ({args.passes} passes)"
                  + (f", resuming at step {run.step}" if run.step else ""), flush=True)

            def checkpoint(_: Any) -> None:
                save_checkpoint(folder, head, opt, {
                    "step": run.step, "planned_steps": steps, "tokens": run.tokens, "seconds": run.seconds,
                    "first_loss": run.first_loss, "settings": every, "log": log.getvalue(),
                })

            folder.mkdir(parents=True, exist_ok=True)
            train_head_loop(head, opt, parts, store, keep, held, settings, steps, run, log, eos=eos,
                            device=cpu, time_budget=None, snapshot_every=max(1, steps // 6), data_seconds=0.0,
                            checkpoint=checkpoint)
            if run.stopped != "completed":  # Ctrl-C: the checkpoint stays, the same command resumes
                raise SystemExit(f"{name}: stopped at step {run.step} of {steps} ({run.stopped}); run the same command to resume")
            seconds = run.seconds  # steps and evaluations, summed over the resumed parts
            probe = keep[:: max(1, len(keep) // len(held))][: len(held)]
            curve = [json.loads(x) for x in log.getvalue().splitlines()]
            result = {
                "name": name, "tag": args.tag, "conversations": len(keep), "tokens": tokens, "seed": seed,
                "passes": args.passes, "steps": steps, "seconds": round(seconds, 1), "heldout_sequences": len(held),
                "settings": {**settings, "arch": args.arch, "weight_decay": args.weight_decay, "vocab": args.vocab},
                "heldout": evaluate_head(head, parts, store, held, eos=eos, device=cpu),
                "train": evaluate_head(head, parts, store, probe, eos=eos, device=cpu),
                "curve": [{"step": c["step"], "acceptance": round(c["acceptance"], 4)} for c in curve if "acceptance" in c],
                "corpus": stats["summary"], **({"answers": str(args.answers)} if args.answers else {}),
            }
            save_head(args.out / "heads" / name, head.cpu(), draft_tokens=draft, target={
                "name": target.name, "fingerprint": target_fingerprint(target.tokenizer, d, vocab), "hidden_size": d,
                "vocab_size": vocab, "num_layers": int(target.runtime.num_layers),
            }, extra={"settings": result["settings"], "steps": steps, "scaling_run": name})
            path.write_text(json.dumps(result, indent=1) + "\n")
            shutil.rmtree(folder)  # the run is done: its checkpoint (~60 MB) is not needed
            print(f"{name}: held-out {result['heldout']['acceptance']:.3f}, its training data "
                  f"{result['train']['acceptance']:.3f}, {seconds / 60:.1f} min", flush=True)


def add(args: argparse.Namespace) -> None:
    """Score a head that ``draftwise train-head --corpus`` trained (``--head``) as a run of this
    study: on the study's held-out conversations (the first ``--study-pool`` pool's, which lead the
    larger pool's held-out ones: :func:`corpus_sequences` takes both from one split) and on as many
    of its own training sequences. ``--pool`` is the head's ``--conversations``; its features are
    read from its data folder. The curve is the head's own log, over all of its held-out ones."""
    from draftwise.eagle.files import load_head

    args.sizes = [args.pool]
    target, store, seqs, train_ids, held, stats = _data(args)
    held = held[: math.ceil(args.study_pool * args.holdout_percent / (100 - args.holdout_percent))]
    d, vocab = int(target.config.hidden_size), int(target.runtime.vocab_size)
    loaded = load_head(args.head, fingerprint=target_fingerprint(target.tokenizer, d, vocab))  # refuses another target's
    meta = loaded.meta
    cpu, eos = torch.device("cpu"), set(int(t) for t in target.eos_token_ids)
    parts = TargetParts.of(target.runtime, loaded.draft_tokens, cpu)
    keep = train_ids[: args.pool]
    probe = keep[:: max(1, len(keep) // len(held))][: len(held)]
    log = [json.loads(x) for x in (args.head / "train_log.jsonl").read_text().splitlines()]
    steps, name = int(meta["steps"]), _name(args.tag, len(keep), int(meta["settings"]["seed"]))
    result = {
        "name": name, "tag": args.tag, "conversations": len(keep), "tokens": sum(store.lengths[i] for i in keep),
        "seed": int(meta["settings"]["seed"]), "passes": round(steps * int(meta["settings"]["batch"]) / len(keep), 2),
        "steps": steps, "seconds": round(max(float(x.get("seconds", 0)) for x in log), 1),
        "heldout_sequences": len(held), "settings": meta["settings"], "head": str(args.head),
        "heldout": evaluate_head(loaded.head, parts, store, held, eos=eos, device=cpu),
        "train": evaluate_head(loaded.head, parts, store, probe, eos=eos, device=cpu),
        "curve": [{"step": x["step"], "acceptance": round(x["acceptance"], 4)} for x in log if "acceptance" in x],
        "curve_heldout_sequences": int(meta.get("heldout_sequences", 0)) or None, "corpus": stats["summary"],
    }
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    (args.out / "runs" / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{name}: held-out {result['heldout']['acceptance']:.3f}, its training data "
          f"{result['train']['acceptance']:.3f}", flush=True)


def _drafting(benches: list[Path]) -> dict[str, float]:
    """Acceptance at k=1 per head folder name from ``draftwise bench`` runs over ``eagle:PATH``."""
    out = {}
    for bench in benches:
        overall = json.loads((bench / "summary.json").read_text())["groups"]["overall"]
        # "eagle:PATH" (a run at --k 1) or "eagle:PATH@k=1"; a run at --k auto may hold both, and k=1 wins
        for method, row in sorted(overall.items(), key=lambda kv: "@k=1" in kv[0]):
            if method.startswith("eagle:") and row.get("acceptance") is not None:
                out[Path(method.split(":", 1)[1].split("@")[0].split(",")[0]).name] = float(row["acceptance"])
    return out


def _moved(a: dict[str, Any], b: dict[str, Any], drafting: dict[str, float]) -> str:
    """Run ``a`` against run ``b``: held-out, on its own data and (where benched) drafting."""
    ha, hb = a["heldout"]["acceptance"], b["heldout"]["acceptance"]
    da, db = drafting.get(a["name"]), drafting.get(b["name"])
    drafted = "" if da is None or db is None else f"; drafting MT-bench {da:.3f} -> {db:.3f} ({db - da:+.3f})"
    return (f"{ha:.3f} -> {hb:.3f} ({hb - ha:+.3f}; on its own data {a['train']['acceptance']:.3f} -> "
            f"{b['train']['acceptance']:.3f}){drafted}")


def report(args: argparse.Namespace) -> None:
    runs = [json.loads(p.read_text()) for p in sorted((args.out / "runs").glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {args.out / 'runs'}: run `head_scaling.py train` first")
    drafting = _drafting(args.bench)
    for r in runs:  # a run `add` scored drafts under its own folder's name
        if "head" in r and Path(r["head"]).name in drafting:
            drafting.setdefault(r["name"], drafting[Path(r["head"]).name])
    base = [r for r in runs if r["tag"] == "base"]
    sizes = sorted({r["conversations"] for r in base})
    by_size = {n: [r for r in base if r["conversations"] == n] for n in sizes}
    mean = {n: sum(r["heldout"]["acceptance"] for r in rs) / len(rs) for n, rs in by_size.items()}
    lines = [
        "# EAGLE head scaling on fixed conversations (ShareGPT)", "",
        f"Teacher-forced greedy acceptance at k=1 on {runs[0]['heldout_sequences']} held-out conversations (the same for "
        "every run), on as many of the run's own training conversations, and while drafting held-out MT-bench "
        "(k=1, from `draftwise bench`). Each run trains the passes over its data in its row (one full cosine "
        "schedule); `base` runs train 3 passes, other tags change one setting.",
        "", "| run | conversations | tokens | passes | steps | minutes | held-out | its training data | drafting MT-bench |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in sorted(runs, key=lambda r: (r["tag"] != "base", r["tag"], r["conversations"], r["seed"])):
        draft = drafting.get(r["name"])
        lines.append(f"| {r['name']} | {r['conversations']} | {r['tokens']:,} | {r['passes']:g} | {r['steps']} | "
                     f"{r['seconds'] / 60:.1f} | {r['heldout']['acceptance']:.3f} | {r['train']['acceptance']:.3f} | "
                     f"{'' if draft is None else f'{draft:.3f}'} |")
    fixed = [r for r in runs if "answers" not in r]  # the scaling lines compare one kind of text
    for r in (r for r in runs if "answers" in r):
        twin = next((b for b in fixed if b["tag"] == "base" and (b["conversations"], b["passes"], b["seed"])
                     == (r["conversations"], r["passes"], r["seed"])), None)
        if twin is not None:
            lines += ["", f"The target's answers in place of ShareGPT's, {r['conversations']} conversations at "
                      f"{r['passes']:g} passes (seed {r['seed']}; {twin['tokens']:,} -> {r['tokens']:,} tokens): held-out "
                      f"{_moved(twin, r, drafting)}."]
    same_steps = [(a, b) for a in fixed for b in fixed
                  if a["steps"] == b["steps"] and a["conversations"] < b["conversations"] and a["seed"] == b["seed"]]
    for a, b in same_steps:
        lines += ["", f"At {a['steps']} steps each (seed {a['seed']}): {a['conversations']} conversations "
                  f"{a['heldout']['acceptance']:.3f} held out ({a['train']['acceptance']:.3f} on its own data), "
                  f"{b['conversations']} conversations {b['heldout']['acceptance']:.3f} "
                  f"({b['train']['acceptance']:.3f}): {b['heldout']['acceptance'] - a['heldout']['acceptance']:+.3f} "
                  f"from {b['conversations'] / a['conversations']:g}x the conversations at equal training."]
    same_passes = [(a, b) for a in fixed for b in fixed
                   if a["tag"] != "base" and a["passes"] == b["passes"] and a["seed"] == b["seed"]
                   and a["conversations"] < b["conversations"] and a["steps"] != b["steps"]]
    for a, b in same_passes:  # each size trained as far over its own data: what the next doubling buys
        lines += ["", f"At {a['passes']:g} passes each (seed {a['seed']}): {a['conversations']} -> {b['conversations']} "
                  f"conversations ({a['steps']} -> {b['steps']} steps) moved held-out acceptance {_moved(a, b, drafting)}."]
    gains = [(mean[b] - mean[a]) / math.log2(b / a) for a, b in zip(sizes, sizes[1:])]
    if gains:
        lines += ["", "Held-out acceptance per doubling of the conversations, `base` runs (mean over seeds; at 3 passes "
                  "each, more data also trained more steps: the equal-steps lines above separate the two): "
                  + ", ".join(f"{a}->{b}: {g:+.3f}" for (a, b), g in zip(zip(sizes, sizes[1:]), gains)) + "."]
    (args.out / "result.json").write_text(json.dumps({"runs": runs, "drafting": drafting, "mean_heldout": mean,
                                                       "per_doubling": gains}, indent=1) + "\n")
    _plot(args.out / "scaling.png", runs, drafting)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _plot(path: Path, runs: list[dict[str, Any]], drafting: dict[str, float]) -> None:
    """Left: acceptance against training tokens (3-pass ``base`` runs filled, other settings
    hollow). Right: each run's held-out curve against its training step, where equal steps
    separate more data from more training."""
    from draftwise.plots import pyplot, save_figure

    plt = pyplot()
    fig, (ax, cx) = plt.subplots(1, 2, figsize=(11, 4))
    base = [r for r in runs if r["tag"] == "base"]
    other = [r for r in runs if r["tag"] != "base" and "answers" not in r]
    answers = [r for r in runs if "answers" in r]
    for key, label, marker in (("heldout", "held-out (teacher-forced)", "o"), ("train", "own training data", "s")):
        ax.scatter([r["tokens"] for r in base], [r[key]["acceptance"] for r in base], marker=marker, label=label)
        if other:
            ax.scatter([r["tokens"] for r in other], [r[key]["acceptance"] for r in other], marker=marker,
                       facecolors="none", edgecolors="black", label=f"{label}, longer training")
        if answers:
            ax.scatter([r["tokens"] for r in answers], [r[key]["acceptance"] for r in answers], marker=marker,
                       facecolors="none", edgecolors="red", label=f"{label}, the target's answers")
    drafted = [(r["tokens"], drafting[r["name"]]) for r in runs if r["name"] in drafting]
    if drafted:
        ax.scatter(*zip(*drafted), marker="^", label="drafting held-out MT-bench")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training tokens (ShareGPT conversations)")
    ax.set_ylabel("acceptance at k=1")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=7)
    for r in runs:
        curve = r.get("curve") or []
        cx.plot([c["step"] for c in curve], [c["acceptance"] for c in curve], marker=".",
                label=f"{r['conversations']} conversations, {r['passes']:g} passes (seed {r['seed']})"
                + (", target's answers" if "answers" in r else ""))
    cx.set_xlabel("training step (4 sequences of 512 tokens)")
    cx.set_ylabel("held-out acceptance (teacher-forced)")
    cx.axhline(0.5, color="grey", lw=0.8, ls="--")
    cx.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)  # train's options; vocab reads the same data
    common.add_argument("--data-dir", type=Path, required=True)
    common.add_argument("--corpus", default="sharegpt")
    common.add_argument("--pool", type=int, default=1024, help="Conversations sampled (the store's); held-out ones in proportion.")
    common.add_argument("--corpus-seed", type=int, default=0)
    common.add_argument("--holdout-percent", type=float, default=5.0)
    common.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[256, 512, 1024])
    common.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    common.add_argument("--passes", type=float, default=3.0)
    common.add_argument("--batch", type=int, default=4)
    common.add_argument("--seq-len", type=int, default=512)
    common.add_argument("--lr", type=float, default=1e-3)
    common.add_argument("--arch", default="eagle3")
    common.add_argument("--ttt", type=int, default=3)
    common.add_argument("--noise", type=float, default=0.0)
    common.add_argument("--weight-decay", type=float, default=0.0)
    common.add_argument("--vocab", type=int, default=8192)
    common.add_argument("--tag", default="base", help="Name of a setting other than the base one (a sweep).")
    common.add_argument("--answers", type=Path, default=None,
                        help="head_answers.py's JSONL: train on the target's answers to the same conversations.")
    common.add_argument("--threads", type=int, default=None)
    common.add_argument("--out", type=Path, default=Path("benchmarks/results/head-scaling"))
    sub.add_parser("train", parents=[common])
    v = sub.add_parser("vocab", parents=[common])
    v.add_argument("--sizes-v", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192, 16384, 32768])
    a = sub.add_parser("add", parents=[common])
    a.add_argument("--head", type=Path, required=True, help="A `train-head --corpus` folder (its log beside it).")
    a.add_argument("--study-pool", type=int, default=1024, help="The study's pool, whose held-out ones score it.")
    r = sub.add_parser("report")
    r.add_argument("--out", type=Path, default=Path("benchmarks/results/head-scaling"))
    r.add_argument("--bench", type=Path, nargs="*", default=[], help="`draftwise bench` folders over eagle:OUT/heads/NAME.")
    args = ap.parse_args()
    {"train": train, "vocab": vocab, "add": add, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
