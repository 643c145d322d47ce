"""A machine profile: what a target pass and each draft cost on *this* machine (the data, its
file, and reading it; measuring one is :mod:`draftwise.cost.measure`).

``draftwise profile`` measures, for one model and dtype:

- ``forward[c][n-1]``: T(n), one target pass over n new tokens on a warm cache of c tokens;
- ``step[c][n-1]``: one whole speculative step that feeds n tokens (n - 1 proposed): the pass,
  verification and the cache rollback. ``step - forward`` is the per-step overhead;
- ``step_sampled[c][n-1]``: the same step with sampled verification (temperature > 0): the
  logits made probabilities, the rejection test and, on a rejection, the residual's draw. Empty
  in profiles made before it was measured; sampled predictions then use ``step``;
- ``drafts[spec][k-1]``: D(k), the time a draft takes to propose k tokens;
- ``token_overhead``: per committed token, what a generation spends outside the steps
  (detokenising, stop strings, statistics).

Each value is the mean of the faster half of ``repeats`` timings
(:func:`~draftwise.cost.timing.fast_half_mean`) taken in rounds over n (so that drift hits every
n alike), made non-decreasing in n (a dip is noise: a longer pass never costs less), and a step
is never cheaper than its pass.

Times grow with the context (attention reads every cached key), so T and the step are measured
at two context lengths and interpolated linearly between them (and extrapolated beyond).
The planner and ``--k auto`` read the profile; a profile made on another model, or in another
dtype, is refused. Drafts are keyed by their canonical spec (``str(DraftSpec)``), so
``lookup:min=1`` and ``lookup`` are one draft.

Example::

    from draftwise import load_model
    from draftwise.cost.measure import measure_profile
    model = load_model("default")
    profile = measure_profile(model, drafts=["lookup"], max_n=8, repeats=3)
    print(profile.step_cost_ratio("lookup", 4))   # a lookup step with k=4, in plain steps
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import platform
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftwise.drafters.factory import cost_variant
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.fsutil import fields_of, read_json, write_json_atomic
from draftwise.runtime import kernels
from draftwise.runtime.loaders import cache_dir, model_fingerprint

SCHEMA = "draftwise.profile/1"


#: the CPU features that decide which kernels torch and oneDNN run (so what a pass costs): two
#: machines that report the same model name can differ in them, and with AVX-512 or without it
#: the same CPU model decodes at nearly twice or half the speed (docs/benchmarks.md, "Machines")
_KERNEL_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                 "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


@functools.cache
def _cpuinfo_line(*prefixes: str) -> str:
    """The value of the first /proc/cpuinfo line that starts with one of ``prefixes`` ("" where
    there is none); read once per process, since every profile check asks."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(prefixes)), "")
    except OSError:
        return ""
    return line.split(":", 1)[-1].strip()


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    return _cpuinfo_line("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The :data:`_KERNEL_FLAGS` this CPU reports (``/proc/cpuinfo``; empty where there is none)."""
    have = set(_cpuinfo_line("flags", "Features").split())
    return [flag for flag in _KERNEL_FLAGS if flag in have]


def machine_fingerprint() -> str:
    """This machine as timing sees it, hashed: the CPU model, its kernel-relevant features
    (:func:`cpu_flags`, and the vector level torch dispatches to), the core count, the
    accelerator (if any), torch's version and which attention the runtime runs (the compiled
    kernel, by its source, or the torch path: :func:`..runtime.kernels.signature`). A profile
    measured on another machine, or with other kernels, is refused (or, for a cached one,
    measured again) by it."""
    cpu = cpu_model()
    level = torch.backends.cpu.get_cpu_capability()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    text = (f"{cpu}\0{level}\0{','.join(cpu_flags())}\0{os.cpu_count()}\0{device}\0{torch.__version__}"
            f"\0{kernels.signature()}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    #: the step with sampled verification (temperature > 0); empty in older profiles
    step_sampled: dict[int, list[float]] = field(default_factory=dict)
    #: seconds per prompt token a draft with its own cache spends catching up on the prompt
    #: at its first proposal (a model draft's or a head's prefill); 0 for drafts without one
    draft_prefill: dict[str, float] = field(default_factory=dict)
    token_overhead: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    #: per draft, what beside its spec decided its cost when measured
    #: (:func:`~draftwise.drafters.factory.cost_variant`); absent in older profiles, read as ""
    draft_variants: dict[str, str] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------
    @property
    def max_n(self) -> int:
        return len(next(iter(self.step.values())))

    def forward_time(self, n: int, context: float | None = None) -> float:
        """T(n): a target pass over n tokens."""
        return _interp(self.forward, n, context)

    def step_time(self, n: int, context: float | None = None, *, sampled: bool = False) -> float:
        """A step that feeds n tokens: pass + verification + rollback. ``sampled``: with sampled
        verification, where the profile measured it (greedy's step otherwise)."""
        return _interp(self.step_sampled if sampled and self.step_sampled else self.step, n, context)

    def overhead(self, n: int, context: float | None = None) -> float:
        """Per-step overhead beyond the pass itself (sampling, verification, bookkeeping): one
        value per context, the median over the measured n of step - forward, for any ``n`` in
        the profile. The work scarcely depends on n, while step and forward are timed apart, so
        their difference at each n is mostly noise, several times its median at some n; the
        goodput policy, charging that per sequence, kept the k it hit off and took plain steps
        or larger trees instead (docs/benchmarks.md, "Goodput at N concurrent requests")."""
        if not 1 <= n <= self.max_n:
            raise ConfigError(f"the profile covers passes of 1..{self.max_n} tokens, not {n}")
        return _interp(self._overheads, 1, context)

    @functools.cached_property
    def _overheads(self) -> dict[int, list[float]]:
        """Per context, the median over n of step - forward (computed once: the goodput policy
        asks for every sequence and k of every step)."""
        return {c: [statistics.median(max(s - f, 0.0) for f, s in zip(self.forward[c], steps))]
                for c, steps in self.step.items()}

    def has_draft(self, spec: DraftSpec | str) -> bool:
        """Whether this profile measured ``spec`` (``none`` costs nothing, so always)."""
        key = str(DraftSpec.parse(spec))
        return key == "none" or key in self.drafts

    def stale_drafts(self, specs: Iterable[DraftSpec | str]) -> list[str]:
        """The drafts of ``specs`` this profile measured under another cost variant than this
        machine runs them in now (:func:`~draftwise.drafters.factory.cost_variant`: an EAGLE head
        measured in float32 that now drafts in int8); a cache measures them again."""
        keys = dict.fromkeys(str(DraftSpec.parse(s)) for s in specs)
        return [k for k in keys if k in self.drafts and self.draft_variants.get(k, "") != cost_variant(k)]

    def draft_time(self, spec: DraftSpec | str, k: int) -> float:
        """D(k) of a profiled draft (0 for ``none``)."""
        key = spec if isinstance(spec, str) and spec in self.drafts else str(DraftSpec.parse(spec))
        if key == "none" or k == 0:
            return 0.0
        if key not in self.drafts:
            raise ConfigError(
                f"the profile has no costs for draft {key!r} (it has: "
                f"{', '.join(self.drafts) or 'none'}); run `draftwise profile --draft {key}`"
            )
        costs = self.drafts[key]
        if k > len(costs):  # past the measured k, each more token costs what the last one did
            return costs[-1] + (k - len(costs)) * (costs[-1] - (costs[-2] if len(costs) > 1 else 0.0))
        return costs[k - 1]

    def draft_prefill_time(self, spec: DraftSpec | str, prompt_len: int) -> float:
        """What ``spec``'s first proposal spends on a prompt of ``prompt_len`` tokens beyond D(k)."""
        key = spec if isinstance(spec, str) and spec in self.drafts else str(DraftSpec.parse(spec))
        return self.draft_prefill.get(key, 0.0) * prompt_len

    def verify_ratio(self, k: int, context: float | None = None) -> float:
        """v(k) = T(k+1) / T(1), whole steps."""
        return self.step_time(k + 1, context) / self.step_time(1, context)

    def draft_ratio(self, spec: DraftSpec | str, k: int, context: float | None = None) -> float:
        """c = D(k) / (k T(1)): the draft's cost per proposed token, in plain steps."""
        return self.draft_time(spec, k) / (k * self.step_time(1, context))

    def step_cost_ratio(
        self, spec: DraftSpec | str, k: int, context: float | None = None, *, sampled: bool = False
    ) -> float:
        """R(k) = (D(k) + step(k+1)) / step(1): one speculative step in plain steps."""
        step = self.step_time(k + 1, context, sampled=sampled)
        return (self.draft_time(spec, k) + step) / self.step_time(1, context, sampled=sampled)

    def same_machine(self) -> bool:
        """Whether this profile was measured on this machine (:func:`machine_fingerprint`; a
        profile from before the fingerprint was recorded is taken as this machine's)."""
        return self.machine.get("fingerprint") in (None, machine_fingerprint())

    def check_model(self, model: Any, dtype: str | None = None, *, machine: bool = True) -> None:
        """Raise unless this profile was made on ``model`` (and ``dtype``), on this machine
        (``machine=False`` skips the machine: reading a profile sent from elsewhere)."""
        if machine and not self.same_machine():
            raise ConfigError(
                f"this profile was measured on another machine ({self.machine.get('cpu', '?')}, fingerprint "
                f"{self.machine.get('fingerprint')}; this one is {machine_fingerprint()}); run `draftwise profile` here"
            )
        mine = model_fingerprint(model)
        if mine != self.fingerprint:
            raise ConfigError(
                f"this profile was made on model {self.model!r} (fingerprint {self.fingerprint}), "
                f"not on {model.name!r} ({mine}); run `draftwise profile --model {model.name}`"
            )
        dtype = dtype or model.mode
        if dtype != self.dtype:
            raise ConfigError(
                f"this profile was measured in {self.dtype}, not {dtype}; run `draftwise profile` "
                "with the same --dtype and --quant as this run"
            )

    # -- files ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = SCHEMA
        out["forward"] = {str(c): v for c, v in self.forward.items()}
        out["step"] = {str(c): v for c, v in self.step.items()}
        out["step_sampled"] = {str(c): v for c, v in self.step_sampled.items()}
        return out

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON, atomically (a crash never leaves half a profile)."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the profile") -> Profile:
        """Read :meth:`to_dict`'s output, checking every field; errors name ``source``.

        Older profiles keyed drafts by the spec as typed; keys are made canonical here, so a
        profile keyed ``lookup``, ``self`` or ``model:default`` still loads.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source} is not a draftwise profile (a JSON {type(data).__name__}, not an object)")
        if data.get("schema") != SCHEMA:
            raise ConfigError(f"{source} is not a draftwise profile (schema {data.get('schema')!r}, want {SCHEMA!r})")
        with fields_of(source, "measure it again with `draftwise profile`"):
            forward = _curves(data["forward"], "forward")
            step = _curves(data["step"], "step")
            step_sampled = _curves(data["step_sampled"], "step_sampled") if data.get("step_sampled") else {}
            drafts_in = data.get("drafts", {})
            if not isinstance(drafts_in, dict):
                raise ValueError("'drafts' must map draft specs to lists of seconds")
            drafts = {str(DraftSpec.parse(s)): _seconds(v, f"drafts[{s!r}]") for s, v in drafts_in.items()}
            prefill_in = data.get("draft_prefill", {})
            if not isinstance(prefill_in, dict):
                raise ValueError("'draft_prefill' must map draft specs to seconds per prompt token")
            draft_prefill = {
                str(DraftSpec.parse(s)): _seconds([v], f"draft_prefill[{s!r}]")[0] for s, v in prefill_in.items()
            }
            variants_in = data.get("draft_variants", {})
            if not isinstance(variants_in, dict) or not all(isinstance(v, str) for v in variants_in.values()):
                raise ValueError("'draft_variants' must map draft specs to strings")
            draft_variants = {str(DraftSpec.parse(s)): v for s, v in variants_in.items()}
            lengths = {len(v) for v in [*forward.values(), *step.values()]}
            if set(forward) != set(step) or len(lengths) != 1:
                raise ValueError("'forward' and 'step' must cover the same contexts and the same n")
            if step_sampled and (set(step_sampled) != set(step)
                                 or {len(v) for v in step_sampled.values()} != lengths):
                raise ValueError("'step_sampled' must cover the same contexts and n as 'step'")
            overhead = float(data.get("token_overhead", 0.0))
            if not math.isfinite(overhead) or overhead < 0:
                raise ValueError(f"token_overhead={overhead} must be a finite number >= 0")
            for key in ("model", "fingerprint", "dtype", "runtime"):
                if not isinstance(data[key], str):
                    raise ValueError(f"{key!r} must be a string")
            return cls(
                model=data["model"],
                fingerprint=data["fingerprint"],
                dtype=data["dtype"],
                runtime=data["runtime"],
                forward=forward,
                step=step,
                step_sampled=step_sampled,
                drafts=drafts,
                draft_prefill=draft_prefill,
                token_overhead=overhead,
                machine=dict(data.get("machine", {})),
                created=str(data.get("created", "")),
                draft_variants=draft_variants,
            )

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile file; a missing, binary, non-JSON or wrongly shaped file is a ConfigError."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"no profile at {path}; make one with `draftwise profile --out {path}`")
        return cls.from_dict(read_json(path, "profile", "draftwise profile"), source=str(path))


def _seconds(values: Any, what: str) -> list[float]:
    """A non-empty list of finite, non-negative times."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{what} must be a non-empty list of seconds")
    out = [float(x) for x in values]
    if not all(math.isfinite(x) and x >= 0 for x in out):
        raise ValueError(f"{what} holds a negative or non-finite time")
    return out


