"""Routing: which draft and which k one generation runs, for ``bench``, ``serve`` and the
public ``generate`` alike (one function each, so they can never disagree).

- :func:`route`: a plan's choice for a workload category, with the user's k. A plan that
  considered the adaptive policy (its ``ks`` hold ``"auto"``) is followed exactly: its draft
  and its k, fixed or ``"auto"``, whatever k the user gave. With an older plan, the plan picks
  the draft and the user's ``k="auto"`` replaces the plan's fixed k with the adaptive policy.
- :func:`policy_for`: a k as the user gave it (a number or ``"auto"``) -> what the decode loop
  takes (a number, or an :class:`~draftwise.policy.adaptive.AdaptiveK` built from the measured
  profile and the drafter's declared capabilities).

>>> class Plan:  # anything with a ``recommended`` table (a cost.plan.Plan) or ``choose``
...     recommended = {"overall": ("lookup", 5), "math": ("none", 0)}
>>> spec, k, source = route(Plan(), "rag")
>>> str(spec), k, source
('lookup', 5, 'overall')
>>> route(Plan(), "rag", "auto")[1], route(Plan(), "math", "auto")[1]
('auto', 0)
>>> class Newer:  # a plan that weighed the adaptive policy against every fixed k
...     ks = [1, 2, 3, "auto"]
...     recommended = {"overall": ("suffix", "auto"), "rag": ("lookup", 3)}
>>> route(Newer(), "rag", "auto")[1], route(Newer(), "qa")[1], route(Newer(), "qa", 2)[1]
(3, 'auto', 'auto')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise.core.draft import Capabilities
from draftwise.core.kpolicy import KPolicy
from draftwise.drafters.spec import DraftSpec, KValue, parse_k
from draftwise.errors import ConfigError
from draftwise.policy.adaptive import auto_policy

OVERALL = "overall"


def route(plan: Any, category: str | None, k: KValue | None = None) -> tuple[DraftSpec, KValue, str]:
    """``(draft, k, the category the choice came from)``: the plan's pick for ``category`` when
    the plan has seen it, else its overall pick (a workload may hold categories the plan never
    saw). ``k``: the user's. A plan whose candidates included ``"auto"`` is run as it says; with
    an older plan, ``"auto"`` runs the plan's draft with the adaptive k, anything else (a
    number, None) takes the plan's k. A plan that says ``none`` gives k 0."""
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
    if plan_k == "auto":
        return spec, "auto", key
    weighed_auto = "auto" in (getattr(plan, "ks", None) or ())
    if k is not None and parse_k(k) == "auto" and not weighed_auto:
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
