"""The planner with several continuations per prompt, the adaptive k as a candidate, and the
bootstrap intervals (issue: the planner's recommendation must beat the simple choice)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.intervals import pooled_variance, rerun_draws, rerun_t_draws
from draftwise.planner.moderation import log_spreads
from draftwise.planner.plan import load_plan, make_plan
from draftwise.planner.plan_file import Plan
from draftwise.planner.replay import replay_lookup, trace_generation
from draftwise.planner.route import route
from draftwise.drafters import make_drafter
from draftwise.errors import ConfigError
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig
from .test_plan import PROMPTS, fake_profile


def _auto(profile):
    return AdaptiveK(profile, "lookup", k_max=6)


def test_replaying_the_adaptive_policy_takes_the_steps_a_real_run_took(tiny):
    """The replay proposes through the decode loop's own step (the policy's k, its shadow
    proposals), so replaying ``--k auto`` on a run's tokens gives that run's steps exactly."""
    profile = fake_profile(tiny, step=lambda n: 0.01 * (1 + 0.02 * (n - 1)))
    for text in PROMPTS:
        ids = tiny.encode_prompt(text)
        real = trace_generation(tiny, ids, make_drafter("lookup", tiny), _auto(profile), 40)
        replayed = replay_lookup(make_drafter("lookup", tiny), ids, real.tokens, _auto(profile), 40,
                                 eos_token_ids=tiny.eos_token_ids)
        assert replayed == real.steps
        assert len({m for m, _ in real.steps}) > 1 or len(real.steps) < 3  # the policy varied k


@pytest.mark.parametrize("k", [2, 5])
def test_on_a_sampled_continuation_a_point_mass_draft_is_accepted_exactly_where_it_matches(tiny, k):
    """With sampling, lookup's candidate is accepted exactly when the sampled token is it, so a
    sampled run's steps are the replay of its own tokens: why the plan replays every k and the
    adaptive policy on one sampled continuation."""
    for seed, text in enumerate(PROMPTS):
        ids = tiny.encode_prompt(text)
        cfg = SamplingConfig(temperature=0.9, seed=seed)
        real = trace_generation(tiny, ids, make_drafter("lookup", tiny), k, 40, sampling=cfg)
        assert replay_lookup(make_drafter("lookup", tiny), ids, real.tokens, k, 40,
                             eos_token_ids=tiny.eos_token_ids) == real.steps


def _rows():
    return [Question(i, c, (t,)) for i, (c, t) in enumerate([("copy", PROMPTS[0]), ("copy", PROMPTS[1]),
                                                              ("free", PROMPTS[2])])]


def test_a_sampled_plan_traces_several_continuations_and_bootstraps_them(tiny, tmp_path):
    profile = fake_profile(tiny)
    plan = make_plan(tiny, _rows(), profile, drafts=["lookup"], ks=[1, 3], max_new_tokens=20,
                     sampling=SamplingConfig(temperature=0.8), samples=3, auto=False)
    assert plan.config["samples"] == 3 and plan.config["seeds"] == [0, 1, 2]
    assert [(p["question_id"], p["sample"]) for p in plan.prompts] == [(q, s) for q in range(3) for s in range(3)]
    for cands in plan.categories.values():
        for c in cands:
            assert len(c.samples) == (9 if cands is plan.categories["overall"] else
                                      6 if c is plan.categories["copy"][0] or c in plan.categories["copy"] else 3)
            assert c.interval[0] <= c.speedup <= c.interval[1]
    # the continuations differ, so the draws spread (not one point)
    best = plan.categories["copy"][0]
    assert best.interval[1] - best.interval[0] > 0
    back = load_plan(plan.save(tmp_path / "plan.json"))
    assert back.categories["copy"][0].samples == best.samples and back.config["samples"] == 3


def test_samples_are_checked_and_greedy_has_one(tiny):
    with pytest.raises(ConfigError, match="--samples 0"):
        make_plan(tiny, _rows(), fake_profile(tiny), drafts=["lookup"], ks=[1], samples=0,
                  sampling=SamplingConfig(temperature=0.7))
    plan = make_plan(tiny, _rows()[:1], fake_profile(tiny), drafts=["lookup"], ks=[1], samples=4,
                     max_new_tokens=8, auto=False)
    assert plan.config["samples"] == 1 and len(plan.prompts) == 1


def _items(speedups_by_prompt):
    return [{"category": "c", "question_id": q, "new_tokens": 10, "plain_s": 1.0, "method_s": 1.0 / s}
            for q, ss in enumerate(speedups_by_prompt) for s in ss]


def test_rerun_draws_widen_with_the_spread_between_continuations():
    same = rerun_draws(_items([[1.5, 1.5, 1.5], [1.5, 1.5, 1.5]]), seed=1)
    assert np.allclose(same, 1.5)  # identical units: every rerun is the same
    prompts = rerun_draws(_items([[1.5, 1.5, 1.5], [1.2, 1.2, 1.2]]), seed=1)
    assert np.ptp(prompts) > 0  # prompts that differ: the plan's mean over them is uncertain
    lo_spread = np.ptp(np.quantile(rerun_draws(_items([[1.4, 1.5, 1.6], [1.2, 1.3, 1.1]]), seed=1), [0.025, 0.975]))
    hi_spread = np.ptp(np.quantile(rerun_draws(_items([[1.0, 1.5, 4.0], [1.2, 1.0, 2.5]]), seed=1), [0.025, 0.975]))
    assert 0 < lo_spread < hi_spread


def test_the_adaptive_k_is_a_candidate_and_a_plan_recommending_it_is_followed(tiny, tmp_path):
    plan = make_plan(tiny, _rows(), fake_profile(tiny), drafts=["lookup"], ks=[1, 2], max_new_tokens=20)
    assert "auto" in plan.ks and any(c.k == "auto" for c in plan.categories["overall"])
    auto = next(c for c in plan.categories["copy"] if c.k == "auto")
    assert auto.interval[0] <= auto.speedup <= auto.interval[1] and auto.breakeven is not None
    plan.recommended["copy"] = ("lookup", "auto")
    back = load_plan(plan.save(tmp_path / "plan.json"))
    assert back.recommended["copy"] == ("lookup", "auto")
    assert route(back, "copy", 3)[1] == "auto"  # the plan weighed auto: it is followed exactly
    fixed = next(c for c in back.recommended.items() if c[0] != "copy" and c[1][0] != "none")
    assert route(back, fixed[0], "auto")[1] == fixed[1][1]


def test_a_version_1_plan_still_loads(tiny, tmp_path):
    plan = make_plan(tiny, _rows()[:1], fake_profile(tiny), drafts=["lookup"], ks=[1], max_new_tokens=8, auto=False)
    data = plan.to_dict()
    data["schema"] = "draftwise.plan/1"
    del data["notes"]
    for cands in data["categories"].values():
        for c in cands:
            del c["samples"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_plan(tmp_path / "old.json")
    assert isinstance(old, Plan) and old.notes == {} and old.categories["overall"][0].samples is None
    data["schema"] = "draftwise.plan/9"
    (tmp_path / "new.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="schema 'draftwise.plan/9'"):
        load_plan(tmp_path / "new.json")


def test_a_multi_turn_question_is_planned_turn_by_turn_as_bench_runs_it(tiny):
    """Bench answers every turn, each answer in the next turn's history, and counts a question's
    tokens over its time: the plan traces every turn the same way and adds them up."""
    from draftwise import api
    from draftwise.bench.runner import build_prompt

    q = Question(7, "chat", (PROMPTS[0], "Now say it again, twice."))
    plan = make_plan(tiny, [q], fake_profile(tiny), drafts=["lookup"], ks=[2], max_new_tokens=12, auto=False)
    first = api.generate(tiny, build_prompt(tiny, q.turns[:1], []), max_new_tokens=12)
    second = api.generate(tiny, build_prompt(tiny, q.turns, [first.text]), max_new_tokens=12)
    assert plan.prompts[0]["turns"] == 2
    assert plan.prompts[0]["new_tokens"] == first.new_tokens + second.new_tokens
    assert plan.prompts[0]["equal"]
    # each turn's own lengths, which the goodput prediction sends as one request a turn
    assert plan.prompts[0]["turn_new_tokens"] == [first.new_tokens, second.new_tokens]
    assert plan.prompts[0]["turn_prompt_tokens"] == [len(build_prompt(tiny, q.turns[:1], [])),
                                                     len(build_prompt(tiny, q.turns, [first.text]))]


def test_a_choice_moves_from_the_default_only_by_more_than_the_planners_own_error():
    from draftwise.planner.pick import MARGIN, prefer, score_by
    from draftwise.planner.plan_file import Candidate

    def cand(k, speedup, lo=None):
        return Candidate("suffix", k, speedup, 2.0, None, None, None, interval=[lo or speedup, speedup + 0.1])

    auto = cand("auto", 1.80)
    close, far = cand(7, 1.80 * (1 + MARGIN) - 0.01), cand(7, 1.80 * (1 + MARGIN) + 0.01)
    assert prefer([close, auto], auto, score_by("point")) is auto  # the luckiest of close ones loses
    assert prefer([far, auto], auto, score_by("point")) is far
    assert prefer([far, auto], None, score_by("point")) is far  # no default: the top
    # ranked by the low end, the margin is on the low end
    assert prefer([cand(5, 2.5, lo=1.0), cand("auto", 1.6, lo=1.2)], cand("auto", 1.6, lo=1.2),
                   score_by("low")).k == "auto"


def test_a_category_interval_holds_a_rerun_of_s_new_continuations_95_percent_of_the_time():
    """13 categories, one prompt and S = 4 continuations each, log speedups spread by 10%
    (the sampled plan's median): the pooled-t interval must hold a rerun's mean about 95% of
    the time, where a bootstrap over one category's 4 units holds it far less often."""
    rng = np.random.default_rng(7)
    cats, s, sd, rounds = 13, 4, 0.10, 60
    held = {"t": 0, "bootstrap": 0}
    for r in range(rounds):
        centre = rng.uniform(1.1, 2.5, cats)
        plan = [[{"category": c, "question_id": c, "new_tokens": 96, "plain_s": 1.0, "method_s": 1.0 / u}
                 for u in centre[c] * np.exp(rng.normal(0, sd, s))] for c in range(cats)]
        spreads = log_spreads([x for units in plan for x in units])
        for c, units in enumerate(plan):
            rerun = (centre[c] * np.exp(rng.normal(0, sd, s))).mean()  # what --validate measures
            for name, draws in (("t", rerun_t_draws(units, spreads[c], seed=r * cats + c)),
                                ("bootstrap", rerun_draws(units, seed=r * cats + c))):
                lo, hi = np.quantile(draws, [0.025, 0.975])
                held[name] += bool(lo <= rerun <= hi)
    n = rounds * cats
    assert 0.91 <= held["t"] / n <= 0.99, held
    assert held["bootstrap"] / n < 0.88, held  # the test can tell a too-narrow interval (0.83 here)


def test_a_category_that_varies_more_than_the_others_gets_a_wider_interval():
    """13 categories at S = 8, three of which spread by 25% and the rest by 8%: the variance
    pooled over all of them holds a wide category's rerun well under 95% of the time; each
    category's variance moderated towards the others' holds it about 95% of the time, and
    still every category's overall."""
    rng = np.random.default_rng(11)
    cats, s, rounds = 13, 8, 60
    sds = np.array([0.25] * 3 + [0.08] * 10)
    held = {"pooled": [0, 0], "moderated": [0, 0]}  # [wide categories, all]
    for r in range(rounds):
        centre = rng.uniform(1.1, 2.5, cats)
        plan = [[{"category": c, "question_id": c, "new_tokens": 96, "plain_s": 1.0, "method_s": 1.0 / u}
                 for u in centre[c] * np.exp(rng.normal(0, sds[c], s))] for c in range(cats)]
        moderated = log_spreads([x for units in plan for x in units])
        pooled = pooled_variance([[np.log(x["plain_s"] / x["method_s"]) for x in units] for units in plan])
        for c, units in enumerate(plan):
            rerun = (centre[c] * np.exp(rng.normal(0, sds[c], s))).mean()
            for name, spread in (("pooled", pooled), ("moderated", moderated[c])):
                lo, hi = np.quantile(rerun_t_draws(units, spread, seed=r * cats + c), [0.025, 0.975])
                inside = bool(lo <= rerun <= hi)
                held[name][0] += inside and c < 3
                held[name][1] += inside
    wide, n = rounds * 3, rounds * cats
    assert held["pooled"][0] / wide < 0.80, held  # the test can tell the pooled interval's miss
    assert held["moderated"][0] / wide >= 0.88, held
    assert 0.91 <= held["moderated"][1] / n <= 0.995, held


def test_a_costlier_draft_must_beat_the_simple_choice_by_the_margin_in_each_category():
    """The default everywhere is the best adaptive k of a host-search draft (what a user types
    without a plan); the old rule defaulted each category to the overall pick, so a hybrid ahead
    overall by more than the margin kept categories where suffix predicted higher."""
    from draftwise.planner.pick import MARGIN, choose, score_by
    from draftwise.planner.plan_file import Candidate

    def c(draft, k, s):
        return Candidate(draft, k, s, 2.0, None, None, None)

    hyb, suf, look = "suffix+eagle:default", "suffix", "lookup"
    ranked = {
        "overall": [c(hyb, "auto", 1.80), c(suf, "auto", 1.70), c(look, "auto", 1.60)],
        "writing": [c(hyb, "auto", 1.70 * (1 + MARGIN) + 0.01), c(suf, "auto", 1.70)],
        "stem": [c(hyb, "auto", 1.70 * (1 + MARGIN) - 0.01), c(suf, "auto", 1.70)],
        "rag": [c(suf, "auto", 1.94), c(hyb, "auto", 1.90)],
        "translation": [c(look, 4, 2.20), c(suf, "auto", 1.60)],
    }
    picks = {cat: (p.draft, p.k) for cat, p in choose(ranked, score_by("point")).items()}
    assert picks == {"overall": (hyb, "auto"), "writing": (hyb, "auto"), "stem": (suf, "auto"),
                     "rag": (suf, "auto"), "translation": (look, 4)}
    # no host-search draft: the best adaptive k is the default, as before
    only = {"overall": [c(hyb, 8, 1.75), c(hyb, "auto", 1.70)], "math": [c(hyb, 8, 1.75), c(hyb, "auto", 1.70)]}
    assert {cat: p.k for cat, p in choose(only, score_by("point")).items()} == {"overall": "auto", "math": "auto"}
    # no adaptive k weighed: the overall top, and each category defaults to it
    fixed = {"overall": [c(suf, 6, 1.7), c(look, 4, 1.65)], "qa": [c(look, 4, 1.72), c(suf, 6, 1.70)]}
    assert {cat: (p.draft, p.k) for cat, p in choose(fixed, score_by("point")).items()} == {
        "overall": (suf, 6), "qa": (suf, 6)}