def _curves(data: Any, what: str) -> dict[int, list[float]]:
    """``{"128": [seconds, ...], ...}`` -> ``{128: [...]}``, at least one context."""
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{what!r} must map context lengths to lists of seconds")
    return {int(c): _seconds(v, f"{what}[{c}]") for c, v in data.items()}


def _kernel_tag(model: Any) -> str:
    """``-mkldnn``, ``-mkl``...: the matmul kernels the native runtime packed for (a profile
    measured with one kernel says nothing of another's costs; MKL's and oneDNN's T(n) differ by
    up to 1.7x on AMD CPUs), or ``""`` for a runtime that does not say."""
    try:
        kinds = {str(getattr(m, "kind", type(m).__name__.lower())) for m in model.runtime.matmuls(0)}
    except (AttributeError, TypeError, IndexError):
        return ""
    return "-" + "+".join(sorted(kinds))


PROFILE_KINDS = ("profile", "auto")


def default_profile_path(model: Any, kind: str = "profile") -> Path:
    """Where a model's profile of one kind is cached: one file per model, mode, matmul kernel and
    kind of measurement, so no writer overwrites another's with other settings. ``profile``:
    ``draftwise profile`` (``<model>-float32-mkldnn.json``); ``auto``: what ``--k auto``
    measures on first use with its own fixed settings (``<model>-float32-mkldnn-auto.json``)."""
    if kind not in PROFILE_KINDS:
        raise ValueError(f"unknown profile kind {kind!r}; one of {', '.join(PROFILE_KINDS)}")
    tag = "" if kind == "profile" else f"-{kind}"
    return cache_dir() / "profiles" / f"{Path(model.folder).name}-{model.mode}{_kernel_tag(model)}{tag}.json"


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s ``.lock`` file (other processes wait): a
    read-measure-merge-write of a shared profile then loses no one's entries. Where the
    platform has no ``fcntl`` (Windows) it does not lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock = Path(str(path) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
