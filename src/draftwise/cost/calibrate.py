"""``draftwise calibrate-self``: find the layer subset that makes the best self-speculation draft.

For each candidate subset (early exits and skipped blocks) it runs greedy speculative decoding
on a few prompts to measure per-position acceptance, measures the partial pass's cost against a
full pass on this machine, and predicts the speedup with the cost model:

    S = E(a_1..a_k) * T(1) / (k * T_draft(1) + T(k+1))

Costs are timed with :func:`~draftwise.cost.timing.time_forward` (the fast-half mean of repeated
passes, the profile's estimator) and the speedup comes from :mod:`draftwise.cost.formulas`. The best
subset is saved (atomically) in the user cache, where ``--draft self`` finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from draftwise.core.decode import generate
from draftwise.cost.formulas import expected_committed_by_position, predicted_speedup
from draftwise.cost.timing import time_forward
from draftwise.drafters.factory import calibration_path
from draftwise.drafters.self_spec import SelfSpecDrafter
from draftwise.errors import ConfigError
from draftwise.fsutil import write_json_atomic
from draftwise.runtime.native import NativeRuntime


@dataclass(frozen=True)
class Candidate:
    layers: list[int]
    description: str
    acceptance_by_position: list[float]
    draft_cost_ratio: float  # c: one partial pass / one full pass
    expected_committed: float
    predicted_speedup: float


def candidate_layer_sets(num_layers: int) -> list[list[int]]:
    """Early exits at 1/4 .. 3/4 depth and skipped middle blocks of the same sizes."""
    n = num_layers
    sets: list[list[int]] = []
    for frac in (0.25, 0.4, 0.5, 0.6, 0.75):
        keep = max(1, min(n - 1, round(n * frac)))
        sets.append(list(range(keep)))  # early exit after `keep` layers
        skip = n - keep
        lo = (n - skip) // 2  # skip a block in the middle: keep the first and last layers
        sets.append([i for i in range(n) if not lo <= i < lo + skip])
    # every other layer of the second half (a common LayerSkip-style choice)
    sets.append([i for i in range(n) if i < n // 2 or i % 2 == 0])
    unique: list[list[int]] = []
    for s in sets:
        if s not in unique and 0 < len(s) < n:
            unique.append(s)
    return unique


def calibrate_self(
    model: Any,
    prompts: Sequence[str],
    *,
    k: int = 4,
    max_new_tokens: int = 48,
    candidates: Sequence[Sequence[int]] | None = None,
    on_candidate: Callable[[Candidate], None] | None = None,
) -> list[Candidate]:
    """Score every candidate layer subset; best first."""
    rt = model.runtime
    if not isinstance(rt, NativeRuntime):
        raise ConfigError("calibrate-self needs the native runtime (self-speculation runs layer subsets)")
    if not prompts:
        raise ConfigError("calibrate-self needs at least one prompt")
    if k < 1:
        raise ConfigError(f"k={k} must be >= 1")
    t1 = time_forward(rt, 1)
    tk = time_forward(rt, k + 1)
    results: list[Candidate] = []
    for layers in candidates or candidate_layer_sets(rt.num_layers):
        drafter = SelfSpecDrafter(rt, layers)
        tested = [0] * k
        accepted = [0] * k
        for prompt in prompts:
            res = generate(model, prompt, max_new_tokens=max_new_tokens, draft=drafter, k=k)
            for i, (a, t) in enumerate(zip(res.stats.accepted_at, res.stats.tested_at)):
                accepted[i] += a
                tested[i] += t
        rates = [a / t if t else 0.0 for a, t in zip(accepted, tested)]
        c = time_forward(rt, 1, layers=drafter.layers) / t1
        expected = expected_committed_by_position(rates, k)
        cand = Candidate(
            layers=list(drafter.layers),
            description=drafter.description,
            acceptance_by_position=rates,
            draft_cost_ratio=c,
            expected_committed=expected,
            predicted_speedup=predicted_speedup(expected, t1, tk, k * c * t1),
        )
        results.append(cand)
        if on_candidate:
            on_candidate(cand)
    return sorted(results, key=lambda c: -c.predicted_speedup)


def save_calibration(model: Any, best: Candidate, k: int, all_results: Sequence[Candidate]) -> str:
    """Save ``best`` as the model's ``--draft self`` layer set (written atomically: a crash never
    leaves a half-written calibration for ``--draft self`` to trip on)."""
    path = calibration_path(model)
    payload = {
        "model": str(model.folder),
        "layers": best.layers,
        "k": k,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "candidates": [asdict(c) for c in all_results],
    }
    return str(write_json_atomic(path, payload))
