"""Measuring a machine profile (``draftwise profile``): T(n) and the whole step at two context
lengths, D(k) of each draft, and the per-token overhead; see :mod:`draftwise.cost.profile` for
what each value means and :mod:`draftwise.cost.timing` for the estimator every value uses.

Example::

    from draftwise import load_model
    from draftwise.cost.measure import measure_profile
    model = load_model("default")
    profile = measure_profile(model, drafts=["lookup"], max_n=8, repeats=3)
    profile.save("profile.json")
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from draftwise.core.decode import generate
from draftwise.core.draft import Draft, Drafter
from draftwise.core.generation import Generation
from draftwise.core.passes import verify_pass
from draftwise.core.sampling import SamplingConfig
from draftwise.cost.profile import (
    Profile,
    cpu_flags,
    cpu_model,
    machine_fingerprint,
    model_fingerprint,
)
from draftwise.cost.timing import fast_half_mean, time_pass
from draftwise.drafters import make_drafter
from draftwise.drafters.factory import cost_variant
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError


def monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): a pass over more tokens
    never costs less, so a dip in the measured times is noise, averaged away with its neighbours.

    >>> monotone([3.0, 1.0, 2.0, 5.0])
    [2.0, 2.0, 2.0, 5.0]
    """
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]


def _synthetic(n: int, seed: int) -> list[int]:
    return [(i * 7919 + seed * 104729) % 2000 + 10 for i in range(n)]


class _Constant:
    """Proposes the same token k times: a step that verifies k tokens and commits one."""

    name = "constant"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return Draft([self.token] * k)


SAMPLED = SamplingConfig(temperature=0.7)  # the step's cost does not depend on the temperature


def _time_step(runtime: Any, context: list[int], n: int, cfg: SamplingConfig | None = None) -> float:
    """One speculative step feeding n tokens, as decode_steps runs it (:func:`verify_pass`,
    greedy or with ``cfg``'s sampled verification), then undone."""
    base = runtime.length
    cfg = cfg or SamplingConfig()
    generator = torch.Generator().manual_seed(n)  # the sampler draws on the CPU, as decoding does
    t0 = time.perf_counter()
    draft = _Constant(context[-2]).propose(context, n - 1)
    verify_pass(runtime, context[-1], draft, cfg, generator)
    elapsed = time.perf_counter() - t0
    runtime.rollback(base)
    return elapsed


def _time_draft(drafter: Drafter, runtime: Any, prompt: list[int], k: int, repeats: int) -> tuple[float, float]:
    """D(k), the fast-half mean of ``repeats`` proposals, and the first proposal's catch-up on
    the prompt in seconds per prompt token (beyond D(k); 0 for a draft without its own cache).

    A draft with its own cache sees the context grow one token a call (it catches that token
    up, as after a rejected step); a draft that reads the target's features (EAGLE) gets that
    token through a target pass, untimed, as verification would give it; self-speculation,
    which shares the target's cache, proposes from the same context each time."""
    shares_cache = drafter.capabilities.shares_target_cache
    reads_target = drafter.capabilities.reads_features
    context = list(prompt)
    sampling, generator = SamplingConfig(), torch.Generator().manual_seed(0)
    runtime.rollback(0)

    def measurement() -> Generation:  # a measurement teaches a learning draft nothing
        return Generation(eos_token_ids=(), max_new_tokens=1, drafter=drafter, learn=False)

    warm = measurement()
    warm.start(context[:-1], sampling, generator)  # before the prefill, as decoding does
    runtime.prefill(context[:-1])
    drafter.propose(context, k)  # warm up
    warm.end()
    timed = measurement()
    timed.start(context[:-1], sampling, generator)
    t0 = time.perf_counter()
    drafter.propose(context, k)  # the first proposal: a draft with its own cache catches up here
    first = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        if not shares_cache:
            drafter.observe(0)
            if reads_target:
                runtime.forward(context[-1:])
            context.append(_synthetic(1, r + 5)[0])
        t0 = time.perf_counter()
        drafter.propose(context, k)
        times.append(time.perf_counter() - t0)
    timed.end()
    d = fast_half_mean(times)
    return d, (0.0 if shares_cache else max(first - d, 0.0) / max(len(prompt) - 1, 1))


def _token_overhead(model: Any, context: int) -> float:
    """What a plain generation spends per token outside its steps (detokenising, stop checks,
    the stream's bookkeeping): its wall time less the time the loop itself clocks in prefill,
    drafting and verification passes. Measured inside one generation, so a noisy machine's
    slower or faster steps do not land in it (subtracting the profile's separately timed step
    from a generation's mean step did: it read many times the real overhead on a busy machine,
    which pulled every predicted speedup toward 1x)."""
    n = 32
    res = generate(model, _synthetic(context, 7), max_new_tokens=n)
    clocked = res.stats.verify_seconds + res.stats.draft_seconds
    return max((res.seconds - clocked) / max(res.new_tokens, 1), 0.0)


