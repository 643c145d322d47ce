"""The plan's fit of its profile to the decode loop (draftwise.cost.loop_fit)."""

import pytest

from draftwise.cost.loop_fit import fit_loop, fitted_profile
from draftwise.cost.profile import Profile
from draftwise.planner.replay import predict_seconds, price_parts

HYB = "suffix+eagle:default"


def profile() -> Profile:
    steps = {128: [0.016 + 0.0007 * i for i in range(12)], 1024: [0.020 + 0.0009 * i for i in range(12)]}
    return Profile("m", "f", "float32", "hf", forward=steps, step=steps,
                   drafts={"lookup": [0.0] * 12, HYB: [0.0015] * 12}, token_overhead=1e-4)


RUNS = {  # (draft, steps): a turn of 60 tokens each way
    "plain": ("none", [(0, 0)] * 59),
    "lookup k=8": ("lookup", [(8, 3), (0, 0), (4, 1)] * 10),
    f"{HYB} k=8": (HYB, [(8, 2), (3, 1)] * 12),
}


def turns(prof: Profile, plain: float, verify: float, head: float, n: int = 5) -> list[dict]:
    """``n`` prompts whose runs took what the loop would at these factors of the profile."""
    out = []
    for i in range(n):
        runs = {}
        for run, (draft, steps) in RUNS.items():
            parts = price_parts(prof, draft, steps, 100 + 50 * i, 0.05, 60)
            measured = parts[0] + plain * parts[1] + verify * parts[2] + head * parts[3]
            runs[run] = {"measured_s": measured, "predicted_s": sum(parts), "parts": list(parts)}
        out.append({"runs": runs})
    return out


def test_the_fit_recovers_the_factors_and_the_fitted_profile_prices_each_run_as_it_ran():
    prof = profile()
    fit = fit_loop(turns(prof, 0.9, 1.3, 1.6))
    assert fit["plain"] == pytest.approx(0.9, abs=1e-3)
    assert fit["verify"] == pytest.approx(1.3, abs=1e-3)
    assert fit["drafts"] == {HYB: pytest.approx(1.6, abs=1e-3)}
    fitted = fitted_profile(prof, fit)
    for run, (draft, steps) in RUNS.items():
        measured = turns(prof, 0.9, 1.3, 1.6, n=1)[0]["runs"][run]["measured_s"]
        assert predict_seconds(fitted, draft, steps, 100, 0.05, 60) == pytest.approx(measured, rel=1e-3)
    # the speedup a plan predicts moves with the loop: here verification costs more than profiled
    plain_s = predict_seconds(fitted, "none", RUNS["plain"][1], 100, 0.05, 60)
    look_s = predict_seconds(fitted, "lookup", RUNS["lookup k=8"][1], 100, 0.05, 60)
    raw = predict_seconds(prof, "none", RUNS["plain"][1], 100, 0.05, 60) / predict_seconds(
        prof, "lookup", RUNS["lookup k=8"][1], 100, 0.05, 60)
    assert plain_s / look_s < raw


def test_without_a_host_search_run_or_a_plain_run_the_fit_falls_back():
    prof = profile()
    data = turns(prof, 1.1, 1.1, 1.1)
    no_host = [{"runs": {k: v for k, v in t["runs"].items() if not k.startswith("lookup")}} for t in data]
    fit = fit_loop(no_host)  # extra rows take the plain factor; the head is fitted with it
    assert fit["verify"] == fit["plain"] == pytest.approx(1.1, abs=1e-3)
    assert fit["drafts"][HYB] == pytest.approx(1.1, abs=1e-3)
    assert fit_loop([{"runs": {k: v for k, v in t["runs"].items() if k != "plain"}} for t in data]) is None
    assert fitted_profile(prof, None) is prof
    wild = fit_loop(turns(prof, 0.9, 9.0, 1.0))  # a fit far out is clipped, the raw value kept
    assert wild["verify"] == 2.0 and wild["raw"]["verify"] == pytest.approx(9.0, abs=1e-2)
