"""The validation's unit is the plan's (issue 28, item 3): several seeds per prompt, none the
plan traced, each (prompt, seed) one unit of the mean tokens/s; the measurement's own noise
(round 1 against round 2); k="auto" settings run a fresh adaptive policy per generation."""

from __future__ import annotations

import statistics

import pytest

from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.formulas import mean_rate_speedup
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.planner.report import validation_summary
from draftwise.planner.validate import unit_speedup, validate_plan
from draftwise.errors import ConfigError
from draftwise.questions import Question

from .test_plan import PROMPTS, fake_profile

ROWS = [Question(1, "copy", (PROMPTS[0],)), Question(2, "copy", (PROMPTS[1],)), Question(3, "free", (PROMPTS[2],))]


def _cand(k, speedup, interval):
    return Candidate(draft="lookup", k=k, speedup=speedup, mat=1.5, acceptance=0.5, effective_acceptance=0.5,
                     breakeven=0.1, interval=interval, samples=[speedup] * 4)


def hand_plan(model, *, temperature=0.7, samples=2, seeds=(10_000, 10_002), copy_k=2) -> Plan:
    """A plan made by hand: copy -> lookup at ``copy_k``, free -> plain decoding."""
    copy = [_cand(copy_k, 1.3, [1.1, 1.6]), _cand("auto" if copy_k != "auto" else 2, 1.2, [1.0, 1.5])]
    overall = [_cand(2, 1.2, [1.0, 1.4]), _cand("auto", 1.25, [1.05, 1.5])]
    return Plan(
        model=model.name, fingerprint="-", dtype="float32", greedy=temperature == 0, drafts=["lookup"],
        ks=[2, "auto"], categories={"copy": copy, "free": [_cand(2, 0.9, [0.8, 1.0])], "overall": overall},
        recommended={"copy": ("lookup", copy_k), "free": ("none", 0), "overall": ("lookup", 2)},
        predicted={"copy": 1.3, "free": 1.0, "overall": 1.2}, routed_overall=1.15,
        intervals={"copy": [1.1, 1.6], "free": [1.0, 1.0], "overall": [1.0, 1.4]}, routed_interval=[1.0, 1.3],
        config={"temperature": temperature, "max_new_tokens": 12, "samples": samples, "seeds": list(seeds)},
    )


def test_sampled_validation_measures_each_prompt_with_seeds_the_plan_did_not_use(tiny):
    plan = hand_plan(tiny)
    v = validate_plan(tiny, plan, ROWS, repeats=2)
    assert v["seeds"] == 2 and v["repeats"] == 2 and v["notes"] == []
    routed = [u for u in v["units"] if u["recommended"]]
    # one routed unit per (prompt, seed): 3 prompts x 2 seeds, free's decoded plainly
    assert len(routed) == 6 and sum(u["draft"] == "none" for u in routed) == 2
    seeds = [u["seed"] for u in routed]
    assert len(set(seeds)) == 6 and not set(seeds) & {10_000, 10_002}  # the plan's own are skipped
    for u in v["units"]:
        assert len(u["plain"]) == len(u["method"]) == 2 and all(x > 0 for x in u["plain"] + u["method"])
    # the measured speedup is the best of each unit's repeats, each (prompt, seed) one unit
    copy = next(x for x in v["checks"] if x["category"] == "copy")
    mine = [u for u in routed if u["category"] == "copy"]
    assert copy["units"] == 4 and copy["prompts"] == 2
    assert copy["measured"] == pytest.approx(mean_rate_speedup([max(u["method"]) for u in mine],
                                                               [max(u["plain"]) for u in mine]))
    # the noise: the same speedup from round 1 alone against round 2 alone
    s1 = mean_rate_speedup([u["method"][0] for u in mine], [u["plain"][0] for u in mine])
    s2 = mean_rate_speedup([u["method"][1] for u in mine], [u["plain"][1] for u in mine])
    assert copy["noise"] == pytest.approx(abs(s1 - s2) / ((s1 + s2) / 2))
    assert v["median_noise"] == pytest.approx(statistics.median(x["noise"] for x in v["checks"]))
    routed_check = next(x for x in v["checks"] if x["category"] == "overall (routed)")
    assert routed_check["measured"] == pytest.approx(unit_speedup(routed)) and routed_check["units"] == 6
    # free is decoded plainly: no check of its own, and its units count plain against plain
    assert [x["category"] for x in v["checks"]] == ["copy", "overall (routed)"]
    assert v["median_width"] == pytest.approx(0.5)  # copy's [1.1, 1.6]; plain decoding has no interval
    assert v["below_097"] == (["copy"] if copy["measured"] < 0.97 else [])
    assert v["inside_share"] == float(1.1 <= copy["measured"] <= 1.6)


def test_seeds_default_to_the_plans_samples_and_greedy_uses_one(tiny):
    v = validate_plan(tiny, hand_plan(tiny, samples=3), ROWS[:1])
    assert v["seeds"] == 3 and len({u["seed"] for u in v["units"]}) == 3
    old = hand_plan(tiny)
    del old.config["samples"], old.config["seeds"]  # a plan from before continuations per prompt
    assert validate_plan(tiny, old, ROWS[:1])["seeds"] == 1
    greedy = validate_plan(tiny, hand_plan(tiny, temperature=0.0), ROWS[:1], seeds=3)
    assert greedy["seeds"] == 1 and len(greedy["units"]) == 1 and greedy["units"][0]["seed"] is None
    assert "seeds=3 at temperature 0" in greedy["notes"][0]
    # the median-error goal: 5% greedy, 10% sampled (issue 28), and the summary says which
    assert greedy["goals"]["median"] == 0.05 and v["goals"]["median"] == 0.10
    assert "(goal <= 5%)" in validation_summary(greedy) and "(goal <= 10%)" in validation_summary(v)
    assert validate_plan(tiny, hand_plan(tiny), ROWS[:1], repeats=1)["median_noise"] is None
    with pytest.raises(ConfigError, match="seeds=0"):
        validate_plan(tiny, hand_plan(tiny), ROWS[:1], seeds=0)


def test_auto_k_runs_a_fresh_adaptive_policy_for_every_generation(tiny, monkeypatch):
    made = []

    class Counting(AdaptiveK):
        chosen = 0

        def choose(self, context_len):
            self.chosen += 1
            return super().choose(context_len)

    def fake_policy_for(model, draft, k, *, capabilities=None):  # the real one measures a profile
        if k != "auto":
            return k
        made.append(Counting(fake_profile(model), str(draft), capabilities=capabilities))
        return made[-1]

    monkeypatch.setattr("draftwise.planner.validate.policy_for", fake_policy_for)
    plan = hand_plan(tiny, copy_k="auto")
    v = validate_plan(tiny, plan, ROWS[:2], extra=[("lookup", "auto"), ("lookup", 2)], seeds=2, repeats=2)
    # copy's pick and the extra setting are one: 2 prompts x 2 seeds x 2 repeats generations
    assert len(made) == 8 and len({id(p) for p in made}) == 8
    assert all(p.chosen > 0 for p in made)  # each chose the k of its own generation's steps
    assert {(x["category"], x["k"]) for x in v["checks"]} == {("copy", "auto"), ("overall (routed)", None),
                                                              ("overall", "auto"), ("overall", 2)}
    assert {u["setting"] for u in v["units"]} == {"lookup k=auto", "lookup k=2"}
