"""Does a batched pass cost more when the pass before it had another shape? 16 sequences at mean
context 300 (spread 150-450, as the batch profile fills them; ``../chunk-price/passes.py``'s
slots and timed pass): a one-row pass timed back to back with itself, and alternating with a
3-row and a 9-row pass; rounds interleave the three orders."""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "chunk-price"))
from passes import Passes  # noqa: E402

one = Passes().timed
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
