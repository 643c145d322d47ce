"""Running one method on one question: prompts, drafters, the plan's choice for ``auto``.

Multi-turn questions are conversations: turn ``i``'s prompt holds the method's *own* earlier
answers (through the chat template, or as raw text for a model without one), as in Spec-Bench.

Every method owns its drafters (built here, once, for it alone): a draft that learns across
generations (suffix decoding's cache) learns only from its own method's answers, so two methods
with the same spec, or ``auto`` routed to ``suffix`` beside ``suffix``, never read each other's.
It learns from *every* answer of its method, once, after the clock stopped (:func:`teach`): the
standalone ``suffix`` every answer it decodes, and each learning drafter of ``auto`` every answer
``auto`` gives, also where the plan routed the prompt elsewhere (to ``lookup``, or plain decoding).

The plan's choice for ``auto`` and the k it runs come from :func:`draftwise.planner.route.route`,
as in ``serve``: the plan's draft at the plan's k, which may be ``"auto"`` (the adaptive policy,
a fresh one per generation); with ``--k auto`` the adaptive k runs whatever draft the plan picks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from draftwise import api
from draftwise.bench.answers import TurnResult
from draftwise.bench.hf_peer import HFPeer, hf_methods
from draftwise.bench.methods import AUTO, BASELINE, DraftItem, Method, parse_methods
from draftwise.core.generation import Generation
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.factory import capabilities_of, make_drafter
from draftwise.drafters.spec import DraftSpec, KValue, parse_k
from draftwise.errors import ConfigError
from draftwise.planner.plan import load_plan
from draftwise.planner.route import policy_for, route
from draftwise.questions import Question
from draftwise.runtime.chat import encode_conversation


def build_prompt(model: Any, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Token ids of a conversation up to the next answer (``len(turns) == len(answers) + 1``)."""
    return encode_conversation(model.tokenizer, turns, answers)


def build_methods(model: Any, drafts: str | Sequence[DraftItem], k: KValue, peers: Sequence[str]) -> list[Method]:
    """The baseline, one method per draft (its drafter built once, here) and the peers' methods."""
    methods = [Method(BASELINE, "draftwise", BASELINE, 1)]
    for name, spec, mk in parse_methods(drafts, k):
        if spec == AUTO:
            methods.append(Method(name, "auto", AUTO, mk))
        else:
            methods.append(Method(name, "draftwise", str(spec), mk, drafter=make_drafter(spec, model)))
    if "hf" in peers:
        methods += hf_methods(model, methods, parse_k(k))
    return methods


def teach(drafter: Any, prompt_ids: Sequence[int], answer: Sequence[int], sampling: SamplingConfig) -> None:
    """``drafter`` (one that learns across generations) learns ``answer``, which another
    drafter decoded from ``prompt_ids``, as if it had decoded it itself: its lifecycle for a
    generation in which it proposed nothing (``start``, then ``end`` with the answer)."""
    generation = Generation(eos_token_ids=(), max_new_tokens=max(len(answer), 1), drafter=drafter)
    generation.start(prompt_ids, sampling, sampling.generator())
    generation.play(answer)
    generation.end()


#: with ``settle``, a turn runs at most this many times ``repeats`` rounds
SETTLE_CAP = 3


def settled(seconds: Sequence[float], tol: float) -> bool:
    """Whether the two fastest of ``seconds`` agree within ``tol`` (a fraction of the fastest):
    the fastest run is then not a lone lucky one, nor are all of them slowed alike by a burst.

    >>> settled([4.1, 3.19, 3.54], 0.05), settled([4.1, 3.19, 3.25], 0.05)
    (False, True)
    """
    if len(seconds) < 2:
        return False
    a, b = sorted(seconds)[:2]
    return b - a <= tol * a


