"""Predicting a concurrency N: the workload (a plan's acceptance, and the units a load sends:
conversations of one request a turn), a deterministic simulation of the load test under each
policy (plain batching, every fixed k, the plan's picks, the goodput policy), and the crossover.
The step model and the choice of k are :mod:`draftwise.cost.goodput`'s; see its docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.capacity.workload import SOLO, Kind, Request, Workload, choice_for
from draftwise.core.engine import DEFAULT_PREFILL_CHUNK, step_chunk
from draftwise.cost.goodput import NONE, Outcome, StepCost, rates_outcomes, step_goodput
from draftwise.errors import ConfigError
from draftwise.policy.batch import BatchGoodput, SeqState


# -- the workload ---------------------------------------------------------------------------
def workload_from_rates(
    rates: Mapping[str, Mapping[str, Sequence[float]]], *, k_max: int = 8,
    requests: Sequence[tuple[str, int, int]] | None = None, prompt_tokens: int = 64, new_tokens: int = 128,
) -> Workload:
    """A workload from explicit rates, ``{category: {draft: [a_0, a_1, ...]}}`` (each category's
    ``goodput`` draft: its first). ``requests`` (each a one-turn unit) default to one per
    category of ``prompt_tokens`` and ``new_tokens``."""
    if not rates:
        raise ConfigError("give acceptance rates for at least one category")
    kinds = {}
    drafts: list[str] = []
    for cat, per in rates.items():
        options = {d: rates_outcomes(r, k_max) for d, r in per.items()}
        drafts += [d for d in options if d not in drafts]
        first = next(iter(options), NONE)
        kinds[cat] = Kind(cat, options, draft=first, plan=(NONE, 0))
    reqs = list(requests) if requests is not None else [(c, prompt_tokens, new_tokens) for c in kinds]
    return Workload(kinds, drafts, list(range(1, k_max + 1)), [[r] for r in reqs], source="rates")


def workload_from_plan(plan: Any, units: Sequence[Sequence[Request]] | None = None) -> Workload:
    """The plan's per-category acceptance as :class:`Outcome` s (:mod:`draftwise.cost.goodput`'s
    docstring), each category's recommendation as its ``plan`` choice and the draft of its best
    candidate (recommended or not: the goodput policy may still pick k = 0) as its draft. The units:
    ``units`` when given (what a load test sends: each turn's category, prompt tokens with its
    history, answer tokens), else the plan's own prompts (:func:`plan_units`)."""
    kinds: dict[str, Kind] = {}
    for cat, cands in plan.categories.items():
        if cat == "overall":
            continue
        answers = _answers(plan, cat)
        options: dict[str, dict[int, Outcome]] = {}
        for c in cands:
            if isinstance(c.k, bool) or not isinstance(c.k, int):
                continue  # the adaptive candidate (k "auto") has no fixed k to batch
            options.setdefault(c.draft, {})[c.k] = _outcome(c, *answers)
        best = next((c.draft for c in cands if c.draft in options), NONE)
        d, k = plan.recommended.get(cat, (NONE, 0))
        if d == NONE or d not in options:
            pick = (NONE, 0)
        else:  # "auto": each sequence's own adaptive k, which sees its own costs, not the batch's
            pick = (d, k if isinstance(k, int) and not isinstance(k, bool) else SOLO)
        kinds[cat] = Kind(cat, options, draft=best, plan=pick)
    chosen = [list(u) for u in units] if units is not None else plan_units(plan, kinds)
    ks = [k for k in plan.ks if isinstance(k, int) and not isinstance(k, bool)]
    return Workload(kinds, list(plan.drafts), ks, chosen, source=f"plan for {plan.model}")


def _answers(plan: Any, category: str) -> tuple[int, int]:
    """(C, U): the answer tokens and the answers (turns) the plan traced in ``category``."""
    mine = [p for p in plan.prompts if p.get("category") == category]
    return sum(int(p.get("new_tokens", 0)) for p in mine), sum(int(p.get("turns", 1)) for p in mine)


