"""A machine profile: what a target pass and each draft cost on *this* machine.

``draftwise profile`` measures, for one model and dtype:

- ``forward[c][n-1]``: T(n), one target pass over n new tokens on a warm cache of c tokens;
- ``step[c][n-1]``: one whole speculative step that feeds n tokens (n - 1 proposed): the pass,
  verification and the cache rollback. ``step - forward`` is the per-step overhead;
- ``drafts[spec][k-1]``: D(k), the time a draft takes to propose k tokens;
- ``token_overhead``: per committed token, what a generation spends outside the steps
  (detokenising, stop strings, statistics).

Each value is the mean of the faster half of ``repeats`` timings taken in rounds over n (so
that drift hits every n alike), made non-decreasing in n (a dip is noise: a longer pass never
costs less), and a step is never cheaper than its pass.

Times grow with the context (attention reads every cached key), so T and the step are measured
at two context lengths and interpolated linearly between them (and extrapolated beyond).
The planner and ``--k auto`` read the profile; a profile made on another model, or in another
dtype, is refused.

Example::

    from draftwise import load_model
    from draftwise.cost.profile import measure_profile
    model = load_model("default")
    profile = measure_profile(model, drafts=["lookup"], max_n=8, repeats=3)
    print(profile.step_cost_ratio("lookup", 4))   # a lookup step with k=4, in plain steps
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..drafters.base import Draft
from ..errors import ConfigError
from ..plots import write_json
from ..sampling import SamplingConfig
from ..verify import verify_greedy
from .timing import time_pass

SCHEMA = "draftwise.profile/1"


def model_fingerprint(model: Any) -> str:
    """Identifies a model's weights and shape: its folder name and config.json, hashed."""
    folder = Path(model.folder)
    config = (folder / "config.json").read_bytes() if (folder / "config.json").exists() else b""
    return hashlib.sha256(folder.name.encode() + b"\0" + config).hexdigest()[:16]


def _interp(points: dict[int, list[float]], n: int, context: float | None) -> float:
    """Value at n tokens and ``context``: linear in the context between the measured ones."""
    contexts = sorted(points)
    if n < 1 or n > len(points[contexts[0]]):
        raise ConfigError(f"the profile covers passes of 1..{len(points[contexts[0]])} tokens, not {n}")
    if context is None or len(contexts) == 1:
        return points[contexts[0]][n - 1]
    lo, hi = contexts[0], contexts[-1]
    for a, b in zip(contexts, contexts[1:]):
        if context <= b:
            lo, hi = a, b
            break
    y0, y1 = points[lo][n - 1], points[hi][n - 1]
    return max(y0 + (y1 - y0) * (context - lo) / (hi - lo), 0.0)


