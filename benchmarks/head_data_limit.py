"""Is an EAGLE head's acceptance limited by its data? Two measurements on one train-head data folder:

1. a trained head's teacher-forced acceptance at k=1 on held-out sequences and on as many of its
   own training sequences (a head that scores far higher on what it saw has memorised it: more
   data, not more steps or width, is what it lacks);
2. the same recipe (the settings of ``--head``) trained from scratch on 25%, 50% and 100% of the
   training sequences (spread over the list), the same number of steps each, scored the same way.

    python benchmarks/head_data_limit.py --head out/head-e3-long --data-dir out/head-smol/data \\
        --steps 360 --out benchmarks/results/eagle3-data

Writes ``result.json`` and ``summary.md`` under ``--out``. Takes about 8 minutes per fraction at
360 steps on 2 cores; the data folder must hold the features of ``--head``'s layers (a finished
``train-head --data-dir`` run).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import torch

from draftwise.training.data import frequent_tokens, make_sequences, ordered_prompts, split_questions
from draftwise.eagle.features import extract_features
from draftwise.eagle.data import heldout_sequences, magpie_prompts, magpie_questions
from draftwise.eagle.train import TargetParts, build_head, evaluate_head, train_head_loop
from draftwise.training.loop import RunProgress
from draftwise.eagle.head import default_aux_layers
from draftwise.eagle.files import load_head
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, read_questions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", type=Path, required=True, help="A train-head output folder (its settings are reused).")
    ap.add_argument("--data-dir", type=Path, required=True, help="The train-head data folder it was trained on.")
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--fractions", default="0.25,0.5,1.0")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/eagle3-data"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = json.loads((args.head / "draftwise_head.json").read_text())
    settings = meta["settings"]
    target = load_model(settings["target"])
    cpu = torch.device("cpu")

    # the run's data, from the folder's caches (the same calls train-head makes)
    train_rows, held_rows = split_questions(read_questions(DEFAULT_QUESTIONS))
    texts = magpie_prompts(target, settings["magpie"], args.data_dir, held_out=[t for q in held_rows for t in q.turns],
                           seed=settings["seed"], device=cpu)
    prompts = ordered_prompts(train_rows) + magpie_questions(texts)
    temps = [float(t) for t in settings["gen_temperatures"]]
    gen = dict(gen_tokens=settings["gen_tokens"], gen_temperatures=temps, seed=settings["seed"])
    n_dev = len(train_rows)
    seqs = make_sequences(target, prompts[:n_dev], args.data_dir, **gen) + make_sequences(target, prompts[n_dev:], args.data_dir, **gen)
    lens = [len(target.encode_prompt(q.prompt)) for q in prompts for _ in temps]
    aux = default_aux_layers(int(target.runtime.num_layers)) if settings["arch"] == "eagle3" else None
    store = extract_features(target, seqs, lens, args.data_dir, aux_layers=aux)
    flags = heldout_sequences([q.prompt for q in prompts for _ in temps], settings["holdout_percent"])
    train = [i for i, h in enumerate(flags) if not h]
    held = [i for i, h in enumerate(flags) if h]
    eos = set(int(t) for t in target.eos_token_ids)
    result: dict = {"head": args.head.name, "settings": settings, "train_sequences": len(train), "heldout_sequences": len(held)}

    def score(head, parts, pool):
        probe = pool[:: max(1, len(pool) // len(held))][: len(held)]  # as many training sequences as held out
        return {"heldout": evaluate_head(head, parts, store, held, eos=eos, device=cpu),
                "train": evaluate_head(head, parts, store, probe, eos=eos, device=cpu)}

    loaded = load_head(args.head)
    rows = None if loaded.draft_tokens is None else loaded.draft_tokens.tolist()
    result["trained_head"] = {"steps": meta["steps"], **score(loaded.head, TargetParts.of(target.runtime, rows), train)}
    result["fractions"] = []
    for frac in [float(x) for x in args.fractions.split(",")]:
        keep = [train[int(j / frac)] for j in range(int(len(train) * frac))]
        vocab = frequent_tokens([seqs[i] for i in keep], settings["vocab_size_draft"], int(target.runtime.vocab_size), sorted(eos))
        parts = TargetParts.of(target.runtime, vocab, cpu)
        head = build_head(target, init=settings["init"], seed=settings["seed"], arch=settings["arch"])
        opt = torch.optim.AdamW(head.parameters(), lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0)
        t0 = time.perf_counter()
        train_head_loop(head, opt, parts, store, keep, held, dict(settings), args.steps, RunProgress(), io.StringIO(),
                        eos=eos, device=cpu, time_budget=None, snapshot_every=args.steps, data_seconds=0.0,
                        checkpoint=lambda h: None)
        result["fractions"].append({"fraction": frac, "sequences": len(keep), "steps": args.steps,
                                    "seconds": round(time.perf_counter() - t0, 1), **score(head, parts, keep)})
        print(json.dumps(result["fractions"][-1]["heldout"]), flush=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Is the head data-limited? ({args.head.name}, {len(train)} training / {len(held)} held-out sequences)",
        "",
        "Teacher-forced greedy acceptance at k=1 (`evaluate_head`), on the held-out sequences and on as many training sequences.",
        "",
        "| head | sequences | steps | held-out | training | second token (held-out) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    th = result["trained_head"]
    lines.append(f"| {args.head.name} | {len(train)} | {th['steps']} | {th['heldout']['acceptance']:.3f} | "
                 f"{th['train']['acceptance']:.3f} | {th['heldout']['acceptance_second']:.3f} |")
    for f in result["fractions"]:
        lines.append(f"| from scratch, {f['fraction']:.0%} of the data | {f['sequences']} | {f['steps']} | "
                     f"{f['heldout']['acceptance']:.3f} | {f['train']['acceptance']:.3f} | {f['heldout']['acceptance_second']:.3f} |")
    lines += ["", "```", f"python benchmarks/head_data_limit.py --head {args.head} --data-dir {args.data_dir} "
              f"--steps {args.steps} --out {args.out}", "```", ""]
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
