"""Least squares over every traced pass of this run: seconds ~ 1 + sequences + verified rows +
prompt rows + context, and a prompt row's cost over a verified row's.

    python benchmarks/results/goodput-policy/run24-rows-chunk-n16/fit_prompt_rows.py [DIR]
"""
import glob
import gzip
import json
import sys
from pathlib import Path

import numpy as np

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
X, y = [], []
for f in sorted(glob.glob(str(here / "passes-*.jsonl.gz"))):
    for line in gzip.open(f, "rt"):
        p = json.loads(line)
        X.append([1, p["sequences"], p["rows"], p["prompt_rows"], p["context"] / 1000])
        y.append(p["seconds"])
A, b = np.array(X, float), np.array(y)
coef = np.linalg.lstsq(A, b, rcond=None)[0]
rms = float(np.sqrt(((b - A @ coef) ** 2).mean()))
print(f"{len(b)} passes; ms: constant {coef[0] * 1e3:.2f}, per sequence {coef[1] * 1e3:.3f}, per verified row "
      f"{coef[2] * 1e3:.3f}, per prompt row {coef[3] * 1e3:.3f}, per 1,000 context {coef[4] * 1e3:.3f}; "
      f"rms residual {rms * 1e3:.1f} ms")
print(f"a prompt row costs {coef[3] / coef[2]:.2f} of a verified row")
