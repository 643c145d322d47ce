"""Does the batch profile price a serving pass that carries a prompt chunk? (issue 27)

One ``forward_batch`` over 16 sequences at a mean context of 300 (spread as the profile spreads
them), timed four ways, 8 interleaved rounds after one warm-up, median: every sequence one
decoding row; two rows each; 15 decoding rows plus one new request's 224-token prompt chunk with
the logits of its last row only (what the server runs); the same chunk with every row's logits
(what the profile times). Each against the cached batch profile's price for its rows.

    python benchmarks/results/goodput/chunk-price/chunk_price.py OUT_DIR
"""
import json
import sys
import time
from pathlib import Path

from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from passes import B, C, CHUNK, ROUNDS, Passes

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
p = Passes()
bp = BatchProfile.load(default_batch_profile_path(p.model))
bp.check_model(p.model)
lengths = p.lengths
med = p.medians({"decode 1": lambda: p.timed(1), "decode 2": lambda: p.timed(2),
                 "chunk, last row's logits": lambda: p.timed(1, "last"),
                 "chunk, every row's logits": lambda: p.timed(1, "every")})
ctx_chunk = (sum(lengths[:-1]) + CHUNK) / B  # the simulation's mean context over live requests
price = {"decode 1": bp.pass_time(B, B, C), "decode 2": bp.pass_time(B, 2 * B, C),
         "chunk, last row's logits": bp.pass_time(B, B - 1 + CHUNK, ctx_chunk),
         "chunk, every row's logits": bp.pass_time(B, B - 1 + CHUNK, ctx_chunk)}
result = {k: {"measured_ms": v * 1000, "profile_ms": price[k] * 1000, "profile_over_measured": price[k] / v}
          for k, v in med.items()}
result["config"] = {"batch": B, "context": C, "chunk": CHUNK, "rounds": ROUNDS, "batch_profile": bp.created,
                    "date": time.strftime("%Y-%m-%d %H:%M")}
(out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
lines = ["| pass (16 sequences, mean context 300) | measured ms | batch profile's price ms | price / measured |",
         "|---|---:|---:|---:|"]
lines += [f"| {k} | {v['measured_ms']:.1f} | {v['profile_ms']:.1f} | {v['profile_over_measured']:.2f} |"
          for k, v in result.items() if k != "config"]
(out / "result.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
