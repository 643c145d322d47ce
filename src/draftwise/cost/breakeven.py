"""The break-even calculator: when does a draft pay, and with how many proposals?

Pure functions over the cost model of ../shared/DESIGN.md section 3; nothing here loads a model.

One speculative step proposes k tokens and verifies them in one target pass. In units of a plain
decoding step T(1) it costs

    R(k) = (D(k) + T(k+1)) / T(1) = k c + v(k)

where c = D(k) / (k T(1)) is the draft's cost per proposed token and v(k) = T(k+1) / T(1) the
verification cost (1 on a GPU for small k; it grows on a CPU). With i.i.d. acceptance a the step
commits E(a, k) = (1 - a^(k+1)) / (1 - a) tokens, so the predicted speedup is

    S(a, k) = E(a, k) / R(k)

and the break-even acceptance a*(k) solves E(a, k) = R(k). Leviathan et al. (2023) is the case
v = 1: S = (1 - a^(k+1)) / ((1 - a)(k c + 1)).

>>> round(speedup(0.8, 4, step_cost_ratio(4, c=0.1)), 3)   # 3.36 tokens for 1.4 steps
2.401
>>> best = optimal_k(0.8, cost_ratio_from_c(0.1), k_max=16); best.k, round(best.speedup, 3)
(6, 2.47)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..plots import pyplot, save_figure
from .model import breakeven_acceptance, expected_committed

#: Typical draft cost per proposed token c = D(k) / (k T(1)), as a fraction of a target step.
#:
#: - ``lookup`` (prompt lookup, Saxena 2023): a few dictionary look-ups of the last n-gram,
#:   microseconds against a decode step of tens of milliseconds; draftwise's lookup does
#:   ``max - min + 1`` look-ups whatever the context. 0.0003 is ~10 us against a ~30 ms step.
#: - ``self`` (layer-skip self-speculation: Draft & Verify, Zhang et al. 2023; LayerSkip,
#:   Elhoushi et al. 2024): the draft runs the kept layers of the target itself, typically
#:   50-70 % of them, plus the LM head; 0.6 is the middle of that range.
#: - ``model`` (a separate small draft, Leviathan et al. 2023; Chen et al. 2023): a draft 10-20x
#:   smaller in parameters costs more than its size suggests, because each call has fixed
#:   overhead (kernel launches, sampling, the LM head over the full vocabulary); Chen et al.
#:   report a 4B draft at about 1/8 of a 70B target's step. 0.15 sits in the 0.1-0.2 range.
#:
#: These are presets for a calculator; ``draftwise profile`` measures the real costs.
DRAFT_KIND_COSTS: dict[str, float] = {"lookup": 0.0003, "self": 0.6, "model": 0.15}

MAX_K = 256  # a sweep wider than this is almost certainly a typo (e.g. ``1-1000``)

CostRatio = Callable[[int], float]  # k -> R(k), one speculative step in plain steps


class KChoice(NamedTuple):
    """The best number of proposals: ``k=None`` means "no speculation" (speedup 1.0)."""

    k: int | None
    speedup: float


# -- the closed forms ---------------------------------------------------------------------
def _check_a(a: float) -> None:
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1 or math.isnan(a):
        raise ConfigError(f"acceptance a={a!r} must be in [0, 1) (1 would mean every token accepted)")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k={k!r} must be an integer >= 1 (the number of proposed tokens)")


def ceiling(a: float) -> float:
    """1 / (1 - a): the most tokens a step can commit at acceptance a, however large k.

    >>> round(ceiling(0.8), 9), ceiling(0.5)
    (5.0, 2.0)
    """
    _check_a(a)
    return 1 / (1 - a)


def step_cost_ratio(k: int, c: float, v: float = 1.0) -> float:
    """R(k) = k c + v: one speculative step in plain decoding steps.

    >>> step_cost_ratio(4, 0.1), step_cost_ratio(4, 0.1, v=1.25)
    (1.4, 1.65)
    """
    _check_k(k)
    if c < 0 or v <= 0:
        raise ConfigError(f"draft cost c={c} must be >= 0 and verification cost v={v} > 0")
    return k * c + v


def speedup(a: float, k: int, step_cost_ratio: float) -> float:
    """S = E(a, k) / R(k): predicted speedup over plain decoding.

    >>> round(speedup(0.8, 4, 1.0), 2), round(speedup(0.5, 4, 1.0), 2), round(speedup(0.5, 8, 1.0), 3)
    (3.36, 1.94, 1.996)
    """
    _check_a(a)
    _check_k(k)
    if not step_cost_ratio > 0:
        raise ConfigError(f"step cost ratio R={step_cost_ratio} must be > 0")
    return expected_committed(a, k) / step_cost_ratio


def leviathan_speedup(a: float, k: int, c: float) -> float:
    """Leviathan et al.'s improvement factor (1 - a^(k+1)) / ((1 - a)(k c + 1)).

    The special case v(k) = 1 of :func:`speedup`, written out independently so tests can
    compare the two.

    >>> round(leviathan_speedup(0.8, 4, 0.1), 4)
    2.4011
    """
    _check_a(a)
    _check_k(k)
    if c < 0:
        raise ConfigError(f"draft cost c={c} must be >= 0")
    return (1 - a ** (k + 1)) / ((1 - a) * (k * c + 1))


def optimal_k(
    a: float, cost_ratio: CostRatio, k_max: int = 16, *, ks: Iterable[int] | None = None
) -> KChoice:
    """The k in ``ks`` (default 1..k_max) that maximises S(a, k); ties go to the smaller k.

    Returns ``KChoice(None, 1.0)`` when no k gives S > 1: plain decoding is faster.

    >>> optimal_k(0.5, cost_ratio_from_c(0.15), k_max=8).k
    2
    >>> optimal_k(0.3, cost_ratio_from_c(0.6), k_max=8)
    KChoice(k=None, speedup=1.0)
    """
    candidates = list(ks) if ks is not None else list(range(1, k_max + 1))
    if not candidates:
        raise ConfigError("optimal_k needs at least one k")
    best = KChoice(None, 1.0)
    for k in candidates:
        s = speedup(a, k, cost_ratio(k))
        if s > best.speedup:
            best = KChoice(k, s)
    return best


# -- where R(k) comes from ----------------------------------------------------------------
def _per_k(values: float | Sequence[float], what: str, flag: str) -> Callable[[int], float]:
    """One number for every k, or a list for k = 1..K (an error past K)."""
    if isinstance(values, (int, float)):
        return lambda k: float(values)
    vals = [float(x) for x in values]
    if not vals:
        raise ConfigError(f"{flag} needs at least one value")

    def at(k: int) -> float:
        if k > len(vals):
            raise ConfigError(
                f"{flag} gives {what} for k=1..{len(vals)} but k={k} was asked for; "
                f"give {k} values or narrow --k"
            )
        return vals[k - 1]

    return at


def _check_v(v: float | Sequence[float]) -> None:
    for x in [v] if isinstance(v, (int, float)) else v:
        if not x > 0:
            raise ConfigError(f"verification cost v={x} must be > 0 (v(k) = T(k+1) / T(1), about 1)")


def cost_ratio_from_c(c: float, v: float | Sequence[float] = 1.0) -> CostRatio:
    """R(k) = k c + v(k), with D(k) = k c T(1).

    >>> cost_ratio_from_c(0.1)(4)
    1.4
    >>> cost_ratio_from_c(0.1, v=[1.0, 1.1])(2)
    1.3
    """
    if c < 0:
        raise ConfigError(f"draft cost --c={c} must be >= 0 (cost per proposed token, in target steps)")
    _check_v(v)
    v_at = _per_k(v, "v(k)", "--v")
    return lambda k: k * c + v_at(k)


def cost_ratio_from_times(
    draft_ms: Sequence[float], t1_ms: float, v: float | Sequence[float] = 1.0
) -> CostRatio:
    """R(k) = D(k) / T(1) + v(k), from measured D(1..K) and T(1) in milliseconds.

    >>> cost_ratio_from_times([2.0, 4.0, 6.0], t1_ms=20.0)(3)
    1.3
    """
    if not t1_ms or t1_ms <= 0:
        raise ConfigError(f"--t1-ms={t1_ms} must be > 0 (one plain decoding step, in ms)")
    if any(d < 0 for d in draft_ms):
        raise ConfigError(f"draft times {list(draft_ms)} must be >= 0 ms")
    _check_v(v)
    d_at = _per_k(draft_ms, "D(k)", "--draft-ms")
    v_at = _per_k(v, "v(k)", "--v")
    return lambda k: d_at(k) / t1_ms + v_at(k)


def cost_ratio_from_profile(profile: Any, draft: str, context: float | None = None) -> CostRatio:
    """R(k) from a measured :class:`~draftwise.cost.profile.Profile` (step times include the
    per-step overhead)."""
    if draft != "none" and draft not in profile.drafts:
        raise ConfigError(
            f"the profile has no costs for draft {draft!r} (it has: {', '.join(profile.drafts) or 'none'}); "
            f"run `draftwise profile --draft {draft}` or pick one of those"
        )
    return lambda k: profile.step_cost_ratio(draft, k, context)


@dataclass(frozen=True)
class CostCurve:
    """A named R(k): one draft's cost. ``c`` is set when the curve is k c + v(k)."""

    name: str
    ratio: CostRatio
    source: str  # "c", "kind", "draft_ms" or "profile"
    c: float | None = None


