"""Prediction intervals on the planner's speedups (cost/intervals.py), the sampled step in the
profile, and the validation's inside-the-interval check."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.cost.formulas import expected_committed_by_position
from draftwise.cost.intervals import (
    Counts, cost_ratio_draws, counts_from_steps, dispersion, percentile_interval, price_per_token, speedup_draws,
    timing_spread, uniforms,
)
from draftwise.cost.measure import measure_profile
from draftwise.planner.plan import load_plan, make_plan
from draftwise.planner.pick import Spread
from draftwise.cost.profile import Profile
from draftwise.planner.replay import predict_seconds
from draftwise.planner.validate import validate_plan
from draftwise.errors import ConfigError
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig

from .test_plan import PROMPTS, fake_profile


def test_counts_cut_a_longer_step_to_k_and_pool():
    c = counts_from_steps([(8, 5), (8, 1), (0, 0)], k=4)
    assert (c.accepted, c.proposing, c.steps) == ([2, 1, 1, 1], 2, 3)
    both = c + counts_from_steps([(2, 0)], k=2)
    assert (both.accepted, both.proposing, both.steps) == ([2, 1, 1, 1], 3, 4)
    assert Counts([0, 0, 0], 4, 5).rates() == [0.0]  # stops at the first position nobody tried
    # E = 1 + sum_i prod_{j<=i} c_j is exactly 1 + the mean accepted per proposing step
    steps = [(4, 3), (2, 2), (4, 0), (3, 1)]
    rates = counts_from_steps(steps, 4).rates()
    assert expected_committed_by_position(rates, 4) == pytest.approx(1 + 6 / 4)


def _simulate(rng, a, share, k, steps):
    """Steps of a chain draft with i.i.d. acceptance ``a`` that proposes on a ``share`` of steps."""
    out = []
    for _ in range(steps):
        if rng.random() >= share:
            out.append((0, 0))
            continue
        acc = 0
        while acc < k and rng.random() < a:
            acc += 1
        out.append((k, acc))
    return out


class _Costs:
    """Stands in for a profile: D(k) = 1 ms a token, step(n) = 10 ms + 0.5 ms a token."""

    def draft_time(self, spec, k):
        return 0.001 * k

    def step_time(self, n, context=None, *, sampled=False):
        return 0.010 + 0.0005 * n


@pytest.mark.parametrize("a,share", [(0.6, 0.5), (0.3, 0.9)])
def test_the_interval_holds_a_rerun_of_the_same_size_95_percent_of_the_time(a, share):
    """Trace, draw the interval, then decode a fresh rerun of the same size: over many traces
    the rerun's cost per token falls inside about 95% of the time. An interval on the rate alone
    (no rerun noise) would cover far less; a point covers nothing."""
    rng = np.random.default_rng(1)
    k, steps, trials, inside, widths = 4, 120, 300, 0, []

    def price(c):
        return price_per_token(_Costs(), "lookup", k, np.array([expected_committed_by_position(c.rates(), k)]),
                               np.array([c.proposing / c.steps]), 100.0)[0]

    for t in range(trials):
        traced = counts_from_steps(_simulate(rng, a, share, k, steps), k)
        draws = cost_ratio_draws(_Costs(), "lookup", k, traced, 100.0, uniforms(t, k))
        lo, hi = percentile_interval(draws, 1.0)
        rerun = counts_from_steps(_simulate(rng, a, share, k, steps), k)
        inside += lo <= price(rerun) / price(traced) <= hi
        widths.append(hi - lo)
    assert 0.90 <= inside / trials <= 0.99, inside / trials
    assert np.median(widths) > 0.02


def test_more_counts_narrow_the_interval_and_k_moves_together():
    few, many = Counts([10, 5], 20, 40), Counts([1000, 500], 2000, 4000)
    width = [np.subtract(*percentile_interval(cost_ratio_draws(_Costs(), "lookup", 2, c, 10.0, uniforms(0, 2)),
                                              1.0)[::-1]) for c in (few, many)]
    assert width[1] < width[0] / 5
    assert np.all(cost_ratio_draws(_Costs(), "lookup", 2, Counts([0], 0, 9), 10.0, uniforms(0, 2)) == 1.0)
    # the same uniform numbers for k = 1 and k = 2: a draw with a low first rate is low at both
    u = uniforms(3, 2)
    one = cost_ratio_draws(_Costs(), "lookup", 1, few, 10.0, u)
    two = cost_ratio_draws(_Costs(), "lookup", 2, few, 10.0, u)
    assert np.corrcoef(one, two)[0, 1] > 0.8


def test_speedup_draws_scale_only_the_steps():
    items = [{"new_tokens": 10, "plain_s": 1.0, "method_s": 0.6, "fixed_s": 0.1}]
    out = speedup_draws(items, [np.array([1.0, 2.0])])
    assert out == pytest.approx([1 / 0.6, 1 / 1.1])


# -- the profile's sampled step ------------------------------------------------------------
def test_profile_times_sampled_steps_and_older_profiles_fall_back(tiny, tmp_path):
    p = measure_profile(tiny, drafts=["lookup"], max_n=3, contexts=(16, 48), repeats=2, progress=False)
    assert set(p.step_sampled) == {16, 48} and all(len(v) == 3 for v in p.step_sampled.values())
    # a 2-token sampled step at context 30: linear between the sampled ones measured at 16 and 48
    at_16, at_48 = p.step_sampled[16][1], p.step_sampled[48][1]
    assert p.step_time(2, 30, sampled=True) == pytest.approx(at_16 + (at_48 - at_16) * (30 - 16) / (48 - 16))
    back = Profile.load(p.save(tmp_path / "p.json"))
    assert back.step_sampled == p.step_sampled
    old = p.to_dict()
    del old["step_sampled"]
    older = Profile.from_dict(old)
    assert older.step_time(2, 30, sampled=True) == older.step_time(2, 30)
    bad = p.to_dict()
    bad["step_sampled"] = {"16": [0.01]}
    with pytest.raises(ConfigError, match="step_sampled"):
        Profile.from_dict(bad)


def test_a_sampled_plan_is_priced_with_the_sampled_step(tiny):
    rows = [Question(1, "copy", (PROMPTS[0],))]
    prof = fake_profile(tiny)  # greedy: a step of n tokens costs 10 ms (1 + 0.05 (n - 1))
    prof.step_sampled = {c: [0.03] * len(v) for c, v in prof.step.items()}  # sampled: 30 ms, flat
    steps = [(2, 1), (0, 0)]
    # D(2) + step(3), then a look-up that found nothing: D(1) + step(1)
    want = prof.draft_time("lookup", 2) + prof.draft_time("lookup", 1) + 0.06
    assert predict_seconds(prof, "lookup", steps, 10, 0.0, 3, sampled=True) == pytest.approx(want)
    cfg = SamplingConfig(temperature=0.7, seed=3)
    sampled = make_plan(tiny, rows, prof, drafts=["lookup"], ks=[2], max_new_tokens=16, sampling=cfg)
    prof.step_sampled = {}
    fallback = make_plan(tiny, rows, prof, drafts=["lookup"], ks=[2], max_new_tokens=16, sampling=cfg)
    # a flat sampled step makes verifying 3 tokens cost what 1 does: break-even acceptance ~0
    assert sampled.categories["copy"][0].breakeven < 0.01 < fallback.categories["copy"][0].breakeven


# -- the plan and its validation -----------------------------------------------------------
def test_plan_intervals_roundtrip_and_validation_says_inside(tiny, tmp_path):
    rows = [Question(i, c, (t,)) for i, (c, t) in enumerate([("copy", PROMPTS[0]), ("copy", PROMPTS[1]),
                                                              ("free", PROMPTS[2])])]
    cheap = fake_profile(tiny, step=lambda n: 0.01)
    plan = make_plan(tiny, rows, cheap, drafts=["lookup"], ks=[1, 2, 4], max_new_tokens=24)
    lo, hi = plan.intervals["copy"]
    assert lo <= plan.predicted["copy"] <= hi and lo < hi  # a few dozen steps: not certain
    assert plan.routed_interval[0] <= plan.routed_overall <= plan.routed_interval[1]
    back = load_plan(plan.save(tmp_path / "plan.json"))
    assert back.intervals == plan.intervals and back.categories["copy"][0].interval == plan.categories["copy"][0].interval
    sure = make_plan(tiny, rows, fake_profile(tiny), drafts=["lookup"], ks=[1, 2], max_new_tokens=24, sure=True)
    for c, (d, _) in sure.recommended.items():
        assert d == "none" or sure.intervals[c][0] > 1.0
    v = validate_plan(tiny, plan, rows)
    cats = [x for x in v["checks"] if x["category"] in ("copy", "free")]
    assert all(x["inside"] == (x["interval"][0] <= x["measured"] <= x["interval"][1]) for x in cats)
    assert v["inside_share"] == sum(x["inside"] for x in cats) / len(cats)
    assert v["goals"]["inside"] == 0.8


def _runs(rng, k, steps, stay):
    """Steps that come in runs: each step repeats the last one's outcome (all k accepted, or
    none) with probability ``stay``, else flips a fair coin."""
    out, hit = [], rng.random() < 0.5
    for _ in range(steps):
        if rng.random() >= stay:
            hit = rng.random() < 0.5
        out.append((k, k if hit else 0))
    return out


def test_runs_of_hits_widen_the_interval_enough_to_hold_a_rerun():
    """Copying comes in runs, so steps are not independent trials: measured on the traces, the
    dispersion divides the counts, and the interval again holds a rerun about 95% of the time
    (without it, far less). Here rho = 0.9, so phi should be near 19."""
    rng = np.random.default_rng(2)
    k, steps, trials = 2, 160, 200
    inside = {1: 0, 0: 0}
    phis = []

    def price(c):
        return price_per_token(_Costs(), "lookup", k, np.array([expected_committed_by_position(c.rates(), k)]),
                               np.array([c.proposing / c.steps]), 100.0)[0]

    for t in range(trials):
        trace = _runs(rng, k, steps, stay=0.9)
        traced = counts_from_steps(trace, k)
        phi = dispersion([trace])
        phis.append(phi)
        again = price(counts_from_steps(_runs(rng, k, steps, stay=0.9), k)) / price(traced)
        for use in (1, 0):
            lo, hi = percentile_interval(
                cost_ratio_draws(_Costs(), "lookup", k, traced, 100.0, uniforms(t, k), phi=phi if use else 1.0), 1.0)
            inside[use] += lo <= again <= hi
    assert 10 < np.median(phis) < 30
    assert inside[1] / trials >= 0.88, inside
    assert inside[0] / trials < 0.75, inside
    assert dispersion([[(2, i % 3) for i in range(300)]]) < 1.5  # no runs: about 1


# -- timing noise, and where a validation's error comes from --------------------------------
def test_timing_noise_widens_an_interval_as_the_two_variances_add():
    """A measured speedup carries the stopwatch's noise as well as the continuations': with a
    unit's timing variance s2 over n units, the interval's log-width grows as the two variances
    add (the t draws are near normal at 6 degrees of freedom; hence the tolerance)."""
    items = [{"category": "c", "question_id": q, "sample": s, "new_tokens": 10, "plain_s": 1.0,
              "method_s": 0.5 + 0.02 * s} for q in (1, 2) for s in range(4)]
    per = {("lookup", 2): items}
    settings = [("lookup", 2)] * len(items)

    def log_width(timing: float) -> float:
        draws = Spread(None, per, ["c"], [2], True, bootstrap=True, timing=timing).draws(items, settings, "c")
        lo, hi = np.quantile(np.log(draws), [0.025, 0.975])
        return float(hi - lo)

    quiet, noisy = log_width(0.0), log_width(0.04)
    added = 2 * 1.96 * np.sqrt(0.04 / len(items))
    assert quiet < noisy == pytest.approx(np.hypot(quiet, added), rel=0.15)


def test_timing_spread_pairs_each_run_with_plain_on_the_same_unit():
    """A slow spell both runs of a unit share cancels: runs twice as slow as priced, plain too,
    carry no noise; a run that alone is slow on one unit does."""
    def unit(run: float, plain: float) -> dict:
        return {"runs": {"plain": {"measured_s": plain, "predicted_s": 1.0},
                         "lookup k=8": {"measured_s": run, "predicted_s": 1.0}}}

    assert timing_spread([unit(2.0, 2.0), unit(1.0, 1.0), unit(3.0, 3.0)]) == (0.0, 2)
    s2, df = timing_spread([unit(2.0, 1.0), unit(1.0, 1.0), unit(1.0, 1.0)])
    assert df == 2 and s2 == pytest.approx(np.var(np.log([2.0, 1.0, 1.0]), ddof=1))
    assert timing_spread([{"runs": {}}, {}]) == (0.0, 0)


def test_plan_keeps_its_timing_noise_and_greedy_validation_splits_the_error(tiny):
    """The plan measures the timing noise of its own runs; a greedy validation of an exact replay
    (lookup at a fixed k) measures the plan's tokens per pass exactly, so all of its error is
    price, and the two factors multiply to predicted / measured."""
    rows = [Question(i, "copy", (t,)) for i, t in enumerate(PROMPTS[:2])]
    plan = make_plan(tiny, rows, fake_profile(tiny), drafts=["lookup"], ks=[2], max_new_tokens=24, auto=False)
    s2, df = timing_spread(plan.prompts)
    assert plan.config["timing_df"] == df >= 1 and plan.config["timing_sd"] == round(s2 ** 0.5, 4)
    v = validate_plan(tiny, plan, rows)
    check = next(x for x in v["checks"] if x["category"] == "copy")
    assert check["mat_measured"] == pytest.approx(check["mat_predicted"], abs=1e-3) and check["mat_measured"] > 1
    assert check["acceptance_error"] == pytest.approx(0.0, abs=1e-3)
    whole = (1 + check["acceptance_error"]) * (1 + check["price_error"])
    assert whole == pytest.approx(check["predicted"] / check["measured"], rel=1e-3)
    assert all(len(u["counts"]) == 2 for u in v["units"])
