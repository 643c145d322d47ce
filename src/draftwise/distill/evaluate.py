"""Does the distilled draft pay? Greedy speculative vs plain decoding on held-out prompts.

Per prompt, plain and speculative decoding run back to back, their order alternating from one
prompt to the next, so a shared machine's noise hits both alike. Reported:

- acceptance a = accepted / proposed and #MAT = committed / target passes;
- the measured speedup = plain seconds / speculative seconds over all prompts (both decode
  the same tokens: greedy speculative output equals plain output, which is checked);
- the draft's cost ratio c = T_draft(1) / T_target(1) (one-token passes, warm cache);
- the break-even acceptance for that c at k: the a solving (1 - a^(k+1)) / (1 - a) = k c + 1
  (Leviathan et al.'s model, with T(k+1) = T(1)); a measured a above it should pay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftwise.api import generate
from draftwise.cost.formulas import breakeven_acceptance, leviathan_speedup
from draftwise.cost.timing import time_forward
from draftwise.drafters import make_drafter
from draftwise.errors import ConfigError


def breakeven_for_cost(c: float, k: int) -> float | None:
    """The acceptance a with E(a, k) = k c + 1 (None: no a < 1 breaks even, i.e. c >= 1).

    >>> round(breakeven_for_cost(0.1, 4), 4), breakeven_for_cost(0.0, 4), breakeven_for_cost(1.0, 4)
    (0.2871, 0.0, None)
    """
    return breakeven_acceptance(k, k * c + 1)


@dataclass
class EvalReport:
    """The outcome of :func:`evaluate_draft` (seconds are summed over prompts)."""

    draft: str
    k: int
    prompts: int
    max_new_tokens: int
    tokens: int
    plain_seconds: float
    spec_seconds: float
    proposed: int
    accepted: int
    target_passes: int
    committed: int
    identical: int
    draft_t1: float
    target_t1: float
    per_prompt: list[dict[str, Any]] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_committed(self) -> float:
        """#MAT: committed tokens per target pass (bonus / recovered token included)."""
        return self.committed / self.target_passes if self.target_passes else 0.0

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.spec_seconds if self.spec_seconds > 0 else 0.0

    @property
    def cost_ratio(self) -> float:
        return self.draft_t1 / self.target_t1 if self.target_t1 > 0 else float("inf")

    @property
    def breakeven_acceptance(self) -> float | None:
        return breakeven_for_cost(self.cost_ratio, self.k)

    @property
    def predicted_speedup(self) -> float:
        """Leviathan's model at the measured a and c: E(a, k) / (k c + 1)."""
        if not math.isfinite(self.cost_ratio):
            return 0.0  # not timed (yet)
        return leviathan_speedup(min(self.acceptance, 1 - 1e-9), self.k, self.cost_ratio)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("acceptance", "mean_committed", "speedup", "cost_ratio", "breakeven_acceptance", "predicted_speedup"):
            out[name] = getattr(self, name)
        return out


def evaluate_draft(
    target: Any,
    draft_dir: str | Path,
    prompts: Sequence[str],
    max_new_tokens: int = 128,
    k: int = 4,
    *,
    on_progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Greedy speculative decoding with ``model:draft_dir`` against plain decoding.

    Example (a draft made by ``draftwise distill``)::

        report = evaluate_draft(load_model("default"), "drafts/smol4", held_out, k=4)
        report.acceptance, report.speedup, report.breakeven_acceptance
    """
    if not prompts:
        raise ConfigError("evaluate_draft needs at least one prompt")
    drafter = make_drafter(f"model:{draft_dir}", target)
    assert drafter is not None
    # warm both paths once (first-call allocations), then measure interleaved
    generate(target, prompts[0], max_new_tokens=4, draft=None)
    generate(target, prompts[0], max_new_tokens=4, draft=drafter, k=k)
    report = EvalReport(
        draft=f"model:{draft_dir}", k=k, prompts=len(prompts), max_new_tokens=max_new_tokens, tokens=0,
        plain_seconds=0.0, spec_seconds=0.0, proposed=0, accepted=0, target_passes=0, committed=0,
        identical=0, draft_t1=0.0, target_t1=0.0,
    )
    for i, prompt in enumerate(prompts):
        runs = {}
        for mode in (("plain", "spec") if i % 2 == 0 else ("spec", "plain")):
            runs[mode] = generate(
                target, prompt, max_new_tokens=max_new_tokens, draft=drafter if mode == "spec" else None, k=k
            )
        plain, spec = runs["plain"], runs["spec"]
        st = spec.stats
        same = plain.token_ids == spec.token_ids
        report.tokens += spec.new_tokens
        report.plain_seconds += plain.seconds
        report.spec_seconds += spec.seconds
        report.proposed += st.proposed
        report.accepted += st.accepted
        report.target_passes += st.target_passes
        report.committed += st.committed
        report.identical += int(same)
        report.per_prompt.append(
            {
                "tokens": spec.new_tokens,
                "plain_seconds": plain.seconds,
                "spec_seconds": spec.seconds,
                "acceptance": st.acceptance_rate,
                "mean_committed": st.mean_committed_per_pass,
                "identical": same,
            }
        )
        if on_progress:
            on_progress(i + 1, len(prompts))
    draft_rt = getattr(drafter, "rt", None)
    ctx = min(128, target.runtime.max_context - 2, draft_rt.max_context - 2 if draft_rt else 128)
    report.target_t1 = time_forward(target.runtime, 1, context=ctx)
    report.draft_t1 = time_forward(draft_rt, 1, context=ctx) if draft_rt is not None else 0.0
    return report
