"""How a request speculates: the server's default, the plan's choice, or the request's own.

Precedence: the request's ``speculative`` object, then the server's ``--draft``/``--k``. A
``draft`` of ``auto`` (the server's or the request's) asks the plan for the request's
``category`` through :func:`draftwise.planner.route.route`, the routing ``bench`` and ``generate``
use too (the overall pick for a category the plan has not seen, ``none`` meaning plain
decoding). The plan's k is used unless the server runs with ``--k auto``: then the plan picks
the draft and the adaptive k runs it (docs/serving.md). A request that only sets ``k`` keeps the server's draft.

Only the drafts the server was started with may run: ``--draft``, the plan's drafts, the
``--allow-draft`` list, and ``none``. A request naming any other draft (``eagle:/etc``,
``model:/x``, ``lookup:max=7``) gets HTTP 400 listing the allowed ones, before anything is
built for it: a client never makes the server open a path, and no loader's error (which would
tell whether a path exists) reaches a client.

State, all of it made by :meth:`Speculation.warm_up` on the model thread before the first
request and only read afterwards, so it is bounded by the allowed list:

- one drafter per allowed draft, reused by every request (a drafter is restarted per generation
  through ``start``; a suffix drafter's cache of earlier answers is therefore one per server);
- when the server's k is ``auto``, one machine profile covering every allowed draft, read (or
  measured, once) at start-up. A request never starts a measurement: on a server with a fixed
  k, a request asking ``k: "auto"`` gets 400. Each request gets a fresh
  :class:`~draftwise.policy.adaptive.AdaptiveK`, since the policy learns from one generation's
  acceptance.
- on a batched worker (``--max-batch`` > 1) with k ``auto``, the batch profile, read at
  start-up (:meth:`Speculation.follow_batch`), and one
  :class:`~draftwise.policy.batch.BatchKCoordinator`: each step every such request's k is
  chosen together, from the goodput of the batch as it is, so speculation turns down as the
  batch fills. What a sequence costs the step outside the pass, plain or speculating, it prices
  by what the worker measures of the served steps (:class:`~draftwise.policy.outside_pass.OutsidePass`).
  With the plan's concurrency prediction beside it (``concurrency.json``), a pass of more
  sequences than its speculating limit steps plain (:mod:`draftwise.policy.batch_limit`).
  Without a batch profile (or one measured for smaller batches) each request keeps
  its own adaptive k, and the log says in one line how to make one: the server never measures
  one itself (a minute or more of passes at start-up, and a second writer of the planner's file).
- for each allowed draft that learns across requests (``suffix``, whose cache holds earlier
  answers), a second drafter of it that does not (:func:`without_learning`), per slot too.

A seeded sampled request is reproducible (docs/contract.md): it speculates from its own state
only (``Choice.isolated``). Sampled verification draws its random numbers per proposed token,
so the sample a seed gives depends on what was proposed; a drafter reading the cache of earlier
answers, or a k chosen from what other requests did (the batch's goodput, a draft's shared tree
sizes), would make the same seeded request draw another sample (from the same distribution)
after the server had served others. So such a request drafts with the isolated drafter (its own
prompt and output), and under k ``auto`` adapts from its own acceptance alone.

The cap on k (``--max-k``, :data:`DEFAULT_MAX_K`): a request's k is refused above it (HTTP 400
naming it), the server's ``--k`` may not exceed it, a plan's k and k ``auto``'s range are held
under it. A step verifies k + 1 rows of a sequence: without a cap one client asking ``k: 256``
would make every pass of the batch it joins verify 257 rows for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from draftwise.core.draft import Drafter
from draftwise.core.kpolicy import KPolicy
from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path
from draftwise.cost.goodput import StepCost
from draftwise.cost.served import ServedProfile, default_served_profile_path
from draftwise.drafters.factory import capabilities_of, make_drafter
from draftwise.drafters.spec import DEFAULT_MAX_K, DraftSpec, KValue, clip
from draftwise.errors import ConfigError
from draftwise.planner.defaults import DEFAULT_DRAFTS
from draftwise.planner.plan import Plan, make_plan
from draftwise.planner.route import route
from draftwise.policy.adaptive import AdaptiveK, TreeSizes, resolve_profile
from draftwise.policy.batch import BatchGoodput, BatchKCoordinator
from draftwise.policy.batch_limit import speculating_limit
from draftwise.questions import DEFAULT_QUESTIONS, read_questions, select_questions
from draftwise.server.protocol import APIError, Speculative

log = logging.getLogger("draftwise.server")
AUTO = "auto"
NONE = DraftSpec.parse("none")
#: the largest k ``auto`` proposes on its own (AdaptiveK's default for a chain)
AUTO_K_MAX = 8


@dataclass(frozen=True)
class Choice:
    """The speculation one request runs with, and who chose it (request, server or plan)."""

    draft: DraftSpec
    k: KValue
    chosen_by: str
    category: str | None = None
    #: speculates from this request alone (a seeded sampled request, so its seed reproduces it)
    isolated: bool = False

    @property
    def label(self) -> str:
        return "none" if self.draft.is_none else f"{self.draft}@k={self.k}"


def allowed_drafts(default: DraftSpec | str, plan: Plan | None, allow: Iterable[DraftSpec | str]) -> dict[str, DraftSpec]:
    """The drafts a server started with ``--draft default``, ``plan`` and ``--allow-draft allow``
    may run, by canonical spec (``none`` always: plain decoding opens nothing).

    >>> sorted(allowed_drafts("lookup", None, ["lookup:min=1,max=3", "suffix"]))
    ['lookup', 'none', 'suffix']
    """
    named: list[DraftSpec | str] = [] if default == AUTO else [default]
    if plan is not None:
        named += plan.drafts
        named += [draft for draft, _ in plan.recommended.values()]  # k may be "auto"
    specs = [NONE, *(DraftSpec.parse(d) for d in [*named, *allow])]
    return {str(s): s for s in specs}


def without_learning(spec: DraftSpec) -> DraftSpec:
    """``spec`` without the state it learns across requests (a suffix draft's cache of earlier
    answers turned off); ``spec`` itself when it learns nothing.

    >>> str(without_learning(DraftSpec.parse("suffix:nodes=8"))), str(without_learning(DraftSpec.parse("lookup")))
    ('suffix:nodes=8,cache=0', 'lookup')
    """
    if not capabilities_of(spec).learns:
        return spec
    alone = replace(spec, cache=0)
    if capabilities_of(alone).learns:  # a draft that learns some other way: refuse it at start-up
        raise ConfigError(f"the draft {spec} learns across requests and has no setting to turn that off, "
                          "so a seeded request could not be reproduced; leave it out of the allowed drafts")
    return alone


class Speculation:
    """The server's speculation settings, and the drafters and profile of its allowed drafts."""

    def __init__(self, model: Any, *, draft: DraftSpec | str, k: KValue, plan: Plan | None,
                 allow: Iterable[DraftSpec | str] = (), capacity: Mapping[str, Any] | None = None,
                 max_k: int = DEFAULT_MAX_K) -> None:
        if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
            raise ConfigError(f"--max-k {max_k!r} must be a whole number >= 1")
        if isinstance(k, int) and k > max_k:
            raise ConfigError(f"--k {k} is over --max-k {max_k}; lower --k or raise --max-k")
        self.model = model
        self.max_k = max_k
        #: the plan's concurrency prediction (``concurrency.json``): sets the speculating limit
        self.capacity = capacity
        self.default_draft = draft if draft == AUTO else DraftSpec.parse(draft)
        self.default_k = k
        self.plan = plan
        if self.default_draft == AUTO and plan is None:
            raise ConfigError("--draft auto needs a plan: pass --plan PATH, or let the server make one at start-up")
        #: canonical spec -> spec; nothing else is ever built, so the caches below are bounded by it
        self.allowed = allowed_drafts(self.default_draft, plan, allow)
        self._drafters: dict[str, Drafter | None] = {}
        #: with a batched worker, each slot's own drafters (sharing the ones above's caches)
        self._slot_drafters: list[dict[str, Drafter | None]] = []
        #: the drafters of isolated requests (``Choice.isolated``): a learning draft's own, without
        #: what it learned (:func:`without_learning`), the shared one otherwise; unbatched, then per slot
        self._isolated: list[dict[str, Drafter | None]] = []
        self._followed = False  # follow_batch ran (it runs once)
        self._profile: Any = None  # one profile covering every allowed draft, when k may be auto
        #: k auto on a batched worker with a batch profile: the per-step goodput policy
        self.coordinator: BatchKCoordinator | None = None
        self._tree_sizes: dict[str, TreeSizes] = {}  # per allowed draft, shared by its requests
        self._warm = False

    def warm_up(self, slot_models: Sequence[Any] = ()) -> None:
        """Build every allowed drafter now (a model or eagle draft loads its weights; a draft
        that cannot run on this model fails here, at start-up, not in a request) and, when the
        server's k is ``auto``, read or measure the profile for all of them. Idempotent; run on
        the model thread before serving (``create_app`` does)."""
        if self._warm:
            return
        for key, spec in self.allowed.items():
            self._drafters[key] = make_drafter(spec, self.model)
        for slot_model in slot_models or ():  # one generation per slot at a time, each its drafters
            self._slot_drafters.append({
                key: make_drafter(spec, slot_model, share_with=self._drafters[key]) for key, spec in self.allowed.items()
            })
        alone = {key: without_learning(spec) for key, spec in self.allowed.items()}
        for model, shared in zip([self.model, *slot_models], [self._drafters, *self._slot_drafters]):
            own = {key: make_drafter(spec, model) for key, spec in alone.items() if spec != self.allowed[key]}
            self._isolated.append({**shared, **own})
        plan_auto = self.plan is not None and any(k == AUTO for _, k in self.plan.recommended.values())
        if self.default_k == AUTO or plan_auto:  # a plan may recommend the adaptive k itself
            drafts = [key for key in self.allowed if key != "none"]
            if drafts:
                log.info("reading (or measuring, once) this machine's profile for %s, k=auto", ", ".join(drafts))
                self._profile = self._resolve_profile(drafts)
        self._warm = True

    def _resolve_profile(self, drafts: list[str]) -> Any:
        return resolve_profile(self.model, drafts)

    def follow_batch(self, engine: Any, *, on_k: Callable[[str, int], None] | None = None) -> None:
        """With k ``auto`` on a batched ``engine``: the goodput policy (module docstring), priced by
        the batch profile read now, becomes the engine's scheduler; ``on_k(draft, k)``: every k
        chosen. Run after :meth:`warm_up`; later calls do nothing (nor warn again)."""
        if self._profile is None or self._followed:
            return
        self._followed = True
        make = (f"measure one once with `draftwise plan --concurrency 1,2,4,8,{max(16, engine.max_batch)} --out DIR` "
                "(same --model, --dtype and --quant; the server reads it at start-up)")
        try:
            batch = self._load_batch_profile()
            if batch.max_batch < engine.max_batch:
                raise ConfigError(f"the batch profile covers batches of up to {batch.max_batch}, "
                                  f"not --max-batch {engine.max_batch}")
        except ConfigError as exc:
            log.warning("k=auto at batch: %s, so each request keeps its own adaptive k; %s", exc, make)
            return
        goodput = BatchGoodput(batch, self._profile, k_max=min(AUTO_K_MAX, self.max_k),
                               cost=StepCost.served_from(batch, self._profile, self._served_profile(batch)))
        goodput.measure_outside()  # the worker reports each step's seconds outside its pass
        goodput.calibrate()  # each draft's expected tokens at batch, by what its batch steps accepted
        if self.capacity is not None:
            try:
                goodput.speculate_up_to = speculating_limit(self.capacity, batch)
                log.info("k=auto at batch: speculating in passes of up to %d sequences, the largest N at which "
                         "the plan's concurrency prediction keeps the policy >= 1.0x plain at its interval's low end "
                         "(%s)", goodput.speculate_up_to, self.capacity.get("source", "concurrency.json"))
            except ConfigError as exc:
                log.warning("k=auto at batch: not using the concurrency prediction: %s", exc)
        self.coordinator = BatchKCoordinator(
            goodput, wait=engine.wait_for_schedule, on_k=on_k, size=lambda: engine.running,
            price=lambda others: batch.priced_rows(others.decode_rows, others.prompt_rows))
        engine.scheduler = self.coordinator
        log.info("k=auto at batch: each step's k's from the goodput of the batch as it is (batch profile "
                 "measured %s, batches up to %d)", batch.created or "earlier", batch.max_batch)

    def _served_profile(self, batch: BatchProfile) -> ServedProfile | None:
        """The served step measured for this batch profile (``plan --concurrency`` measures it),
        so the policy prices each pass as served; None (the passes alone) where there is none."""
        path = default_served_profile_path(self.model)
        try:
            served = ServedProfile.load(path) if path.is_file() else None
            if served is not None:
                served.check_batch(batch)
        except ConfigError as exc:
            log.info("k=auto at batch: pricing the passes alone: %s", exc)
            return None
        if served is not None:
            log.info("k=auto at batch: passes priced as served (%s)", path)
        return served

    def _load_batch_profile(self) -> BatchProfile:
        path = default_batch_profile_path(self.model)
        if not path.is_file():
            raise ConfigError(f"no batch profile at {path}")
        batch = BatchProfile.load(path)
        batch.check_model(self.model)
        return batch

    def choose(self, req: Speculative | None, *, isolated: bool = False) -> Choice:
        """The request's speculation, validated (HTTP 400 naming ``speculative.*`` if refused);
        ``isolated``: it speculates from its own state only (a seeded sampled request)."""
        draft: DraftSpec | str = self.default_draft
        k: KValue = self.default_k
        by = "server"
        category = req.category if req else None
        if req is not None and req.draft is not None:
            draft, by = (AUTO if req.draft == AUTO else DraftSpec.parse(req.draft)), "request"
        if req is not None and req.category is not None and req.draft is None:
            draft = AUTO
        if draft == AUTO:
            draft, k = self._plan_choice(category)
            by = "plan"
        assert isinstance(draft, DraftSpec)
        if req is not None and req.k is not None:
            k = req.k
            by = "plan+request" if by == "plan" else "request"
            if isinstance(k, int) and k > self.max_k:
                raise APIError(400, f"k={k} is over this server's cap of {self.max_k} (--max-k); send k <= "
                               f"{self.max_k} or 'auto'", param="speculative.k", code="invalid_value")
        self._check_allowed(draft)
        if k == AUTO and not draft.is_none and self._profile is None:
            raise APIError(400, f"k 'auto' is not available on this server: it runs a fixed k ({self.default_k}), "
                           "so no machine profile was read at start-up; send a number, or start the server "
                           "with --k auto", param="speculative.k", code="unsupported_value")
        return Choice(draft=NONE if draft.is_none else draft, k=0 if draft.is_none else k,
                      chosen_by=by, category=category, isolated=isolated)

    def _plan_choice(self, category: str | None) -> tuple[DraftSpec, KValue]:
        """The plan's draft for ``category`` and its k; a server started with ``--k auto`` adapts k
        for the plan's drafts too; a plan's k over ``max_k`` is held at it."""
        if self.plan is None:
            raise APIError(400, "this server has no plan, so draft 'auto' is not available; start it "
                           "with --draft auto (and --plan), or name a draft", param="speculative.draft",
                           code="unsupported_value")
        draft, k, _ = route(self.plan, category, self.default_k)
        return draft, min(k, self.max_k) if isinstance(k, int) else k

    def _check_allowed(self, draft: DraftSpec) -> None:
        """Refuse a draft the server was not started with, before anything is built for it."""
        if str(draft) not in self.allowed:
            raise APIError(400, f"the draft {clip(str(draft))} is not one this server runs; allowed: "
                           f"{', '.join(self.allowed)} (the server's operator adds drafts with --allow-draft)",
                           param="speculative.draft", code="draft_not_allowed")

    def build(self, choice: Choice, slot: int | None = None) -> tuple[Drafter | None, int | KPolicy]:
        """The drafter and k (a number, or a fresh adaptive policy) for one generation (in the
        batched worker's ``slot``). An isolated choice gets the drafter that learns nothing across
        requests and a k ``auto`` of its own: no shared tree sizes, no batch scheduler."""
        if choice.draft.is_none:
            return None, 1
        if not self._warm:
            raise RuntimeError("Speculation.warm_up() has not run: the server builds its drafters at start-up")
        # choose() let only allowed drafts through
        if choice.isolated:
            drafters = self._isolated[0 if slot is None else slot + 1]
        else:
            drafters = self._drafters if slot is None else self._slot_drafters[slot]
        drafter = drafters[str(choice.draft)]
        if choice.k == AUTO:
            # the start-up profile, never one measured in a request; the drafter's own statement
            # one TreeSizes per draft: what a request learns of its tree sizes, the next starts from
            sizes = TreeSizes() if choice.isolated else self._tree_sizes.setdefault(str(choice.draft), TreeSizes())
            adaptive = AdaptiveK(self._profile, str(choice.draft), capabilities=drafter.capabilities,
                                 tree_sizes=sizes, k_max=min(AUTO_K_MAX, self.max_k))
            if slot is not None and self.coordinator is not None and not choice.isolated:  # k from the batch
                return drafter, self.coordinator.policy(adaptive, str(choice.draft))
            return drafter, adaptive
        assert isinstance(choice.k, int)
        return drafter, choice.k


def startup_plan(model: Any, *, per_category: int = 1, max_new_tokens: int = 64,
                 max_k: int = DEFAULT_MAX_K) -> Plan:
    """A plan made at start-up for ``--draft auto`` without ``--plan``: the default drafts
    (:data:`~draftwise.planner.defaults.DEFAULT_DRAFTS`: lookup and suffix), k = 1..8 (at most
    ``max_k``), on ``per_category`` dev questions per category (Spec-Bench's), from the cached profile."""
    questions = select_questions(read_questions(DEFAULT_QUESTIONS), per_category)
    drafts = list(DEFAULT_DRAFTS)
    profile = resolve_profile(model, drafts)
    ks = list(range(1, min(AUTO_K_MAX, profile.max_n - 1, max_k) + 1))
    log.info("making a plan at start-up: %s, k=1..%d, %d dev questions", ", ".join(drafts), ks[-1], len(questions))
    return make_plan(model, questions, profile, drafts=drafts, ks=ks, max_new_tokens=max_new_tokens)
