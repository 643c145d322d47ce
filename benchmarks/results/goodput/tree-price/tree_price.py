"""Does a pass that verifies trees cost what the batch profile (timed on chains) says? (issue 27)

The batch profile times chains: each sequence's r rows are consecutive tokens. Suffix decoding
verifies trees (rows that branch), priced as chains of as many rows. One ``forward_batch``
over 16 sequences at a mean context of 300 (spread as the profile spreads them, as
``chunk-price/passes.py``), 8 interleaved rounds after a warm-up, median: every sequence 1 row;
5 rows as a chain; 5 rows as a tree (root, two children, a grandchild under each); 9 rows as a
chain; 9 as a tree (root, three children, a chain of two under one, a grandchild under each other).

    python benchmarks/results/goodput/tree-price/tree_price.py OUT_DIR
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "chunk-price"))
from passes import B, C, Passes  # noqa: E402

from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path  # noqa: E402

TREES = {5: [-1, 0, 0, 1, 2], 9: [-1, 0, 0, 0, 1, 4, 2, 3, 5]}

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
p = Passes()
bp = BatchProfile.load(default_batch_profile_path(p.model))
bp.check_model(p.model)

kinds = {"1 row": lambda: p.timed(1)}
for r, parents in TREES.items():
    kinds[f"{r} rows, chain"] = lambda r=r: p.timed(r)
    kinds[f"{r} rows, tree"] = lambda r=r, t=parents: p.timed(r, tree=t)
med = p.medians(kinds)
price = {k: bp.pass_time(B, B * int(k.split()[0]), C) for k in med}
result = {k: {"measured_ms": v * 1000, "profile_ms": price[k] * 1000} for k, v in med.items()}
result["config"] = {"batch": B, "context": C, "trees": TREES, "batch_profile": bp.created,
                    "date": time.strftime("%Y-%m-%d %H:%M")}
(out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
lines = ["| pass (16 sequences, mean context 300) | measured ms | batch profile's price ms |", "|---|---:|---:|"]
lines += [f"| {k} | {v['measured_ms']:.1f} | {v['profile_ms']:.1f} |" for k, v in result.items() if k != "config"]
(out / "result.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
