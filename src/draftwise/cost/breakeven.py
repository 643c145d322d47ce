"""The break-even calculator (``draftwise breakeven``): where a draft's cost R(k) comes from,
the sweep over acceptances and k, and its plot. Nothing here loads a model.

The formulas (E, S = E / R, a*, the best k) are :mod:`draftwise.cost.formulas`'s. One speculative
step costs R(k) = (D(k) + T(k+1)) / T(1) = k c + v(k) plain steps, where c = D(k) / (k T(1)) is
the draft's cost per proposed token and v(k) = T(k+1) / T(1) the verification cost (about 1 on
a GPU for small k; it grows on a CPU). R(k) comes from a cost per token ``c``, measured D(k) in
milliseconds, a typical draft kind, or a measured profile.

>>> best = optimal_k(0.8, cost_ratio_from_c(0.1), k_max=16); best.k, round(best.speedup, 3)
(6, 2.47)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftwise.cost.formulas import (
    CostRatio,
    breakeven_acceptance,
    ceiling,
    check_acceptance,
    check_k,
    expected_committed,
    min_breakeven,
    optimal_k,
    speedup,
)
from draftwise.cost.profile import Profile
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.plots import check_plot_path, pyplot, save_figure

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
#: - ``suffix`` (SuffixDecoding, Oliaro et al. 2024): a suffix-trie walk and a best-first tree
#:   of at most k nodes, tens of microseconds a step (docs/trees.md, "The drafts"); 0.0015 is
#:   about that against a plain step of tens of milliseconds.
#:
#: These are presets for a calculator; ``draftwise profile`` measures the real costs.
DRAFT_KIND_COSTS: dict[str, float] = {"lookup": 0.0003, "suffix": 0.0015, "self": 0.6, "model": 0.15}


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
        if not (x > 0 and math.isfinite(x)):
            raise ConfigError(f"verification cost v={x} must be a finite number > 0 (v(k) = T(k+1) / T(1), about 1)")


def cost_ratio_from_c(c: float, v: float | Sequence[float] = 1.0) -> CostRatio:
    """R(k) = k c + v(k), with D(k) = k c T(1).

    >>> cost_ratio_from_c(0.1)(4)
    1.4
    >>> cost_ratio_from_c(0.1, v=[1.0, 1.1])(2)
    1.3
    """
    if not (math.isfinite(c) and c >= 0):
        raise ConfigError(f"draft cost --c={c} must be a finite number >= 0 (cost per proposed token, in target steps)")
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
    if not (math.isfinite(t1_ms) and t1_ms > 0):
        raise ConfigError(f"--t1-ms={t1_ms} must be a finite number > 0 (one plain decoding step, in ms)")
    if any(not (math.isfinite(d) and d >= 0) for d in draft_ms):
        raise ConfigError(f"draft times {list(draft_ms)} must be >= 0 ms")
    _check_v(v)
    d_at = _per_k(draft_ms, "D(k)", "--draft-ms")
    v_at = _per_k(v, "v(k)", "--v")
    return lambda k: d_at(k) / t1_ms + v_at(k)


def cost_ratio_from_profile(profile: Profile, draft: DraftSpec | str, context: float | None = None) -> CostRatio:
    """R(k) from a measured :class:`~draftwise.cost.profile.Profile` (step times include the
    per-step overhead)."""
    key = str(DraftSpec.parse(draft))
    if not profile.has_draft(key):
        raise ConfigError(
            f"the profile has no costs for draft {key!r} (it has: {', '.join(profile.drafts) or 'none'}); "
            f"run `draftwise profile --draft {key}` or pick one of those"
        )
    if context is not None and not (math.isfinite(context) and context >= 0):
        raise ConfigError(f"--context={context} must be a context length in tokens (a finite number >= 0)")
    return lambda k: profile.step_cost_ratio(key, k, context)


@dataclass(frozen=True)
class CostCurve:
    """A named R(k): one draft's cost. ``c`` is set when the curve is k c + v(k)."""

    name: str
    ratio: CostRatio
    source: str  # "c", "kind", "draft_ms" or "profile"
    c: float | None = None


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
        check_acceptance(a)
    for k in ks:
        check_k(k)
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


# -- the plot -----------------------------------------------------------------------------
def _speedup_panel(ax: Any, curve: CostCurve, ks: Sequence[int], lines: Mapping[str, CostRatio], colors: Any) -> None:
    """One panel of :func:`plot_speedup`: S(a) for each k, the S = 1 line, and a vertical line
    at each of ``lines``' lowest break-even acceptance over ``ks``."""
    grid = [i / 200 for i in range(0, 198)]  # a in [0, 0.985]
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


def plot_speedup(
    path: str | Path,
    ks: Sequence[int],
    curves: Sequence[CostCurve],
    *,
    v: float | Sequence[float] = 1.0,
    markers: Mapping[str, CostRatio] | None = None,
    title: str | None = None,
) -> Path:
    """Draw S(a) against acceptance for several k, one panel per cost curve, and save it to
    ``path`` (the kind of file follows its extension: .png, .pdf, .svg ...).

    Each panel has the S = 1 line and a vertical line per draft kind (at its typical cost
    :data:`DRAFT_KIND_COSTS`, with verification cost ``v``) and per entry of ``markers`` (e.g.
    a profile's drafts) at its lowest break-even acceptance over ``ks``. Needs matplotlib
    (imported here, with the Agg backend, so the core never imports it).
    """
    plt = pyplot()  # without matplotlib: one ConfigError naming the install
    path = check_plot_path(path)  # before drawing: an extension matplotlib cannot write
    if not curves:
        raise ConfigError("plot_speedup needs at least one cost curve")
    ks = list(ks)
    if len(ks) > 8:  # more lines than a reader can tell apart: keep 8, spread over the range
        ks = sorted({ks[round(i * (len(ks) - 1) / 7)] for i in range(8)})
    lines: dict[str, CostRatio] = {
        kind: cost_ratio_from_c(c, v) for kind, c in DRAFT_KIND_COSTS.items()
    }
    lines.update(markers or {})

    fig, axes = plt.subplots(
        1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False, sharey=True
    )
    colors = plt.get_cmap("tab10")
    for ax, curve in zip(axes[0], curves):
        _speedup_panel(ax, curve, ks, lines, colors)
    axes[0][0].set_ylabel("predicted speedup S = E(a, k) / R(k)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
