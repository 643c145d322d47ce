"""Routing: which draft and which k one generation runs, for ``bench``, ``serve`` and the
public ``generate`` alike (one function each, so they can never disagree).

- :func:`route`: a plan's choice for a workload category, with the user's k: the plan picks the
  draft, and ``k="auto"`` (the user's) replaces the plan's fixed k with the adaptive policy.
- :func:`policy_for`: a k as the user gave it (a number or ``"auto"``) -> what the decode loop
  takes (a number, or an :class:`~draftwise.cost.adaptive.AdaptiveK` built from the measured
  profile and the drafter's declared capabilities).

>>> class Plan:  # anything with a ``recommended`` table (a cost.plan.Plan) or ``choose``
...     recommended = {"overall": ("lookup", 5), "math": ("none", 0)}
>>> spec, k, source = route(Plan(), "rag")
>>> str(spec), k, source
('lookup', 5, 'overall')
>>> route(Plan(), "rag", "auto")[1], route(Plan(), "math", "auto")[1]
('auto', 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..drafters.base import Capabilities
from ..drafters.spec import DraftSpec, KValue, parse_k
from ..errors import ConfigError
from ..kpolicy import KPolicy
from .adaptive import auto_policy

OVERALL = "overall"


def route(plan: Any, category: str | None, k: KValue | None = None) -> tuple[DraftSpec, KValue, str]:
    """``(draft, k, the category the choice came from)``: the plan's pick for ``category`` when
    the plan has seen it, else its overall pick (a workload may hold categories the plan never
    saw). ``k``: the user's; ``"auto"`` runs the plan's draft with the adaptive k, anything else
    (a number, None) takes the plan's k. A plan that says ``none`` gives k 0."""
    category = category or OVERALL
    recommended = getattr(plan, "recommended", None)
    if isinstance(recommended, Mapping):
        key = category if category in recommended else OVERALL
        if key not in recommended:
            raise ConfigError(
                f"the plan has no choice for category {category!r} and no overall choice; make it "
                "again with `draftwise plan`"
            )
        spec_text, plan_k = recommended[key]
    else:
        key = category
        spec_text, plan_k = plan.choose(category)
    spec = DraftSpec.parse(spec_text)
    if spec.is_none:
        return spec, 0, key
    if k is not None and parse_k(k) == "auto":
        return spec, "auto", key
    return spec, max(int(plan_k), 1), key


def policy_for(
    model: Any, draft: DraftSpec | str | None, k: KValue | KPolicy, *, capabilities: Capabilities | None = None
) -> int | KPolicy:
    """What the decode loop takes for ``k``: a number or a policy as they are; ``"auto"`` ->
    the adaptive policy for ``draft`` from this machine's auto profile (measured and cached on
    first use), told what the drafter declares (``capabilities``; default: what the spec
    declares). No draft: 1 (nothing to adapt)."""
    if isinstance(k, KPolicy) or k != "auto":
        return k  # type: ignore[return-value]
    if draft is None:
        return 1
    spec = DraftSpec.parse(draft)
    return 1 if spec.is_none else auto_policy(model, spec, capabilities=capabilities)