def _outcome(c: Any, answer_tokens: int = 0, answers: int = 0) -> Outcome:
    """One candidate's tokens and rows per decoding step (:mod:`draftwise.cost.goodput`: the
    prefill's step taken out of ``c.mat`` where the plan says how many answers it holds)."""
    mat = max(float(c.mat), 1.0)
    steps = answer_tokens / mat  # D + U
    decoding = steps - answers
    accepted = (mat - 1.0) * (steps / decoding if answers and decoding > 0 else 1.0)  # A / D
    tokens = 1.0 + accepted
    if c.acceptance is None:  # nothing proposed in this category
        rows = 1.0
    elif c.acceptance > 0:
        rows = 1.0 + accepted / c.acceptance
    else:  # proposed and never accepted: assume every step proposed k
        rows = 1.0 + c.k
    lo, hi = c.interval or [c.speedup, c.speedup]
    scale = 1.0 / c.speedup if c.speedup > 0 else 0.0
    return Outcome(tokens, min(rows, c.k + 1.0), max(1.0, tokens * lo * scale), max(1.0, tokens * hi * scale))


def plan_units(plan: Any, kinds: Mapping[str, Kind] | None = None) -> list[list[Request]]:
    """The plan's prompts as units: one per traced question (of a category in ``kinds``), one
    request per turn. A prompt that lists ``turn_prompt_tokens`` and ``turn_new_tokens`` gives
    each turn's lengths; otherwise its ``new_tokens`` are split evenly over its ``turns`` and a
    later turn's prompt is the first one plus the earlier answers (its own user message
    uncounted). A plan without prompts: one 128-token request per category.

    >>> from types import SimpleNamespace as NS
    >>> plan_units(NS(prompts=[{"category": "w", "turns": 2, "prompt_tokens": 50, "new_tokens": 201}]))
    [[('w', 50, 101), ('w', 151, 100)]]
    """
    units = []
    for p in plan.prompts:
        cat = str(p.get("category"))
        if kinds is not None and cat not in kinds:
            continue
        turns = max(int(p.get("turns", 1)), 1)
        prompts, news = p.get("turn_prompt_tokens"), p.get("turn_new_tokens")
        if not (prompts and news and len(prompts) == len(news)):
            total = int(p["new_tokens"])
            news = [total // turns + (1 if t < total % turns else 0) for t in range(turns)]
            prompts = [int(p["prompt_tokens"]) + sum(news[:t]) for t in range(turns)]
        units.append([(cat, int(a), int(b)) for a, b in zip(prompts, news)])
    return units or [[(c, 64, 128)] for c in (kinds or {})]


# -- predicting a concurrency ---------------------------------------------------------------
Policy = tuple[str, str, int]  # (kind: plain | fixed | plan | goodput, draft, k)


def policies(workload: Workload) -> dict[str, Policy]:
    """Every policy :func:`predict` compares, by name (module docstring)."""
    out: dict[str, Policy] = {"plain": ("plain", NONE, 0), "plan": ("plan", NONE, 0), "goodput": ("goodput", NONE, 0)}
    for d in workload.drafts:
        out[f"goodput:{d}"] = ("goodput", d, 0)
        for k in workload.ks:
            if any(k in kind.options.get(d, {}) for kind in workload.kinds.values()):
                out[f"{d} k={k}"] = ("fixed", d, k)
    return out


def client_units(n: int, units: int, *, requests_per_client: int = 4, per_phase: int | None = None) -> list[list[int]]:
    """The units each of ``n`` closed-loop clients sends, one after the other, as indices into
    ``units`` of them (taken mod ``units``). By default client i sends units i R + j, j < R
    (R = ``requests_per_client``), so a phase sends N R units and each N measures other
    questions; with ``per_phase`` = U every N sends the same first U units, client i the units
    i, i + N, i + 2N, ... below U, so every N does the same work.

    >>> client_units(2, 8, requests_per_client=2)
    [[0, 1], [2, 3]]
    >>> client_units(2, 8, per_phase=5)
    [[0, 2, 4], [1, 3]]
    """
    if units < 1:
        raise ConfigError("the workload has no units")
    if per_phase is None:
        return [[(i * requests_per_client + j) % units for j in range(requests_per_client)] for i in range(n)]
    if isinstance(per_phase, bool) or not isinstance(per_phase, int) or per_phase < n:
        raise ConfigError(f"units a phase ({per_phase!r}) must be an integer >= the {n} clients")
    return [[u % units for u in range(i, per_phase, n)] for i in range(n)]


@dataclass
class _Req:
    kind: Kind
    prompt: int
    answer: int
    start: float
    prefill_left: int
    made: float = 0.0
    fresh: bool = False  # its prompt's last chunk ran in the previous step (the engine still counts it)


@dataclass
class Prediction:
    """One policy at one N: aggregate and per-request tokens/s, the mean k its decoding
    sequences proposed and the share of their steps that speculated."""

    aggregate: float
    per_request: float
    mean_k: float
    speculating: float
    steps: int
    seconds: float


def simulate(
    workload: Workload, cost: StepCost, n: int, policy: Policy, *, requests_per_client: int = 4,
    max_new_tokens: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, scenario: str = "point",
    per_phase: int | None = None,
) -> Prediction:
    """N closed-loop clients served by the batched engine, under ``policy``: client i sends the
    units :func:`client_units` gives it (``requests_per_client``, ``per_phase``), each unit's
    requests one after the other (:mod:`draftwise.cost.goodput`'s docstring).
    ``max_new_tokens`` caps every answer."""
    workload.check()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"concurrency {n!r} must be an integer >= 1")
    units = workload.units
    queues = [[r for u in mine for r in units[u]]
              for mine in client_units(n, len(units), requests_per_client=requests_per_client, per_phase=per_phase)]
    chooser = _chooser(policy, workload, cost, scenario)
    t, steps, tokens_total = 0.0, 0, 0.0
    k_sum = k_steps = spec_steps = 0
    rates: list[float] = []
    active: list[_Req | None] = [None] * n
    decode_rows = 0

    def start(i: int) -> None:
        if queues[i]:
            cat, p, a = queues[i].pop(0)
            a = min(a, max_new_tokens) if max_new_tokens else a
            active[i] = _Req(workload.kinds[cat], max(p, 1), max(a, 1), t, max(p, 1))

    for i in range(n):
        start(i)
    limit = 10_000_000
    while any(r is not None for r in active):
        live = [(i, r) for i, r in enumerate(active) if r is not None]
        pre = [(i, r) for i, r in live if r.prefill_left > 0]
        dec = [(i, r) for i, r in live if r.prefill_left == 0]
        fresh = sum(r.fresh for _, r in dec)  # counted as prefilling, as the engine does
        chunk = step_chunk(prefill_chunk, len(pre) + fresh, len(dec) - fresh, decode_rows)
        pre_rows = cost.batch.priced_rows(0, sum(min(chunk, r.prefill_left) for _, r in pre))  # no logits
        context = sum(r.prompt + r.made for _, r in live) / len(live)
        drafts = [chooser.draft(r.kind) for _, r in dec]
        ks = chooser.ks([r.kind for _, r in dec], drafts, context, pre_rows, len(pre))
        outs = [r.kind.outcome(d, k) for (_, r), d, k in zip(dec, drafts, ks)]
        verified = sum(o.rows for o in outs)
        rows, decode_rows = pre_rows + verified, round(verified)  # the engine's next step_chunk reads them
        extra = sum(cost.draft(d, k) + cost.overhead(k, r.prompt + r.made) for (_, r), d, k in zip(dec, drafts, ks))
        made = [min(o.at(scenario), r.answer - r.made) for (_, r), o in zip(dec, outs)]
        dt = cost.seconds(len(live), max(rows, len(live)), context, extra, sum(made))
        t += dt
        steps += 1
        k_sum += sum(ks)
        k_steps += len(ks)
        spec_steps += sum(1 for k in ks if k)
        for (i, r), m in zip(dec, made):
            r.made += m
            r.fresh = False
        for _, r in pre:
            r.prefill_left -= min(chunk, r.prefill_left)
            if r.prefill_left == 0:
                r.made += 1  # the prompt's last chunk gives the first token
                r.fresh = True
        for i, r in live:
            if r.made >= r.answer - 1e-9:
                tokens_total += r.answer
                rates.append(r.answer / (t - r.start))
                active[i] = None
                start(i)
        if steps > limit:  # pragma: no cover - a bug, not a workload
            raise ConfigError("the load simulation did not finish")
    return Prediction(
        aggregate=tokens_total / t, per_request=sum(rates) / len(rates), mean_k=k_sum / max(k_steps, 1),
        speculating=spec_steps / max(k_steps, 1), steps=steps, seconds=t,
    )


