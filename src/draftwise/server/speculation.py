"""How a request speculates: the server's default, the plan's choice, or the request's own.

Precedence: the request's ``speculative`` object, then the server's ``--draft``/``--k``. A
``draft`` of ``auto`` (the server's or the request's) asks the plan for the request's
``category`` (``overall`` when none is given): ``Plan.choose(category)`` -> (draft, k), and
``none`` there means plain decoding. The plan's k is used unless the server runs with ``--k
auto``: then the plan picks the draft and the adaptive k runs it (the load test measured 1.33x
plain that way, see docs/serving.md). A request that only sets ``k`` keeps the server's draft.

Drafters are made once and reused (a drafter is restarted per generation through ``start``).
A ``model:`` draft loads weights from a path, so only the drafts named at start-up (the
server's ``--draft`` and the plan's drafts) may be used: a client never makes the server open
a path. ``k="auto"`` reads the machine profile once per draft (measured at start-up when the
server's own k is ``auto``) and builds a fresh :class:`~draftwise.cost.adaptive.AdaptiveK` per
request, since the policy learns from one generation's acceptance.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..cost.adaptive import AdaptiveK, resolve_profile
from ..cost.plan import Plan, make_plan
from ..drafters.base import Drafter
from ..drafters.factory import make_drafter
from ..drafters.spec import DraftSpec, KValue
from ..errors import ConfigError
from ..kpolicy import KPolicy
from ..questions import DEFAULT_QUESTIONS, read_questions, select_questions
from .protocol import APIError, Speculative

log = logging.getLogger("draftwise.server")
AUTO = "auto"
NONE = DraftSpec.parse("none")


@dataclass(frozen=True)
class Choice:
    """The speculation one request runs with, and who chose it (request, server or plan)."""

    draft: DraftSpec
    k: KValue
    chosen_by: str
    category: str | None = None

    @property
    def label(self) -> str:
        return "none" if self.draft.is_none else f"{self.draft}@k={self.k}"


class Speculation:
    """The server's speculation settings, its drafters and profiles."""

    def __init__(self, model: Any, *, draft: DraftSpec | str, k: KValue, plan: Plan | None) -> None:
        self.model = model
        self.default_draft = draft if draft == AUTO else DraftSpec.parse(draft)
        self.default_k = k
        self.plan = plan
        if self.default_draft == AUTO and plan is None:
            raise ConfigError("--draft auto needs a plan: pass --plan PATH, or let the server make one at start-up")
        self._drafters: dict[str, Drafter | None] = {}
        self._profiles: dict[str, Any] = {}
        self._lock = threading.Lock()
        named = [] if self.default_draft == AUTO else [self.default_draft]
        named += [DraftSpec.parse(d) for d in (plan.drafts if plan else [])]
        self.allowed_models = {str(s) for s in named if s.kind == "model"}

    def warm_up(self) -> None:
        """Make the start-up drafts now (a model draft loads its weights) and, where k is auto,
        read or measure the profile, so the first request does not pay for it."""
        specs = [] if self.default_draft == AUTO else [self.default_draft]
        specs += [DraftSpec.parse(d) for d in (self.plan.drafts if self.plan else [])]
        for spec in specs:
            self.drafter(spec)
            if self.default_k == AUTO and not spec.is_none:
                self._profile(spec)

    def choose(self, req: Speculative | None) -> Choice:
        """The request's speculation, validated (HTTP 400 naming ``speculative.*`` if refused)."""
        draft: DraftSpec | str = self.default_draft
        k: KValue = self.default_k
        by = "server"
        category = req.category if req else None
        if req is not None and req.draft is not None:
            draft, by = (AUTO if req.draft == AUTO else DraftSpec.parse(req.draft)), "request"
        if req is not None and req.category is not None and req.draft is None:
            draft = AUTO
        if draft == AUTO:
            if self.plan is None:
                raise APIError(400, "this server has no plan, so draft 'auto' is not available; start it "
                               "with --draft auto (and --plan), or name a draft", param="speculative.draft",
                               code="unsupported_value")
            plan_draft, plan_k = self.plan.choose(category or "overall")
            # a server started with --k auto adapts k for the plan's drafts too
            draft, by = DraftSpec.parse(plan_draft), "plan"
            k = AUTO if self.default_k == AUTO else max(plan_k, 1)
        assert isinstance(draft, DraftSpec)
        if req is not None and req.k is not None:
            k = req.k
            by = "plan+request" if by == "plan" else "request"
        if draft.kind == "model" and str(draft) not in self.allowed_models:
            named = ", ".join(sorted(self.allowed_models)) or "none"
            raise APIError(400, f"model drafts are fixed at start-up (this server has: {named}); "
                           "a request cannot load weights from a path", param="speculative.draft",
                           code="unsupported_value")
        return Choice(draft=NONE if draft.is_none else draft, k=0 if draft.is_none else k,
                      chosen_by=by, category=category)

    def drafter(self, spec: DraftSpec) -> Drafter | None:
        key = str(spec)
        with self._lock:
            if key not in self._drafters:
                self._drafters[key] = make_drafter(spec, self.model)
            return self._drafters[key]

    def _profile(self, spec: DraftSpec) -> Any:
        key = str(spec)
        with self._lock:
            if key not in self._profiles:
                log.info("reading (or measuring, once) this machine's profile for %s, k=auto", key)
                self._profiles[key] = resolve_profile(self.model, key)
            return self._profiles[key]

    def build(self, choice: Choice) -> tuple[Drafter | None, int | KPolicy]:
        """The drafter and k (a number, or a fresh adaptive policy) for one generation."""
        if choice.draft.is_none:
            return None, 1
        drafter = self.drafter(choice.draft)
        if choice.k == AUTO:
            return drafter, AdaptiveK(self._profile(choice.draft), str(choice.draft))
        assert isinstance(choice.k, int)
        return drafter, choice.k


def startup_plan(model: Any, *, per_category: int = 1, max_new_tokens: int = 64) -> Plan:
    """A plan made at start-up for ``--draft auto`` without ``--plan``: prompt lookup, k = 1..8,
    on ``per_category`` dev questions per category (Spec-Bench's), from the cached profile."""
    questions = select_questions(read_questions(DEFAULT_QUESTIONS), per_category)
    profile = resolve_profile(model, "lookup")
    ks = list(range(1, min(8, profile.max_n - 1) + 1))
    log.info("making a plan at start-up: lookup, k=1..%d, %d dev questions", ks[-1], len(questions))
    return make_plan(model, questions, profile, drafts=("lookup",), ks=ks, max_new_tokens=max_new_tokens)