def load_plan_for_auto(plan: Any, out_dir: Path | None) -> Any:
    """The plan ``--drafts auto`` follows: a plan object (anything with ``choose``), a path to
    ``plan.json`` or its folder, or by default ``OUT/plan.json``."""
    if plan is not None and hasattr(plan, "choose"):
        return plan
    path = Path(plan).expanduser() if plan is not None else (out_dir / "plan.json" if out_dir else None)
    if path is not None and path.is_dir():
        path = path / "plan.json"
    if path is None or not path.is_file():
        where = f" ({path} does not exist)" if path is not None else ""
        raise ConfigError(
            f"--drafts auto needs a plan: run `draftwise plan ... --out DIR` first or pass --plan FILE{where}"
        )
    return load_plan(path)


class Runner:
    """Runs methods on questions; keeps the drafters ``auto`` builds (its own, apart from every
    other method's) and the HF peer."""

    def __init__(self, model: Any, max_new_tokens: int, sampling: SamplingConfig, plan: Any = None,
                 repeats: int = 1, settle: float | None = None) -> None:
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.plan = plan
        self.repeats = repeats
        self.settle = settle
        self.auto_drafters: dict[tuple[str, str], Any] = {}  # (method, spec) -> drafter
        self.peer: HFPeer | None = None

    def _auto_drafter(self, method: Method, spec: DraftSpec) -> Any:
        """``method``'s own drafter for ``spec`` (built once; None for plain decoding)."""
        key = (method.name, str(spec))
        if key not in self.auto_drafters:  # one method's drafters are its own
            self.auto_drafters[key] = make_drafter(spec, self.model)
        return self.auto_drafters[key]

    def _learners(self, method: Method) -> list[Any]:
        """``method``'s drafters that learn across generations, one for each learning draft the
        plan may route to, built before its first answer so each learns from every answer."""
        recommended = getattr(self.plan, "recommended", None)  # a Plan; else only what was routed
        if isinstance(recommended, Mapping):
            for spec_text, _ in recommended.values():
                spec = DraftSpec.parse(spec_text)
                if not spec.is_none and capabilities_of(spec).learns:
                    self._auto_drafter(method, spec)
        return [d for (name, _), d in self.auto_drafters.items()
                if name == method.name and d is not None and d.capabilities.learns]

    def _auto(self, method: Method, category: str) -> tuple[str, Any, KValue, str]:
        spec, k, source = route(self.plan, category, method.k)
        drafter = self._auto_drafter(method, spec)
        if drafter is None:  # the plan says no speculation pays here: plain decoding (k unused)
            return str(spec), None, 1, source
        return str(spec), drafter, parse_k(k), source

    def turn(self, method: Method, prompt_ids: list[int], category: str) -> TurnResult:
        """One timed generation of ``method`` from ``prompt_ids``. A draft that learns across
        generations does not learn from it: :meth:`questions` teaches the answer it keeps."""
        if method.kind == "hf":
            if self.peer is None:
                self.peer = HFPeer(self.model)
            return self.peer.generate(method, prompt_ids, self.max_new_tokens, self.sampling)
        spec, drafter, k = method.spec, method.drafter, method.k
        extra: dict[str, Any] = {}
        if method.kind == "auto":
            spec, drafter, k, extra["plan_choice_for"] = self._auto(method, category)
        policy: Any = 1
        if drafter is not None:  # k "auto": a fresh adaptive policy for this generation
            policy = policy_for(self.model, spec, k, capabilities=drafter.capabilities)
        res = api.generate(
            self.model, prompt_ids, max_new_tokens=self.max_new_tokens, sampling=self.sampling,
            draft=drafter, k=policy, learn=False,
        )
        st = res.stats
        stats = {
            "draft": spec,
            "k": k if drafter is not None else 0,
            **extra,
            "target_passes": st.target_passes,
            "committed": st.committed,
            "proposed": st.proposed,
            "depth": st.depth,
            "accepted": st.accepted,
            "draft_seconds": st.draft_seconds,
            "verify_seconds": st.verify_seconds,
            "tested_at": list(st.tested_at),
            "accepted_at": list(st.accepted_at),
            "tree_passes": st.tree_passes,
            "tree_nodes": st.tree_nodes,
            "finish_reason": res.finish_reason,
        }
        return TurnResult(res.text, list(res.token_ids), res.seconds, stats, list(st.accept_lengths))

    def _fastest(self, method: Method, runs: Sequence[TurnResult]) -> TurnResult:
        """The fastest of one turn's runs; its stats carry every run's ``repeat_seconds``. Runs
        that decoded other tokens are an error, not a timing."""
        for i, r in enumerate(runs[1:], start=2):
            if r.token_ids != runs[0].token_ids:
                raise RuntimeError(f"{method.name}: run {i} of {self.repeats} of one turn decoded other tokens "
                                   "than run 1, so their times are not of the same work")
        best = min(runs, key=lambda r: r.seconds)
        if self.repeats > 1:
            best.stats["repeat_seconds"] = [r.seconds for r in runs]
        return best

    def questions(self, methods: Sequence[Method], q: Question, shift: int = 0) -> dict[str, list[TurnResult]]:
        """All turns of ``q`` for each of ``methods`` (each method's answers go into its own next
        turn), by method name. Turn by turn, ``repeats`` rounds each run every method's turn once,
        the order rotating by ``shift`` and the round, so methods alternate within seconds and the
        machine's drift falls on all of them alike; the fastest run of each counts. With
        ``settle``, more rounds of every method follow while any method's two fastest runs still
        differ by more than that fraction (a burst of the host's noise in all but one run, or in
        every run), up to :data:`SETTLE_CAP` times ``repeats`` rounds: every method keeps the
        fastest of as many runs, since the fastest of more runs is faster by chance alone. No run
        teaches the drafts that learn across generations; the fastest run's answer does, once,
        after the clock stopped, so every run of a turn starts from the same cache and decodes
        the same tokens (greedy, or seeded sampling)."""
        history: dict[str, list[str]] = {m.name: [] for m in methods}
        results: dict[str, list[TurnResult]] = {m.name: [] for m in methods}
        for i in range(len(q.turns)):
            prompts = {m.name: build_prompt(self.model, q.turns[: i + 1], history[m.name]) for m in methods}
            runs: dict[str, list[TurnResult]] = {m.name: [] for m in methods}
            rounds = 0
            while self._more(rounds, runs.values()):
                s = (shift + rounds) % len(methods)
                for m in [*methods[s:], *methods[:s]]:
                    runs[m.name].append(self.turn(m, prompts[m.name], q.category))
                rounds += 1
            for m in methods:
                best = self._fastest(m, runs[m.name])
                self._learn(m, prompts[m.name], best.token_ids)
                history[m.name].append(best.text)
                results[m.name].append(best)
        return results

    def _more(self, rounds: int, runs: Iterable[Sequence[TurnResult]]) -> bool:
        """Whether a turn runs another round: fewer than ``repeats``, or (with ``settle``) some
        method's two fastest runs more than ``settle`` apart and fewer rounds than the cap."""
        if rounds < self.repeats:
            return True
        if self.settle is None or rounds >= SETTLE_CAP * self.repeats:
            return False
        return not all(settled([r.seconds for r in one], self.settle) for one in runs)

    def _learn(self, method: Method, prompt_ids: list[int], answer: list[int]) -> None:
        """The drafts of ``method`` that learn across generations learn its answer to one turn:
        its own drafter, or (``auto``) each drafter the plan may route to."""
        if method.kind == "auto":
            drafters = self._learners(method)
        else:
            drafters = [method.drafter] if method.drafter is not None and method.drafter.capabilities.learns else []
        for drafter in drafters:
            teach(drafter, prompt_ids, answer, self.sampling)

    def fits(self, q: Question) -> bool:
        """Whether ``q`` fits in the context whatever the answers (a conservative estimate)."""
        n = len(q.turns)
        prompt = build_prompt(self.model, q.turns, [""] * (n - 1))
        return len(prompt) + n * (self.max_new_tokens + 8) <= self.model.runtime.max_context
