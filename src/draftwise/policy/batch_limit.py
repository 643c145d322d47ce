"""How large a batch the goodput policy speculates in, from the plan's own prediction at each
concurrency (``concurrency.json``, written by ``draftwise plan --concurrency``).

The policy chooses each step's k's by the expected goodput of the batch as it is. Where that
expectation is close to plain batching it is also where the model's errors decide the sign: a
plan that predicted the policy a little above plain at N = 16, with an interval reaching below
1, met load tests that measured it below plain (docs/benchmarks.md, "Goodput at N concurrent
requests"). So the server speculates in a batch only up to the *speculating limit*: the largest
N of the plan's grid up to which the low end of every predicted interval of the policy over plain
batching is at least 1.0 (:func:`speculating_limit`). A batch holding more sequences than that
steps plain; a batch at or under it, or a server without the file, follows the policy. (The
interval is the plan's: each category's acceptance at the low end of its 95% interval, errors
taken as correlated; a batch between two grid points above the limit is treated as the larger.)

The prediction is only as good as the batch profile it was made from: a ``concurrency.json``
made from another batch profile (another machine, model, or measurement) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftwise.cost.batch_profile import BatchProfile
from draftwise.errors import ConfigError
from draftwise.fsutil import read_json

POLICY = "goodput"


def read_capacity(plan_path: str | Path) -> dict[str, Any] | None:
    """The ``concurrency.json`` beside a plan (``plan_path``: the plan's file or its folder), or
    None when there is none."""
    path = Path(plan_path).expanduser()
    path = (path if path.is_dir() else path.parent) / "concurrency.json"
    if not path.is_file():
        return None
    data = read_json(path, "concurrency prediction", "draftwise plan --concurrency")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{path} is not a draftwise concurrency prediction (no 'rows'); "
                          "make it again with `draftwise plan --concurrency 1,2,4,8,16 --out DIR`")
    data["source"] = str(path)
    return data


def speculating_limit(capacity: Mapping[str, Any], batch: BatchProfile, policy: str = POLICY) -> int:
    """The largest N of ``capacity``'s grid up to which the low end of ``policy``'s predicted
    interval over plain batching is at least 1.0 at every N (0: at none). ConfigError when the
    prediction was made from another batch profile than ``batch`` or lacks the policy.

    >>> from draftwise.cost.batch_profile import BatchProfile
    >>> bp = BatchProfile(model="m", fingerprint="f", machine_fingerprint="x", dtype="float32", runtime="r",
    ...                   batches=[1], rows=[1], contexts=[128], times={128: [[0.01]]}, created="t")
    >>> rows = [{"n": n, "policies": {"goodput": {"vs_plain_interval": [lo, 1.2]}}}
    ...         for n, lo in [(1, 1.2), (4, 1.1), (8, 1.01), (16, 0.96)]]
    >>> speculating_limit({"model": "m", "batch_profile_created": "t", "rows": rows}, bp)
    8
    """
    where = capacity.get("source", "the concurrency prediction")
    if capacity.get("model") != batch.model or capacity.get("batch_profile_created") != batch.created:
        raise ConfigError(f"{where} was predicted from the batch profile of {capacity.get('batch_profile_created')!r} "
                          f"for {capacity.get('model')!r}, not this server's ({batch.created!r}, {batch.model!r}); "
                          "predict it again with `draftwise plan --concurrency`")
    return limit_of(capacity, policy)


def limit_of(capacity: Mapping[str, Any], policy: str = POLICY) -> int:
    """:func:`speculating_limit` without the check of where the prediction came from (the planner
    calls it on the prediction it just made)."""
    limit = 0
    try:
        for row in sorted(capacity["rows"], key=lambda r: int(r["n"])):
            if float(row["policies"][policy]["vs_plain_interval"][0]) < 1.0:
                break
            limit = int(row["n"])
    except (KeyError, TypeError, ValueError, IndexError):
        where = capacity.get("source", "the concurrency prediction")
        raise ConfigError(f"{where} has no {policy!r} interval at some N; predict it again") from None
    return limit
