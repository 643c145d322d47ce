"""Does the batch profile price a serving pass that carries a prompt chunk? (issue 27)

One ``forward_batch`` over 16 sequences at a mean context of 300 (spread as the profile spreads
them), timed four ways, 8 interleaved rounds after one warm-up, median: every sequence one
decoding row; two rows each; 15 decoding rows plus one new request's 224-token prompt chunk with
the logits of its last row only (what the server runs); the same chunk with every row's logits
(what the profile times). Each against the cached batch profile's price for its rows.

    python benchmarks/results/goodput/chunk-price/chunk_price.py OUT_DIR
"""
import json
import statistics
import sys
import time
from pathlib import Path

from draftwise import load_model
from draftwise.cost.batch_measure import _fill, _tokens, spread_contexts
from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from draftwise.runtime.base import Rows

B, C, CHUNK, ROUNDS = 16, 300, 224, 8
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = load_model("default")
rt = model.runtime
bp = BatchProfile.load(default_batch_profile_path(model))
bp.check_model(model)
lengths = spread_contexts(C, B, 0.5)
rt.allocate_slots(B, max(lengths) + CHUNK + 8)
_fill(rt, lengths, 256)
V = rt.vocab_size


def rows(kind: str) -> list[Rows]:
    if kind.startswith("decode"):
        return [Rows(s, _tokens(int(kind[-1]), 100 + s, V)) for s in range(B)]
    last_only = kind == "chunk, last row's logits"
    return [Rows(s, _tokens(1, 100 + s, V)) for s in range(B - 1)] + [
        Rows(B - 1, _tokens(CHUNK, 7, V), last_only=last_only, logits=True)]


def timed(kind: str) -> float:
    chunk = kind.startswith("chunk")
    if chunk:
        rt.rollback_slot(B - 1, 0)  # the last slot becomes a new request's prompt
    passes = rows(kind)
    t0 = time.perf_counter()
    rt.forward_batch(passes)
    dt = time.perf_counter() - t0
    for s, n in enumerate(lengths):
        if chunk and s == B - 1:
            ids = _tokens(n, s + 1, V)
            rt.rollback_slot(s, 0)
            for lo in range(0, n, 256):
                rt.forward_batch([Rows(s, ids[lo:lo + 256], last_only=True, logits=lo + 256 >= n)])
        else:
            rt.rollback_slot(s, n)
    return dt


kinds = ["decode 1", "decode 2", "chunk, last row's logits", "chunk, every row's logits"]
times: dict[str, list[float]] = {k: [] for k in kinds}
for r in range(ROUNDS + 1):
    for k in kinds:
        t = timed(k)
        if r:
            times[k].append(t)
ctx_chunk = (sum(lengths[:-1]) + CHUNK) / B  # the simulation's mean context over live requests
price = {"decode 1": bp.pass_time(B, B, C), "decode 2": bp.pass_time(B, 2 * B, C),
         "chunk, last row's logits": bp.pass_time(B, B - 1 + CHUNK, ctx_chunk),
         "chunk, every row's logits": bp.pass_time(B, B - 1 + CHUNK, ctx_chunk)}
result = {k: {"measured_ms": statistics.median(v) * 1000, "profile_ms": price[k] * 1000,
              "profile_over_measured": price[k] / statistics.median(v)} for k, v in times.items()}
result["config"] = {"batch": B, "context": C, "chunk": CHUNK, "rounds": ROUNDS, "batch_profile": bp.created,
                    "date": time.strftime("%Y-%m-%d %H:%M")}
(out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
lines = ["| pass (16 sequences, mean context 300) | measured ms | batch profile's price ms | price / measured |",
         "|---|---:|---:|---:|"]
lines += [f"| {k} | {v['measured_ms']:.1f} | {v['profile_ms']:.1f} | {v['profile_over_measured']:.2f} |"
          for k, v in result.items() if k != "config"]
(out / "result.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