def solo_k(kind: Kind, draft: str, cost: StepCost, context: float) -> int:
    """The k (0 included) with the most tokens/s for a sequence of ``kind`` alone in the pass:
    what a per-sequence adaptive k (:class:`~draftwise.policy.adaptive.AdaptiveK`) aims at, since
    it prices its steps with the single-stream profile whatever the batch."""
    choice = choice_for(kind, draft, cost, context)
    return max(choice.outcomes, key=lambda k: step_goodput([choice], [k], cost, context=context))


class _Chooser:
    """How a simulated step picks its decoding sequences' drafts and k's under one policy."""

    def __init__(self, kind_of: str, draft: str, k: int, cost: StepCost, scenario: str, k_max: int) -> None:
        self.kind_of, self.fixed_draft, self.fixed_k = kind_of, draft, k
        self.cost, self.scenario = cost, scenario
        self.cache: dict[Any, list[int]] = {}
        # the batch policy ``serve --k auto`` runs, the same object, priced by the same step cost
        self.goodput = BatchGoodput(cost.batch, cost.profile, k_max=k_max, cost=cost) if kind_of == "goodput" else None

    def draft(self, kind: Kind) -> str:
        if self.kind_of == "fixed" or (self.kind_of == "goodput" and self.fixed_draft != NONE):
            return self.fixed_draft
        return {"goodput": kind.draft, "plan": kind.plan[0]}.get(self.kind_of, NONE)

    def ks(self, kinds: Sequence[Kind], drafts: Sequence[str], context: float, pre_rows: float, prefilling: int
           ) -> list[int]:
        if self.goodput is not None:
            return self._goodput(kinds, drafts, context, pre_rows, prefilling)
        if self.kind_of == "fixed":
            return [self.fixed_k if self.fixed_k in kind.options.get(self.fixed_draft, {}) else 0 for kind in kinds]
        if self.kind_of == "plan":
            return [self._solo(kind, context) if kind.plan[1] == SOLO else kind.plan[1] for kind in kinds]
        return [0] * len(kinds)

    def _goodput(self, kinds: Sequence[Kind], drafts: Sequence[str], context: float, pre_rows: float,
                 prefilling: int) -> list[int]:
        """The batch policy's k's for the step, asked in a canonical order and cached by what they
        depend on (the sequences' kinds and drafts, the others' rows, the context to 64 tokens)."""
        assert self.goodput is not None
        order = sorted(range(len(kinds)), key=lambda x: (kinds[x].name, drafts[x]))
        key = (tuple((kinds[x].name, drafts[x]) for x in order), pre_rows, prefilling, round(context / 64))
        if key not in self.cache:
            states = [SeqState(drafts[x], (), context, kinds[x].options.get(drafts[x], {})) for x in order]
            self.cache[key] = self.goodput.choose(states, prefill_rows=pre_rows, prefilling=prefilling,
                                                  scenario=self.scenario)
        ks = [0] * len(kinds)
        for pos, x in enumerate(order):
            ks[x] = self.cache[key][pos]
        return ks

    def _solo(self, kind: Kind, context: float) -> int:
        key = (kind.name, round(context / 64))
        if key not in self.cache:
            self.cache[key] = [solo_k(kind, kind.plan[0], self.cost, context)]
        return self.cache[key][0]