@dataclass
class Profile:
    """Measured costs of one model on one machine (seconds); see the module docstring."""

    model: str
    fingerprint: str
    dtype: str
    runtime: str
    forward: dict[int, list[float]]
    step: dict[int, list[float]]
    drafts: dict[str, list[float]] = field(default_factory=dict)
    token_overhead: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    # -- reading -------------------------------------------------------------------------
    @property
    def max_n(self) -> int:
        return len(next(iter(self.step.values())))

    def forward_time(self, n: int, context: float | None = None) -> float:
        """T(n): a target pass over n tokens."""
        return _interp(self.forward, n, context)

    def step_time(self, n: int, context: float | None = None) -> float:
        """A step that feeds n tokens: pass + verification + rollback."""
        return _interp(self.step, n, context)

    def overhead(self, n: int, context: float | None = None) -> float:
        """Per-step overhead beyond the pass itself."""
        return max(self.step_time(n, context) - self.forward_time(n, context), 0.0)

    def draft_time(self, spec: str, k: int) -> float:
        """D(k) of a profiled draft (0 for ``none``)."""
        if spec == "none" or k == 0:
            return 0.0
        if spec not in self.drafts:
            raise ConfigError(
                f"the profile has no costs for draft {spec!r} (it has: "
                f"{', '.join(self.drafts) or 'none'}); run `draftwise profile --draft {spec}`"
            )
        costs = self.drafts[spec]
        if k > len(costs):  # past the measured k, each more token costs what the last one did
            return costs[-1] + (k - len(costs)) * (costs[-1] - (costs[-2] if len(costs) > 1 else 0.0))
        return costs[k - 1]

    def verify_ratio(self, k: int, context: float | None = None) -> float:
        """v(k) = T(k+1) / T(1), whole steps."""
        return self.step_time(k + 1, context) / self.step_time(1, context)

    def draft_ratio(self, spec: str, k: int, context: float | None = None) -> float:
        """c = D(k) / (k T(1)): the draft's cost per proposed token, in plain steps."""
        return self.draft_time(spec, k) / (k * self.step_time(1, context))

    def step_cost_ratio(self, spec: str, k: int, context: float | None = None) -> float:
        """R(k) = (D(k) + step(k+1)) / step(1): one speculative step in plain steps."""
        return (self.draft_time(spec, k) + self.step_time(k + 1, context)) / self.step_time(1, context)

    def check_model(self, model: Any, dtype: str | None = None) -> None:
        """Raise unless this profile was made on ``model`` (and ``dtype``)."""
        mine = model_fingerprint(model)
        if mine != self.fingerprint:
            raise ConfigError(
                f"this profile was made on model {self.model!r} (fingerprint {self.fingerprint}), "
                f"not on {model.name!r} ({mine}); run `draftwise profile --model {model.name}`"
            )
        dtype = dtype or str(model.dtype).replace("torch.", "")
        if dtype != self.dtype:
            raise ConfigError(
                f"this profile was measured in {self.dtype}, not {dtype}; run `draftwise profile "
                f"--dtype {dtype}`"
            )

    # -- files ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = SCHEMA
        out["forward"] = {str(c): v for c, v in self.forward.items()}
        out["step"] = {str(c): v for c, v in self.step.items()}
        return out

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        if data.get("schema") != SCHEMA:
            raise ConfigError(f"not a draftwise profile (schema {data.get('schema')!r}, want {SCHEMA!r})")
        try:
            return cls(
                model=data["model"],
                fingerprint=data["fingerprint"],
                dtype=data["dtype"],
                runtime=data["runtime"],
                forward={int(c): [float(x) for x in v] for c, v in data["forward"].items()},
                step={int(c): [float(x) for x in v] for c, v in data["step"].items()},
                drafts={s: [float(x) for x in v] for s, v in data.get("drafts", {}).items()},
                token_overhead=float(data.get("token_overhead", 0.0)),
                machine=dict(data.get("machine", {})),
                created=str(data.get("created", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"the profile is incomplete or malformed: {exc!r}") from None

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"no profile at {path}; make one with `draftwise profile --out {path}`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not JSON: {exc}") from None
        return cls.from_dict(data)


def default_profile_path(model: Any) -> Path:
    """Where ``draftwise profile`` saves a model's profile unless told otherwise."""
    from ..loaders import cache_dir

    dtype = str(model.dtype).replace("torch.", "")
    return cache_dir() / "profiles" / f"{Path(model.folder).name}-{dtype}.json"


# -- measuring ---------------------------------------------------------------------------
def monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): a pass over more tokens
    never costs less, so a dip in the medians is noise, averaged away with its neighbours.

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


