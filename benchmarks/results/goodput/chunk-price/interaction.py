"""Do a prompt chunk and speculative rows cost more together than apart? (issue 27)

One ``forward_batch`` over 16 sequences at a mean context of 300 (as ``chunk_price.py``), four
ways, 8 interleaved rounds after one warm-up, median: every sequence 1 decoding row; 3 rows each
(a chain, as a speculative step verifies); 15 sequences of 1 row plus a new request's 224-token
prompt chunk (last row's logits); 15 of 3 rows plus the chunk. If the costs add, the last equals
the third plus 15/16 of the step from the first to the second.

    python benchmarks/results/goodput/chunk-price/interaction.py OUT_DIR
"""
import json
import statistics
import sys
import time
from pathlib import Path

from draftwise import load_model
from draftwise.cost.batch_measure import _fill, _tokens, spread_contexts
from draftwise.runtime.base import Rows

B, C, CHUNK, ROUNDS = 16, 300, 224, 8
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = load_model("default")
rt = model.runtime
lengths = spread_contexts(C, B, 0.5)
rt.allocate_slots(B, max(lengths) + CHUNK + 8)
_fill(rt, lengths, 256)
V = rt.vocab_size


def rows(kind: str) -> list[Rows]:
    r = 3 if "3" in kind else 1
    if not kind.startswith("chunk"):
        return [Rows(s, _tokens(r, 100 + s, V)) for s in range(B)]
    return [Rows(s, _tokens(r, 100 + s, V)) for s in range(B - 1)] + [
        Rows(B - 1, _tokens(CHUNK, 7, V), last_only=True, logits=True)]


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


kinds = ["decode 1", "decode 3", "chunk + 15 x 1", "chunk + 15 x 3"]
times: dict[str, list[float]] = {k: [] for k in kinds}
for r in range(ROUNDS + 1):
    for k in kinds:
        t = timed(k)
        if r:
            times[k].append(t)
med = {k: statistics.median(v) * 1000 for k, v in times.items()}
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