def _chooser(policy: Policy, workload: Workload, cost: StepCost, scenario: str) -> _Chooser:
    kind_of, draft, k = policy
    if kind_of not in ("plain", "fixed", "plan", "goodput"):
        raise ConfigError(f"unknown policy kind {kind_of!r}: plain, fixed, plan or goodput")
    return _Chooser(kind_of, draft, k, cost, scenario, k_max=max([*workload.ks, 1]))


def predict(
    workload: Workload, cost: StepCost, concurrency: Sequence[int], *, requests_per_client: int = 4,
    max_new_tokens: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    names: Sequence[str] | None = None, progress: Callable[[str, float], None] | None = None,
    per_phase: int | None = None,
) -> dict[str, Any]:
    """Every policy (or those ``names``) at every N: aggregate and per-request tokens/s with
    intervals, the ratio to plain batching, the best policy and the crossover (module docstring).
    JSON-able."""
    table = policies(workload)
    if names is not None:
        unknown = set(names) - set(table)
        if unknown:
            raise ConfigError(f"unknown policies {sorted(unknown)}; known: {', '.join(table)}")
        table = {"plain": table["plain"], **{k: table[k] for k in names}}
    for n in concurrency:
        if n > cost.batch.max_batch:
            raise ConfigError(f"concurrency {n}: the batch profile covers batches up to {cost.batch.max_batch}; "
                              f"measure it with batches up to {n}")
    rows: list[dict[str, Any]] = []
    total = len(concurrency) * len(table)
    for ni, n in enumerate(concurrency):
        per: dict[str, Any] = {}
        for pi, (name, pol) in enumerate(table.items()):
            if progress:
                progress(f"N={n}: {name}", (ni * len(table) + pi) / total)
            kw = dict(requests_per_client=requests_per_client, max_new_tokens=max_new_tokens,
                      prefill_chunk=prefill_chunk, per_phase=per_phase)
            point = simulate(workload, cost, n, pol, **kw)
            if pol[0] == "plain":
                lo = hi = point
            else:
                lo = simulate(workload, cost, n, pol, scenario="low", **kw)
                hi = simulate(workload, cost, n, pol, scenario="high", **kw)
            per[name] = {
                "aggregate_tps": point.aggregate,
                "aggregate_interval": [min(lo.aggregate, point.aggregate), max(hi.aggregate, point.aggregate)],
                "per_request_tps": point.per_request,
                "per_request_interval": [min(lo.per_request, point.per_request),
                                         max(hi.per_request, point.per_request)],
                "mean_k": point.mean_k, "speculating": point.speculating,
            }
        plain = per["plain"]["aggregate_tps"]
        for p in per.values():
            p["vs_plain"] = p["aggregate_tps"] / plain
            p["vs_plain_interval"] = [x / plain for x in p["aggregate_interval"]]
        fixed = [name for name in per if table[name][0] == "fixed"]
        best_fixed = max(fixed, key=lambda x: per[x]["aggregate_tps"]) if fixed else None
        rows.append({
            "n": n, "policies": per, "best": max(per, key=lambda x: per[x]["aggregate_tps"]),
            "best_fixed": best_fixed,
            "best_fixed_per_draft": {d: _best_k(per, table, d) for d in workload.drafts},
        })
    return {"concurrency": list(concurrency), "rows": rows, "crossover": crossover(rows),
            "policies": {name: list(p) for name, p in table.items()}, "source": workload.source,
            "requests_per_client": requests_per_client, "units_per_phase": per_phase, "max_new_tokens": max_new_tokens,
            "prefill_chunk": prefill_chunk, "workload": describe(workload)}


