"""Does a batched pass cost more when the pass before it had another shape? 16 sequences at mean
context 300 (spread 150-450, as the batch profile fills them): a one-row pass timed back to back
with itself, and alternating with a 3-row and a 9-row pass; rounds interleave the three orders."""
import statistics
import sys
import time

from draftwise import load_model
from draftwise.cost.batch_measure import _fill, _tokens, spread_contexts
from draftwise.runtime.base import Rows

model = load_model("default")
rt = model.runtime
B, C = 16, 300
lengths = spread_contexts(C, B, 0.5)
rt.allocate_slots(B, max(lengths) + 16)
_fill(rt, lengths, 256)


def one(r, logits=True):
    passes = [Rows(s, _tokens(r, 100 + s, rt.vocab_size), logits=logits) for s in range(B)]
    t0 = time.perf_counter()
    rt.forward_batch(passes)
    dt = time.perf_counter() - t0
    for s, n in enumerate(lengths):
        rt.rollback_slot(s, n)
    return dt


res = {"1 after 1": [], "1 after 3": [], "1 after 9": [], "3 after 3": [], "3 after 1": []}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
    one(1); res["1 after 1"].append(one(1))
    one(3); res["1 after 3"].append(one(1))
    one(9); res["1 after 9"].append(one(1))
    one(3); res["3 after 3"].append(one(3))
    one(1); res["3 after 1"].append(one(3))
for k, v in res.items():
    v = [x * 1000 for x in v]
    print(f"{k}: median {statistics.median(v):.1f} ms, min {min(v):.1f}, n {len(v)}")