def fast_half_mean(times: Sequence[float]) -> float:
    """The mean of the faster half of ``times``. A shared machine only ever adds time (another
    process, a page fault), so the slow half is mostly noise; this is steadier than the median
    and keeps ratios like T(k+1)/T(1), which every prediction divides by, from drifting.

    >>> fast_half_mean([1.0, 9.0, 2.0, 3.0])
    1.5
    """
    ordered = sorted(times)
    half = ordered[: max(1, (len(ordered) + 1) // 2)]
    return sum(half) / len(half)


def _synthetic(n: int, seed: int) -> list[int]:
    return [(i * 7919 + seed * 104729) % 2000 + 10 for i in range(n)]


class _Constant:
    """Proposes the same token k times: a step that verifies k tokens and commits one."""

    name = "constant"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return Draft([self.token] * k)


def _time_step(runtime: Any, context: list[int], n: int) -> float:
    """One speculative step feeding n tokens, as decode_steps runs it, then undone."""
    base = runtime.length
    t0 = time.perf_counter()
    draft = _Constant(context[-2]).propose(context, n - 1)
    rows = runtime.forward([context[-1], *draft.tokens])
    verdict = verify_greedy(draft.tokens, rows)
    runtime.rollback(base + 1 + verdict.accepted)
    elapsed = time.perf_counter() - t0
    runtime.rollback(base)
    return elapsed


def _time_draft(drafter: Any, runtime: Any, prompt: list[int], k: int, repeats: int) -> float:
    """Median D(k). A draft with its own cache sees the context grow one token a call (it
    catches that token up, as after a rejected step); self-speculation, which shares the
    target's cache, proposes from the same context each time."""
    from ..drafters.self_spec import SelfSpecDrafter

    shares_cache = isinstance(drafter, SelfSpecDrafter)
    context = list(prompt)
    runtime.rollback(0)
    runtime.prefill(context[:-1])
    drafter.start(context[:-1], SamplingConfig(), torch.Generator().manual_seed(0))
    drafter.propose(context, k)  # warm up (a model draft catches up on the prompt here)
    times = []
    for r in range(repeats):
        if not shares_cache:
            drafter.observe(0)
            context.append(_synthetic(1, r + 5)[0])
        t0 = time.perf_counter()
        drafter.propose(context, k)
        times.append(time.perf_counter() - t0)
    return fast_half_mean(times)


def _token_overhead(model: Any, context: int, profile: Profile) -> float:
    """What a plain generation spends per token beyond its steps (detokenising and so on)."""
    from ..decode import generate

    n = 24
    res = generate(model, _synthetic(context, 7), max_new_tokens=n)
    per_step = (res.seconds - res.prefill_seconds) / max(res.new_tokens - 1, 1)
    return max(per_step - profile.step_time(1, context + n / 2), 0.0)


def measure_profile(
    model: Any,
    *,
    drafts: Sequence[str] = ("lookup",),
    max_n: int = 16,
    contexts: Sequence[int] = (128, 1024),
    repeats: int = 5,
    progress: Callable[[str, float], None] | bool = True,
) -> Profile:
    """Measure T(n) and step(n) for n = 1..max_n at each context, D(k) for k = 1..max_n - 1
    of each draft spec, and the per-token overhead. ``progress`` is a callback
    ``(description, fraction done)``, or True for a rich progress bar on stderr."""
    from ..drafters import make_drafter

    if max_n < 2:
        raise ConfigError(f"max_n={max_n} must be >= 2 (a speculative step feeds at least 2 tokens)")
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    contexts = sorted(set(int(c) for c in contexts))
    limit = model.runtime.max_context
    if not contexts or contexts[0] < 2 or contexts[-1] + max_n + repeats + 2 > limit:
        raise ConfigError(f"contexts {contexts} must be >= 2 and leave room for {max_n} tokens in {limit}")
    drafters = {spec: make_drafter(spec, model) for spec in drafts if spec != "none"}
    total = len(contexts) * repeats + len(drafters) * (max_n - 1) + 1
    done = 0

    bar = None
    if progress is True:
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("profile", total=total)
        bar.start()

        def report(desc: str, frac: float) -> None:
            bar.update(task, completed=frac * total, description=desc)

    elif callable(progress):
        report = progress
    else:

        def report(desc: str, frac: float) -> None:
            pass

    rt = model.runtime
    forward: dict[int, list[float]] = {}
    step: dict[int, list[float]] = {}
    try:
        for c in contexts:
            context = _synthetic(c, 1)
            rt.rollback(0)
            rt.prefill(context[:-1])  # the last token is fed by each step, as in decoding
            _time_step(rt, context, 2)  # warm up
            f_times: list[list[float]] = [[] for _ in range(max_n)]
            s_times: list[list[float]] = [[] for _ in range(max_n)]
            for _ in range(repeats):  # rounds over n, so drift hits every n alike
                for n in range(1, max_n + 1):
                    f_times[n - 1].append(time_pass(rt, context[-1:] + _synthetic(n - 1, 3)))
                    s_times[n - 1].append(_time_step(rt, context, n))
                done += 1
                report(f"target passes, context {c}", done / total)
            forward[c] = monotone([fast_half_mean(t) for t in f_times])
            # a step contains the pass, so it never costs less than the pass alone
            step[c] = monotone([max(s, f) for s, f in zip(map(fast_half_mean, s_times), forward[c])])
        profile = Profile(
            model=model.name,
            fingerprint=model_fingerprint(model),
            dtype=str(model.dtype).replace("torch.", ""),
            runtime=type(rt).__name__,
            forward=forward,
            step=step,
            machine={
                "threads": torch.get_num_threads(),
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
            },
            created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
        prompt = _synthetic(contexts[0], 2)
        for spec, drafter in drafters.items():
            costs = []
            for k in range(1, max_n):
                costs.append(_time_draft(drafter, rt, prompt, k, repeats))
                done += 1
                report(f"draft {spec}, k={k}", done / total)
            profile.drafts[spec] = costs
        rt.rollback(0)
        profile.token_overhead = _token_overhead(model, contexts[0], profile)
        report("done", 1.0)
    finally:
        if bar is not None:
            bar.stop()
        rt.rollback(0)
    return profile
