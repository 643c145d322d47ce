"""The target's own answers in place of ShareGPT's (issue 29, item 4): the same conversations,
the same user turns, the same tokens, and every assistant turn written by the target instead.

For each of the first ``--size`` conversations of the corpus's training side (the scaling study's
order: ``head_scaling.py``'s sizes are prefixes of it), the original is rendered and cut to
``--seq-len`` tokens as the study trains it (``L`` tokens). The target then answers its first
user turn greedily on the batched engine, with at most what is left of ``L``; where it ends its
answer (end-of-sequence) before ``L`` and the original has another user turn, that turn follows
and the target answers it too. So each conversation keeps its prompts and, up to the target
stopping early on the last turn, its token count: fixed text and target answers compare at equal
tokens and equal training steps (``head_scaling.py train --answers FILE``).

A conversation whose first answer starts at or past ``L`` (all prompt) is kept as it is: its cut
tokens are the same either way. Greedy (temperature 0), as the issue's goals are.

Writes one JSON line per conversation as it finishes (``index``, ``key``, ``messages``, ``tokens``,
``original_tokens``, ``rounds``, ``answer_tokens`` a round); run it again to resume after a stop.

    python benchmarks/head_answers.py --size 256 --out out/sg-answers/answers-256.jsonl
    python benchmarks/head_scaling.py train --data-dir out/sg/data --pool 1024 --sizes 256 --seeds 0,1 \\
        --passes 3 --answers out/sg-answers/answers-256.jsonl --tag answers --out benchmarks/results/head-scaling
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from draftwise.eagle.data import read_corpus
from draftwise.training.data import ENGINE_BATCH, ENGINE_PREFILL_CHUNK
from draftwise.eagle.data import conversation_ids
from draftwise.core.engine import Engine
from draftwise.runtime.loaders import load_model
from draftwise.core.sampling import SamplingConfig
from draftwise.threads import set_threads


def _prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return [int(i) for i in out]


class _State:
    """One conversation being rewritten: its messages so far and the original's turns still to come."""

    def __init__(self, index: int, conv: Any, tokenizer: Any, seq_len: int) -> None:
        msgs = conv.messages()
        self.index, self.key = index, conv.key
        self.original = msgs
        self.budget = len(conversation_ids(tokenizer, msgs, seq_len)[0])
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        self.messages, self.rest = msgs[:first], msgs[first:]
        self.rounds, self.answer_tokens = 0, []

    def next_user(self) -> bool:
        """Move the original's next user turn in (after the answer it had); False when none is left."""
        while self.rest and self.rest[0]["role"] != "user":
            self.rest = self.rest[1:]
        if not self.rest:
            return False
        self.messages.append(self.rest[0])
        self.rest = self.rest[1:]
        return True


def generate(args: argparse.Namespace) -> None:
    set_threads(args.threads)
    target = load_model(args.target)
    tok = target.tokenizer
    corpus = read_corpus(args.corpus, seed=args.corpus_seed, holdout_percent=args.holdout_percent)
    convs = corpus.train[: args.size]
    done: set[int] = set()
    if args.out.is_file():
        for line in args.out.read_text().splitlines():
            rec = json.loads(line)
            if rec["key"] != convs[rec["index"]].key:
                raise SystemExit(f"{args.out} line of index {rec['index']} is of another corpus or split; "
                                 "delete it to start over")
            done.add(rec["index"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    todo = [_State(i, c, tok, args.seq_len) for i, c in enumerate(convs) if i not in done]
    print(f"{len(done)} of {len(convs)} conversations done; {len(todo)} to answer", flush=True)
    engine = Engine(target, max_batch=min(ENGINE_BATCH, max(1, len(todo))), context=args.seq_len + 8,
                    prefill_chunk=ENGINE_PREFILL_CHUNK)
    t0, made = time.perf_counter(), 0

    def finish(s: _State) -> None:
        msgs = s.messages if s.rounds else s.original  # all prompt: kept as it was
        tokens = len(conversation_ids(tok, msgs, args.seq_len)[0])
        with args.out.open("a") as f:
            f.write(json.dumps({"index": s.index, "key": s.key, "messages": msgs, "tokens": tokens,
                                "original_tokens": s.budget, "rounds": s.rounds, "answer_tokens": s.answer_tokens}) + "\n")

    try:
        while todo:
            jobs = []
            for s in todo:
                ids = _prompt_ids(tok, s.messages)
                if s.budget - len(ids) > 0:
                    jobs.append((s, ids, s.budget - len(ids)))
                else:
                    finish(s)
            again: list[_State] = []

            def answered(n: int, r: Any) -> None:
                nonlocal made
                s = jobs[n][0]
                made += len(r.token_ids)
                s.messages.append({"role": "assistant", "content": tok.decode(r.token_ids, skip_special_tokens=True)})
                s.rounds += 1
                s.answer_tokens.append(len(r.token_ids))
                if r.eos_token is not None and s.next_user():  # it ended its answer with room left
                    again.append(s)
                else:
                    finish(s)
                print(f"\rround {s.rounds}: {made:,} tokens, {made / (time.perf_counter() - t0):.0f} tok/s",
                      end="", flush=True)

            engine.generate_all([j[1] for j in jobs], max_new_tokens=[j[2] for j in jobs],
                                sampling=SamplingConfig(temperature=0.0), on_result=answered)
            print(flush=True)
            todo = again
    finally:
        target.runtime.allocate_slots(1)
    print(f"done: {made:,} tokens in {time.perf_counter() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, required=True, help="Conversations: the first SIZE of the training side.")
    p.add_argument("--out", type=Path, required=True, help="JSONL of the rewritten conversations (resumed).")
    p.add_argument("--target", default="default", help="The target model (the study's: the default one).")
    p.add_argument("--corpus", default="sharegpt")
    p.add_argument("--corpus-seed", type=int, default=0)
    p.add_argument("--holdout-percent", type=float, default=5.0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.size < 1:
        raise SystemExit("--size must be at least 1")
    generate(args)


if __name__ == "__main__":
    main()
