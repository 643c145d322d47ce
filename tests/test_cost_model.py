"""One cost model and one timing estimator: every caller agrees with :mod:`draftwise.cost.formulas`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftwise.core.kpolicy
from draftwise.cost import timing
from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.formulas import (
    effective_acceptance,
    expected_committed,
    expected_committed_by_position,
    mean_rate_speedup,
    predicted_speedup,
    speedup,
    step_cost_ratio,
    tokens_per_second,
)
from draftwise.planner.pick import aggregate as _aggregate
from draftwise.cost.profile import Profile
from draftwise.errors import ConfigError
from draftwise.core.kpolicy import FixedK, KPolicy


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.0, 0.99), k=st.integers(0, 24))
def test_one_rate_by_position_is_the_closed_form(a, k):
    assert expected_committed_by_position([a], k) == pytest.approx(expected_committed(a, k), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.01, 0.98), k=st.integers(1, 16))
def test_effective_acceptance_inverts_e(a, k):
    assert effective_acceptance(expected_committed(a, k), k) == pytest.approx(a, abs=1e-6)


def test_speedup_forms_agree():
    # from times: E T(1) / (D + T(k+1)) is E over R = (D + T(k+1)) / T(1)
    t1, tk, d, a, k = 0.020, 0.023, 0.004, 0.7, 4
    e = expected_committed(a, k)
    assert predicted_speedup(e, t1, tk, d) == pytest.approx(speedup(a, k, (d + tk) / t1))
    assert speedup(a, k, step_cost_ratio(k, 0.05)) == pytest.approx(e / 1.2)
    assert tokens_per_second(e, 0.5) == pytest.approx(2 * e)
    with pytest.raises(ConfigError):
        predicted_speedup(e, 0.0, tk, d)
    with pytest.raises(ConfigError, match="acceptance a=nan"):
        expected_committed(float("nan"), 4)


def test_mean_rate_speedup_is_a_ratio_of_means_not_a_mean_of_ratios():
    assert mean_rate_speedup([30.0, 10.0], [10.0, 10.0]) == 2.0  # the mean of ratios would be 2.0 too
    assert mean_rate_speedup([40.0, 20.0], [10.0, 20.0]) == pytest.approx(2.0)  # ratios 4 and 1 average 2.5
    per_prompt = [{"new_tokens": 10, "plain_s": 1.0, "method_s": 0.25}, {"new_tokens": 20, "plain_s": 1.0, "method_s": 1.0}]
    assert _aggregate(per_prompt) == pytest.approx((40 + 20) / (10 + 20))
    with pytest.raises(ConfigError):
        mean_rate_speedup([], [])


def _profile(step, drafts) -> Profile:
    return Profile(model="m", fingerprint="0" * 16, dtype="float32", runtime="NativeRuntime",
                   forward={64: step, 512: [2 * t for t in step]}, step={64: step, 512: [2 * t for t in step]},
                   drafts=drafts)


def test_adaptive_k_rate_is_the_cost_model():
    step = [0.010 * (1 + 0.1 * n) for n in range(9)]
    prof = _profile(step, {"self": [0.003 * k for k in range(1, 9)]})
    policy = AdaptiveK(prof, "self", k_max=6)
    for proposed, accepted in [(6, 6), (6, 2), (6, 4), (3, 0), (6, 5)]:
        policy.observe(proposed, accepted)
    rates = policy.rates()
    for k in range(0, 7):
        ctx = 200
        cost = prof.step_time(k + 1, ctx) + (prof.draft_time("self", k) if k else 0.0)
        e = 1.0
        for j in range(k):  # E by hand: 1 + a0 + a0 a1 + ...
            prod = 1.0
            for i in range(j + 1):
                prod *= rates[i]
            e += prod
        assert policy.expected_rate(k, ctx) == pytest.approx(e / cost, rel=1e-12)
    best = max(range(7), key=lambda k: policy.expected_rate(k, 200))
    assert policy.choose(200) == best


def test_kpolicy_module_holds_the_protocol_and_fixed_k():
    assert not hasattr(draftwise.core.kpolicy, "AdaptiveK")  # adaptive k lives with the cost model
    assert isinstance(FixedK(3), KPolicy) and FixedK(3).choose(10) == 3
    prof = _profile([0.01] * 9, {"lookup": [1e-5] * 8})
    assert isinstance(AdaptiveK(prof, "lookup"), KPolicy)
    with pytest.raises(ConfigError, match="k=0"):
        FixedK(0)


# -- the timing estimator -----------------------------------------------------------------
def test_fast_half_mean_ignores_the_slow_half():
    assert timing.fast_half_mean([1.0, 1.0, 1.0, 100.0]) == 1.0
    assert timing.fast_half_mean([3.0, 1.0, 2.0]) == 1.5  # the faster ceil(3/2) = 2
    assert timing.fast_half_mean([5.0]) == 5.0
    with pytest.raises(ConfigError):
        timing.fast_half_mean([])


class _FakeRuntime:
    length = 0

    def prefill(self, ids):
        pass


def test_time_forward_uses_the_fast_half_mean(monkeypatch):
    seen = iter([50.0, 4.0, 1.0, 9.0, 2.0])  # the first pass warms up and is dropped
    monkeypatch.setattr(timing, "time_pass", lambda *args, **kwargs: next(seen))
    # fast half of [4, 1, 9, 2] is [1, 2]: 1.5 (the median would be 3.0)
    assert timing.time_forward(_FakeRuntime(), 1, repeats=4) == 1.5
    with pytest.raises(ConfigError, match="repeats=0"):
        timing.time_forward(_FakeRuntime(), 1, repeats=0)