def measure_profile(
    model: Any,
    *,
    drafts: Sequence[DraftSpec | str] = ("lookup",),
    max_n: int = 16,
    contexts: Sequence[int] = (128, 1024),
    repeats: int = 5,
    sampled: bool = True,
    progress: Callable[[str, float], None] | bool = True,
) -> Profile:
    """Measure T(n) and step(n) for n = 1..max_n at each context (``sampled``: also the step
    with sampled verification), D(k) for k = 1..max_n - 1 of each draft spec, and the
    per-token overhead. ``progress`` is a callback
    ``(description, fraction done)``, or True for a rich progress bar on stderr. Drafts are
    keyed by their canonical spec."""
    if max_n < 2:
        raise ConfigError(f"max_n={max_n} must be >= 2 (a speculative step feeds at least 2 tokens)")
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    contexts = sorted(set(int(c) for c in contexts))
    limit = model.runtime.max_context
    if not contexts or contexts[0] < 2 or contexts[-1] + max_n + repeats + 2 > limit:
        raise ConfigError(f"contexts {contexts} must be >= 2 and leave room for {max_n} tokens in {limit}")
    specs = {str(spec): spec for spec in map(DraftSpec.parse, drafts) if not spec.is_none}
    drafters: dict[str, Drafter] = {}
    for key, spec in specs.items():
        drafter = make_drafter(spec, model)
        assert drafter is not None  # "none" was left out above
        drafters[key] = drafter
    total = len(contexts) * repeats + len(drafters) * (max_n - 1) + 1
    done = [0]
    report, bar = _reporter(progress, total)

    def tick(desc: str) -> None:
        done[0] += 1
        report(desc, done[0] / total)

    rt = model.runtime
    try:
        timed = {c: _time_passes(rt, c, max_n, repeats, sampled, tick) for c in contexts}
        profile = Profile(
            model=model.name,
            fingerprint=model_fingerprint(model),
            dtype=model.mode,
            runtime=type(rt).__name__,
            forward={c: t[0] for c, t in timed.items()},
            step={c: t[1] for c, t in timed.items()},
            step_sampled={c: t[2] for c, t in timed.items()} if sampled else {},
            machine={
                "threads": torch.get_num_threads(),
                "cpu": cpu_model(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "cpu_flags": cpu_flags(),
                "fingerprint": machine_fingerprint(),
            },
            created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
        prompt = _synthetic(contexts[0], 2)
        for spec, drafter in drafters.items():
            costs, prefill = [], []
            for k in range(1, max_n):
                d, per_token = _time_draft(drafter, rt, prompt, k, repeats)
                costs.append(d)
                prefill.append(per_token)
                tick(f"draft {spec}, k={k}")
            profile.drafts[spec] = costs
            profile.draft_variants[spec] = cost_variant(spec)
            if any(prefill):  # drafts with their own cache; the median is robust to one slow call
                profile.draft_prefill[spec] = sorted(prefill)[len(prefill) // 2]
        rt.rollback(0)
        profile.token_overhead = _token_overhead(model, contexts[0])
        report("done", 1.0)
    finally:
        if bar is not None:
            bar.stop()
        rt.rollback(0)
    return profile


def _reporter(progress: Callable[[str, float], None] | bool, total: int) -> tuple[Callable[[str, float], None], Any]:
    """``(report(description, fraction), the rich bar to stop or None)`` for ``progress``: True
    for a rich bar on stderr, a callback, or False for nothing."""
    if progress is True:
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("profile", total=total)
        bar.start()
        return (lambda desc, frac: bar.update(task, completed=frac * total, description=desc)), bar
    if callable(progress):
        return progress, None
    return (lambda desc, frac: None), None


def _time_passes(rt: Any, c: int, max_n: int, repeats: int, sampled: bool,
                 tick: Callable[[str], None]) -> tuple[list[float], list[float], list[float]]:
    """At context ``c``: T(n), step(n) and (``sampled``) the sampled step(n) for n = 1..max_n,
    each the fast-half mean of ``repeats`` rounds over n (so drift hits every n alike), made
    non-decreasing."""
    context = _synthetic(c, 1)
    rt.rollback(0)
    rt.prefill(context[:-1])  # the last token is fed by each step, as in decoding
    _time_step(rt, context, 2)  # warm up
    f_times: list[list[float]] = [[] for _ in range(max_n)]
    s_times: list[list[float]] = [[] for _ in range(max_n)]
    r_times: list[list[float]] = [[] for _ in range(max_n)]  # sampled verification
    for _ in range(repeats):
        for n in range(1, max_n + 1):
            f_times[n - 1].append(time_pass(rt, context[-1:] + _synthetic(n - 1, 3)))
            s_times[n - 1].append(_time_step(rt, context, n))
            if sampled:
                r_times[n - 1].append(_time_step(rt, context, n, SAMPLED))
        tick(f"target passes, context {c}")
    forward = monotone([fast_half_mean(t) for t in f_times])
    # a step contains the pass, so it never costs less than the pass alone
    step = monotone([max(s, f) for s, f in zip(map(fast_half_mean, s_times), forward)])
    step_sampled = monotone([max(s, f) for s, f in zip(map(fast_half_mean, r_times), forward)]) if sampled else []
    return forward, step, step_sampled