# -- parsing the CLI's value lists --------------------------------------------------------
def _float(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a number") from None
    if math.isnan(x) or math.isinf(x):
        raise ConfigError(f"{what}: {text!r} is not a finite number")
    return x


def parse_floats(text: str, what: str = "value") -> list[float]:
    """``"1.0,1.05"`` -> [1.0, 1.05].

    >>> parse_floats("1, 1.05,1.1")
    [1.0, 1.05, 1.1]
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise ConfigError(f"{what}: {text!r} is not a comma-separated list of numbers")
    return [_float(p, what) for p in parts]


def parse_acceptances(text: str) -> list[float]:
    """Acceptance values: ``0.8``, ``0.5,0.6,0.7`` or a sweep ``start:stop:step`` (stop included).

    >>> parse_acceptances("0.8"), parse_acceptances("0.5,0.7")
    ([0.8], [0.5, 0.7])
    >>> parse_acceptances("0.1:0.3:0.05")
    [0.1, 0.15, 0.2, 0.25, 0.3]
    """
    text = str(text).strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(f"acceptance sweep {text!r} must be start:stop:step, e.g. 0.1:0.95:0.05")
        start, stop, step = (_float(p.strip(), "acceptance sweep") for p in parts)
        if step <= 0 or stop < start:
            raise ConfigError(f"acceptance sweep {text!r} needs step > 0 and stop >= start")
        n = math.floor((stop - start) / step + 1e-9) + 1
        if n > 10_000:
            raise ConfigError(f"acceptance sweep {text!r} has {n} points; use a larger step")
        values = [round(start + i * step, 10) for i in range(n)]
    else:
        values = parse_floats(text, "acceptance")
    for a in values:
        if not 0 <= a < 1:
            raise ConfigError(f"acceptance {a} must be in [0, 1) (1 would mean every token accepted)")
    return values


def parse_ks(text: str) -> list[int]:
    """Numbers of proposals: ``4``, ``1-8``, ``2,4,8`` or a mix ``1-4,8``; sorted, unique.

    >>> parse_ks("4"), parse_ks("1-4"), parse_ks("8,2,4,2")
    ([4], [1, 2, 3, 4], [2, 4, 8])
    """
    ks: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise ConfigError(f"--k {text!r}: {part!r} is not a k, a range like 1-8, or a list like 2,4,8") from None
        if lo < 1 or hi < lo:
            raise ConfigError(f"--k {text!r}: k must be >= 1 and ranges low-high with low <= high")
        if hi > MAX_K:
            raise ConfigError(f"--k {text!r}: k up to {MAX_K} is supported")
        ks.update(range(lo, hi + 1))
    return sorted(ks)


def parse_draft_kinds(text: str) -> list[str]:
    """``lookup``, ``self``, ``model``, a comma list of them, or ``all``."""
    kinds = [p.strip() for p in str(text).split(",")]
    if kinds == ["all"]:
        return list(DRAFT_KIND_COSTS)
    for kind in kinds:
        if kind not in DRAFT_KIND_COSTS:
            raise ConfigError(
                f"unknown draft kind {kind!r}; use one of: {', '.join(DRAFT_KIND_COSTS)} (or all)"
            )
    return list(dict.fromkeys(kinds))


def kind_curves(kinds: Iterable[str], v: float | Sequence[float] = 1.0) -> list[CostCurve]:
    """Cost curves for the typical draft kinds (:data:`DRAFT_KIND_COSTS`)."""
    return [
        CostCurve(f"{kind} (c={DRAFT_KIND_COSTS[kind]:g})", cost_ratio_from_c(DRAFT_KIND_COSTS[kind], v),
                  "kind", DRAFT_KIND_COSTS[kind])
        for kind in kinds
    ]


# -- the sweep ----------------------------------------------------------------------------
def sweep(acceptances: Sequence[float], ks: Sequence[int], curves: Sequence[CostCurve]) -> dict[str, Any]:
    """Everything the calculator prints, as plain data (what ``--json`` writes).

    Keys: ``acceptance`` and ``k`` (the grid); ``ceiling[i]`` = 1 / (1 - a_i);
    ``expected[i][j]`` = E(a_i, k_j); and per cost curve in ``drafts``: ``cost_ratio[j]`` =
    R(k_j), ``breakeven[j]`` = a*(k_j) (0.0: pays at any acceptance; None: never pays),
    ``speedup[i][j]`` = S(a_i, k_j), and ``best[i]`` = the optimal k at a_i among ``k``
    (``{"a", "k", "speedup"}``, k None for "no speculation").

    >>> out = sweep([0.8], [4], [CostCurve("c=0", cost_ratio_from_c(0.0), "c", 0.0)])
    >>> out["expected"], out["ceiling"], out["drafts"][0]["best"]
    ([[3.3616]], [5.0], [{'a': 0.8, 'k': 4, 'speedup': 3.3616}])
    """
    if not acceptances or not ks or not curves:
        raise ConfigError("the sweep needs at least one acceptance, one k and one draft cost")
    for a in acceptances:
        _check_a(a)
    for k in ks:
        _check_k(k)
    out: dict[str, Any] = {
        "acceptance": list(acceptances),
        "k": list(ks),
        "ceiling": [_r(ceiling(a)) for a in acceptances],
        "expected": [[_r(expected_committed(a, k)) for k in ks] for a in acceptances],
        "drafts": [],
    }
    for curve in curves:
        ratios = [curve.ratio(k) for k in ks]
        for k, r in zip(ks, ratios):
            if not r > 0:
                raise ConfigError(f"{curve.name}: step cost R({k})={r} must be > 0")
        best = [optimal_k(a, curve.ratio, ks=ks) for a in acceptances]
        out["drafts"].append(
            {
                "name": curve.name,
                "source": curve.source,
                "c": curve.c,
                "cost_ratio": [_r(r) for r in ratios],
                "breakeven": [_r_opt(breakeven_acceptance(k, r)) for k, r in zip(ks, ratios)],
                "speedup": [[_r(speedup(a, k, r)) for k, r in zip(ks, ratios)] for a in acceptances],
                "best": [
                    {"a": a, "k": b.k, "speedup": _r(b.speedup)} for a, b in zip(acceptances, best)
                ],
            }
        )
    return out


def _r(x: float) -> float:
    return round(x, 6)


def _r_opt(x: float | None) -> float | None:
    return None if x is None else _r(x)


def min_breakeven(curve: CostRatio, ks: Sequence[int]) -> tuple[float, int] | None:
    """The lowest a*(k) over ``ks`` and its k: below that acceptance no k pays. None: never.

    >>> a, k = min_breakeven(cost_ratio_from_c(0.15), range(1, 9)); (round(a, 6), k)
    (0.15, 1)
    """
    best: tuple[float, int] | None = None
    for k in ks:
        a = breakeven_acceptance(k, curve(k))
        if a is not None and (best is None or a < best[0]):
            best = (a, k)
    return best


# -- the plot -----------------------------------------------------------------------------
def plot_speedup(
    path: str | Path,
    ks: Sequence[int],
    curves: Sequence[CostCurve],
    *,
    v: float | Sequence[float] = 1.0,
    markers: Mapping[str, CostRatio] | None = None,
    title: str | None = None,
) -> Path:
    """Draw S(a) against acceptance for several k, one panel per cost curve, and save a PNG.

    Each panel has the S = 1 line and a vertical line per draft kind (at its typical cost
    :data:`DRAFT_KIND_COSTS`, with verification cost ``v``) and per entry of ``markers`` (e.g.
    a profile's drafts) at its lowest break-even acceptance over ``ks``. Needs matplotlib
    (imported here, with the Agg backend, so the core never imports it).
    """
    try:
        plt = pyplot()
    except ImportError:  # pragma: no cover - matplotlib is a dependency of the plot only
        raise ConfigError("--plot needs matplotlib: pip install 'draftwise[plot]'") from None

    if not curves:
        raise ConfigError("plot_speedup needs at least one cost curve")
    ks = list(ks)
    if len(ks) > 8:  # more lines than a reader can tell apart: keep 8, spread over the range
        ks = sorted({ks[round(i * (len(ks) - 1) / 7)] for i in range(8)})
    lines: dict[str, CostRatio] = {
        kind: cost_ratio_from_c(c, v) for kind, c in DRAFT_KIND_COSTS.items()
    }
    lines.update(markers or {})
    grid = [i / 200 for i in range(0, 198)]  # a in [0, 0.985]

    fig, axes = plt.subplots(
        1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False, sharey=True
    )
    colors = plt.get_cmap("tab10")
    for ax, curve in zip(axes[0], curves):
        for j, k in enumerate(ks):
            r = curve.ratio(k)
            ax.plot(grid, [speedup(a, k, r) for a in grid], label=f"k={k}", color=colors(j % 10))
        ax.axhline(1.0, color="black", linewidth=1, linestyle="-", label="S = 1")
        for i, (name, ratio) in enumerate(lines.items()):
            found = min_breakeven(ratio, ks)
            if found is None:
                continue
            a_star, k_star = found
            ax.axvline(a_star, color="grey", linestyle=[":", "--", "-."][i % 3], linewidth=1)
            ax.annotate(
                f"{name} a*={a_star:.2f} (k={k_star})",
                xy=(a_star, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                va="bottom",
                ha="right",
            )
        ax.set_title(curve.name, fontsize=10)
        ax.set_xlabel("acceptance a")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("predicted speedup S = E(a, k) / R(k)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
