"""Predicting a concurrency N: a deterministic simulation of the load test under each policy
(plain batching, every fixed k, the plan's picks, the goodput policy), and the crossover. The
step model and the choice of k are :mod:`draftwise.cost.goodput`'s; see its docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import DEFAULT_PREFILL_CHUNK
from ..errors import ConfigError
from .goodput import NONE, SOLO, Kind, StepCost, Workload, choice_for, choose_ks, step_goodput


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


@dataclass
class _Req:
    kind: Kind
    prompt: int
    answer: int
    start: float
    prefill_left: int
    made: float = 0.0


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
) -> Prediction:
    """N closed-loop clients served by the batched engine, under ``policy`` (module docstring)."""
    workload.check()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"concurrency {n!r} must be an integer >= 1")
    reqs = workload.requests
    queues = [[reqs[(i * requests_per_client + j) % len(reqs)] for j in range(requests_per_client)]
              for i in range(n)]
    kind_of, draft_fixed, k_fixed = policy
    t, steps, tokens_total = 0.0, 0, 0.0
    k_sum = k_steps = spec_steps = 0
    rates: list[float] = []
    active: list[_Req | None] = [None] * n
    cache: dict[Any, list[int]] = {}

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
        pre_rows = sum(min(prefill_chunk, r.prefill_left) for _, r in pre)
        context = sum(r.prompt + r.made for _, r in live) / len(live)
        drafts = [_draft_for(policy, r.kind) for _, r in dec]
        if kind_of == "goodput":
            key = (tuple(sorted((r.kind.name, d) for (_, r), d in zip(dec, drafts))), pre_rows, len(pre),
                   round(context / 64))
            order = sorted(range(len(dec)), key=lambda x: (dec[x][1].kind.name, drafts[x]))
            if key not in cache:
                choices = [choice_for(dec[x][1].kind, drafts[x], cost, context) for x in order]
                cache[key] = choose_ks(choices, cost, context=context, fixed_rows=pre_rows, fixed_batch=len(pre),
                                       scenario=scenario)
            ks = [0] * len(dec)
            for pos, x in enumerate(order):
                ks[x] = cache[key][pos]
        elif kind_of == "fixed":
            ks = [k_fixed if k_fixed in r.kind.options.get(draft_fixed, {}) else 0 for _, r in dec]
        elif kind_of == "plan":
            ks = []
            for _, r in dec:
                k = r.kind.plan[1]
                if k == SOLO:
                    key = (r.kind.name, round(context / 64))
                    if key not in cache:
                        cache[key] = [solo_k(r.kind, r.kind.plan[0], cost, context)]
                    k = cache[key][0]
                ks.append(k)
        else:
            ks = [0] * len(dec)
        outs = [r.kind.outcome(d, k) for (_, r), d, k in zip(dec, drafts, ks)]
        rows = pre_rows + sum(o.rows for o in outs)
        extra = sum(cost.draft(d, k) + cost.overhead(k, r.prompt + r.made) for (_, r), d, k in zip(dec, drafts, ks))
        made = [min(o.at(scenario), r.answer - r.made) for (_, r), o in zip(dec, outs)]
        dt = cost.seconds(len(live), rows, context, extra, sum(made))
        t += dt
        steps += 1
        k_sum += sum(ks)
        k_steps += len(ks)
        spec_steps += sum(1 for k in ks if k)
        for (i, r), m in zip(dec, made):
            r.made += m
        for _, r in pre:
            r.prefill_left -= min(prefill_chunk, r.prefill_left)
            if r.prefill_left == 0:
                r.made += 1  # the prompt's last chunk gives the first token
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
    what a per-sequence adaptive k (:class:`~draftwise.cost.adaptive.AdaptiveK`) aims at, since
    it prices its steps with the single-stream profile whatever the batch."""
    choice = choice_for(kind, draft, cost, context)
    return max(choice.outcomes, key=lambda k: step_goodput([choice], [k], cost, context=context))


def _draft_for(policy: Policy, kind: Kind) -> str:
    kind_of, draft, _ = policy
    if kind_of == "fixed" or (kind_of == "goodput" and draft != NONE):
        return draft
    if kind_of == "goodput":
        return kind.draft
    if kind_of == "plan":
        return kind.plan[0]
    return NONE


def predict(
    workload: Workload, cost: StepCost, concurrency: Sequence[int], *, requests_per_client: int = 4,
    max_new_tokens: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    names: Sequence[str] | None = None, progress: Callable[[str, float], None] | None = None,
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
                      prefill_chunk=prefill_chunk)
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
            "requests_per_client": requests_per_client, "max_new_tokens": max_new_tokens,
            "prefill_chunk": prefill_chunk}


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

