"""The served step (:mod:`draftwise.cost.served`, measured by :mod:`draftwise.server.served_profile`):
its fit, its file, how it prices a step, and its measurement on the server's own worker."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from draftwise.capacity.simulate import predict, workload_from_rates
from draftwise.cost.goodput import StepCost
from draftwise.cost.served import ServedProfile, StepSample, fit_outside, fit_pass_scale, served_profile
from draftwise.errors import ConfigError
from draftwise.questions import Question

from .test_goodput import pass_profile


def _samples(bp: Any, scale: dict[int, float], step: float, plain: float, spec: float) -> list[StepSample]:
    """Steps whose passes cost ``scale[B]`` x the profile's and whose outside is the given line."""
    out = []
    for b, f in scale.items():
        for s in range(b + 1):  # s of the b sequences speculated at 3 rows each
            rows = (b - s) + 4 * s
            price = bp.pass_time(b, rows, 300.0)
            out += [StepSample(b, rows, 0, 300 * b, price * f, step + plain * (b - s) + spec * s + 0.0002 * s,
                               b - s, s, 0.0002 * s)] * 3
    return out


def test_the_fit_recovers_the_step_the_plain_and_the_speculating_price():
    bp = pass_profile(0.010, 0.004)
    samples = _samples(bp, {1: 1.3, 4: 1.2, 16: 1.1}, 0.003, 0.0015, 0.004)
    step, plain, spec = fit_outside(samples)
    assert (step, plain, spec) == pytest.approx((0.003, 0.0015, 0.004), rel=1e-6)  # the drafts taken out
    assert fit_pass_scale(samples, bp) == pytest.approx({1: 1.3, 4: 1.2, 16: 1.1})


def test_a_negative_coefficient_is_noise_and_is_refitted_without():
    rows = [StepSample(n, n, 0, 0, 0.01, 0.0005 * n, n, 0) for n in (1, 2, 4, 8)]
    rows += [StepSample(1, 4, 0, 0, 0.01, 0.0001, 0, 1)]  # speculating cheaper than the line: below 0
    step, plain, spec = fit_outside(rows)
    assert min(step, plain, spec) >= 0.0
    with pytest.raises(ConfigError, match="no served steps"):
        fit_outside([])


def test_the_profile_scales_the_passes_and_prices_the_step_outside_them(tmp_path):
    bp = pass_profile(0.010, 0.004)
    bp.created = "then"
    samples = _samples(bp, {1: 1.5, 2: 1.4, 4: 1.2}, 0.002, 0.001, 0.003)
    served = served_profile(samples, bp, batches=[1, 2, 4])
    assert served.scale(3) == pytest.approx(1.3) and served.scale(16) == pytest.approx(1.2)  # past: the last
    scaled = served.apply(bp)
    assert scaled.pass_time(2, 2, 128) == pytest.approx(1.4 * bp.pass_time(2, 2, 128))
    served.save(tmp_path / "s.json")
    assert ServedProfile.load(tmp_path / "s.json") == served
    with pytest.raises(ConfigError, match="measure it again"):
        served.apply(dataclasses.replace(bp, created="another"))
    cost = StepCost.served_from(bp, None, served)
    assert cost.overhead(0, 100) == pytest.approx(0.001) and cost.overhead(3, 100) == pytest.approx(0.004)
    assert cost.seconds(2, 2, 128, 0.0, 2) == pytest.approx(1.4 * bp.pass_time(2, 2, 128) + 0.002)
    assert StepCost.served_from(bp, None, None).served is None


def test_a_plan_priced_as_served_predicts_less_than_the_passes_alone():
    """Plain batching, predicted by the passes alone and by the served step: the served step costs
    its passes' scale and its seconds outside them, and nothing else changes."""
    bp = pass_profile(0.010, 0.004)
    served = ServedProfile(model="m", fingerprint=bp.fingerprint, machine_fingerprint="x", dtype="float32",
                           batches=[1, 4], pass_scale={1: 1.0, 4: 1.0}, step_seconds=0.0, per_plain=0.0,
                           per_speculating=0.0)
    w = workload_from_rates({"qa": {"lookup": [0.6, 0.5]}}, k_max=2)
    same = predict(w, StepCost.served_from(bp, None, served), [1, 4], names=[])
    alone = predict(w, StepCost(bp), [1, 4], names=[])
    assert [r["policies"]["plain"]["aggregate_tps"] for r in same["rows"]] == pytest.approx(
        [r["policies"]["plain"]["aggregate_tps"] for r in alone["rows"]])
    slower = dataclasses.replace(served, pass_scale={1: 1.25, 4: 1.25}, step_seconds=0.002)
    priced = predict(w, StepCost.served_from(bp, None, slower), [1, 4], names=[])
    for a, b, n in zip(alone["rows"], priced["rows"], (1, 4)):
        t_pass = bp.pass_time(n, n, 64 + 64)  # about: one plain step's pass at the mean context
        ratio = a["policies"]["plain"]["aggregate_tps"] / b["policies"]["plain"]["aggregate_tps"]
        assert 1.25 < ratio < (1.25 * t_pass + 0.002) / t_pass + 0.05


def test_the_served_step_is_measured_on_the_server_s_own_worker(tiny, tmp_path):
    pytest.importorskip("fastapi")
    from draftwise.cost.batch_profile import machine_fingerprint
    from draftwise.cost.profile import Profile, model_fingerprint
    from draftwise.server import served_profile as measure

    fp = model_fingerprint(tiny)
    bp = pass_profile(0.010, 0.004)
    bp.model, bp.fingerprint, bp.machine_fingerprint, bp.created = tiny.name, fp, machine_fingerprint(), "now"
    profile = Profile(model=tiny.name, fingerprint=fp, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9}, step={128: [0.0105] * 9}, drafts={"lookup": [1e-4] * 8})
    pool = [Question(1, "qa", ("Count: one two three one two three",)), Question(2, "qa", ("Say a b c a b c",))]
    lines: list[str] = []
    served = measure.resolve_served_profile(tiny, bp, profile, batches=[1, 2], path=tmp_path / "served.json",
                                            question_ids=[1, 2], pool=pool, max_tokens=12, status=lines.append)
    assert served.steps > 0 and set(served.pass_scale) <= {1, 2} and served.pass_scale
    assert all(v > 0 for v in served.pass_scale.values())
    assert served.settings["draft"] == "lookup" and served.settings["draft_seconds"] == pytest.approx(profile.draft_time("lookup", 3))
    assert tiny.runtime.slots == 1  # the engine's slots are given back
    assert any("served step:" in line for line in lines)
    # cached: read back without serving again, and measured again for another batch profile
    again = measure.resolve_served_profile(tiny, bp, profile, batches=[1, 2], path=tmp_path / "served.json",
                                           measure=False)
    assert again == served
    with pytest.raises(ConfigError, match="measure one first"):
        measure.resolve_served_profile(tiny, dataclasses.replace(bp, created="later"), profile, batches=[1, 2],
                                       path=tmp_path / "served.json", measure=False)