def describe(workload: Workload) -> dict[str, Any]:
    """What the simulated clients send: units (questions), requests (turns), mean lengths.

    >>> w = workload_from_rates({"qa": {"lookup": [0.5]}}, requests=[("qa", 10, 20), ("qa", 30, 40)])
    >>> describe(w)
    {'units': 2, 'requests': 2, 'mean_prompt_tokens': 20.0, 'mean_answer_tokens': 30.0}
    """
    reqs = workload.requests
    return {"units": len(workload.units), "requests": len(reqs),
            "mean_prompt_tokens": sum(p for _, p, _ in reqs) / len(reqs) if reqs else 0.0,
            "mean_answer_tokens": sum(a for _, _, a in reqs) / len(reqs) if reqs else 0.0}


def _best_k(per: dict[str, Any], table: dict[str, Policy], draft: str) -> int:
    """The fixed k of ``draft`` with the most aggregate tokens/s at this N, or 0 where plain beats all."""
    best, best_tps = 0, per["plain"]["aggregate_tps"]
    for name, (kind_of, d, k) in table.items():
        if kind_of == "fixed" and d == draft and per[name]["aggregate_tps"] > best_tps:
            best, best_tps = k, per[name]["aggregate_tps"]
    return best


def crossover(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """The smallest N whose best always-speculating (``fixed``) policy is below 1.0x plain; None if none.

    >>> crossover([{"n": 1, "best_fixed": "a", "policies": {"a": {"vs_plain": 1.4}}},
    ...            {"n": 4, "best_fixed": "a", "policies": {"a": {"vs_plain": 0.9}}}])
    4
    """
    for row in rows:
        name = row.get("best_fixed")
        if name is not None and row["policies"][name]["vs_plain"] < 1.0:
            return int(row["n"])
    return None

