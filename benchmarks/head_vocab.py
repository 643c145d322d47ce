"""What the head's draft vocabulary buys at drafting time: k=1 acceptance and the cost of a head call
for vocabularies wider and narrower than the one it was trained with, with no retraining.

The head predicts the target's *feature*; the target's own LM head rows score it (FR-Spec keeps
only the trained vocabulary's rows). So the same head can be scored with more rows or fewer, and
the question "what does the reduced vocabulary cost?" (issue 29) is answered by measurement:

- **rows**: the shipped head's 8,192; narrower ones are its most frequent tokens, wider ones add
  the next most frequent, counted on the same ShareGPT training conversations ``make head`` takes
  (``--conversations``; the ``corpus`` extra); ``49152`` is the whole vocabulary;
- **acceptance** (teacher-forced, greedy, k=1): at every answer position of a finished bench's
  plain greedy answers (``answers/none.jsonl``), the head's argmax from the target's real features
  against the target's token, as drafting at k=1 would see it;
- **cost**: the median time of scoring one predicted feature with those rows (int8 rows where the
  head drafts in int8), timed in this process between turns.

    python benchmarks/head_vocab.py --bench benchmarks/results/head-unseen-2048 --out OUT

Writes ``vocab.json`` and ``vocab.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftwise.bench.runner import build_prompt
from draftwise.eagle.data import corpus_sequences
from draftwise.training.data import token_ranking
from draftwise.eagle.drafter import default_head_folder, default_head_weights, fingerprint_of
from draftwise.eagle.files import load_head
from draftwise.eagle.parts import TargetParts, int8_head
from draftwise.runtime.loaders import load_model
from draftwise.questions import DEFAULT_QUESTIONS, category_group, read_questions

SIZES = (4096, 8192, 16384, 32768, 49152)


def ranked_rows(model, shipped: list[int], conversations: int, sizes: list[int]) -> tuple[dict[int, list[int]], int]:
    """Rows per size (ascending ids) and how many of the counted 8,192 most frequent match the shipped rows."""
    dev = [t for q in read_questions(DEFAULT_QUESTIONS) for t in q.turns]
    seqs, _, held, _ = corpus_sequences("sharegpt", model.tokenizer, conversations=conversations, seq_len=512,
                                        dev_texts=dev)
    train = [s for s, h in zip(seqs, held) if not h]
    eos = sorted(int(t) for t in model.eos_token_ids)
    rank = token_ranking(train, int(model.runtime.vocab_size), eos)  # the order train-head's rows take
    match = len(set(rank[: len(shipped)]) & set(shipped))
    return {n: resized(shipped, rank, n) for n in sizes}, match


def resized(shipped: list[int], rank: list[int], n: int) -> list[int]:
    """``n`` rows (ascending ids): the shipped rows' ``n`` most frequent when narrower, all of them
    and the next most frequent others when wider; ``rank`` orders every id, most frequent first.

    >>> resized([2, 5, 9], [5, 7, 9, 2, 1], 2), resized([2, 5, 9], [5, 7, 9, 2, 1], 4)
    ([5, 9], [2, 5, 7, 9])
    """
    kept = set(shipped)
    inside = [i for i in rank if i in kept]
    outside = [i for i in rank if i not in kept]
    return sorted(inside[:n]) if n <= len(inside) else sorted(inside + outside[: n - len(inside)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, required=True, help="a finished bench folder (answers/none.jsonl)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--conversations", type=int, default=2048, help="ShareGPT conversations to count tokens on")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    model = load_model("default")
    rt = model.runtime
    loaded = load_head(default_head_folder(model), fingerprint=fingerprint_of(model))
    weights = default_head_weights()
    head = int8_head(loaded.head) if weights == "int8" else loaded.head
    shipped = [int(t) for t in loaded.draft_tokens]
    rows, match = ranked_rows(model, shipped, args.conversations, [n for n in sizes if n < rt.vocab_size])
    parts = {n: TargetParts(rt, torch.tensor(r), int8=weights == "int8") for n, r in rows.items()}
    if rt.vocab_size in sizes:
        parts[int(rt.vocab_size)] = TargetParts(rt, None, int8=weights == "int8")
    layers = loaded.head.cfg.feature_layers
    questions = {q.question_id: q for q in read_questions(DEFAULT_QUESTIONS)}
    hits: dict[str, dict[int, list[int]]] = {}
    cost: dict[int, list[float]] = {n: [] for n in parts}
    one = next(iter(parts.values()))
    for line in (args.bench / "answers" / "none.jsonl").read_text().splitlines():
        row = json.loads(line)
        q, choice = questions[row["question_id"]], row["choices"][0]
        group = category_group(row["category"])
        for t, tokens in enumerate(choice["token_ids"]):
            prompt = build_prompt(model, list(q.turns[: t + 1]), list(choice["turns"][:t]))
            ids = list(prompt) + list(tokens)
            rt.capture_features(layers)
            rt.rollback(0)
            with torch.inference_mode():
                rt.prefill(ids[:-1])
                feats = head.lift(rt.features(0, len(ids) - 1).float())
                n = feats.shape[0]
                out = head(one.embed(ids[1:])[None], feats[None], torch.arange(n)[None])[0]  # row i -> token i + 2
                # rows P-1 .. n-2 guess answer tokens 2 .. A (the first comes from the prefill)
                pred = out[len(prompt) - 1 : n - 1]
                truth = torch.as_tensor(ids[len(prompt) + 1 : n + 1])
                for size, p in parts.items():
                    s = p.scores(pred)
                    top = s.argmax(-1)
                    token = top if p.rows is None else p.rows[top]
                    bucket = hits.setdefault(group, {}).setdefault(size, [0, 0])
                    bucket[0] += int((token == truth).sum())
                    bucket[1] += int(truth.numel())
                    for _ in range(5):  # one predicted feature, as a drafting step scores it
                        t0 = time.perf_counter()
                        p.best(pred[-1:])
                        cost[size].append(time.perf_counter() - t0)
        print(f"{row['question_id']} ({row['category']})", flush=True)
    rt.capture_features(enabled=False)
    overall = {n: [sum(hits[g][n][0] for g in hits), sum(hits[g][n][1] for g in hits)] for n in parts}
    result = {
        "bench": str(args.bench), "head": str(default_head_folder(model)), "weights": weights,
        "counted_conversations": args.conversations, "shipped_rows_reproduced": match,
        "sizes": {n: {"acceptance": overall[n][0] / overall[n][1], "positions": overall[n][1],
                      "call_ms": 1e3 * statistics.median(cost[n]),
                      "groups": {g: hits[g][n][0] / hits[g][n][1] for g in sorted(hits)}} for n in sorted(parts)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vocab.json").write_text(json.dumps(result, indent=1) + "\n")
    groups = sorted(hits)
    lines = [f"Teacher-forced k=1 acceptance of `eagle:default` scored with N rows ({weights}), on `{args.bench}`'s "
             f"plain greedy answers; the counted top 8,192 match {match} of the shipped rows.", "",
             "| rows | acceptance | " + " | ".join(groups) + " | scoring one feature (ms) |",
             "|--:|--:|" + "--:|" * len(groups) + "--:|"]
    for n, r in result["sizes"].items():
        lines.append(f"| {n} | {r['acceptance']:.3f} | " + " | ".join(f"{r['groups'][g]:.3f}" for g in groups)
                     + f" | {r['call_ms']:.2f} |")
    (args.out / "vocab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
