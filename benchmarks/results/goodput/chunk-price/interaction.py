"""Do a prompt chunk and speculative rows cost more together than apart? (issue 27)

One ``forward_batch`` over 16 sequences at a mean context of 300 (as ``chunk_price.py``), four
ways, 8 interleaved rounds after one warm-up, median: every sequence 1 decoding row; 3 rows each
(a chain, as a speculative step verifies); 15 sequences of 1 row plus a new request's 224-token
prompt chunk (last row's logits); 15 of 3 rows plus the chunk. If the costs add, the last equals
the third plus 15/16 of the step from the first to the second.

    python benchmarks/results/goodput/chunk-price/interaction.py OUT_DIR
"""
import json
import sys
import time
from pathlib import Path

from passes import B, C, CHUNK, ROUNDS, Passes

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
p = Passes()
med = {k: v * 1000 for k, v in p.medians({
    "decode 1": lambda: p.timed(1), "decode 3": lambda: p.timed(3),
    "chunk + 15 x 1": lambda: p.timed(1, "last"), "chunk + 15 x 3": lambda: p.timed(3, "last")}).items()}
additive = med["chunk + 15 x 1"] + (med["decode 3"] - med["decode 1"]) * (B - 1) / B
result = {"measured_ms": med, "additive_ms": additive, "together_over_additive": med["chunk + 15 x 3"] / additive,
          "config": {"batch": B, "context": C, "chunk": CHUNK, "rounds": ROUNDS, "date": time.strftime("%Y-%m-%d %H:%M")}}
(out / "interaction.json").write_text(json.dumps(result, indent=2) + "\n")
lines = ["| pass (16 sequences, mean context 300) | measured ms |", "|---|---:|"]
lines += [f"| {k} | {v:.1f} |" for k, v in med.items()]
lines += ["", f"chunk + 15 x 3 if the costs added: {additive:.1f} ms; measured / that: "
          f"{result['together_over_additive']:.2f}"]
(out / "interaction.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
