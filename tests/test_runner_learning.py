"""bench's ``auto`` (issue 28, item 6): its learning drafters learn from every answer of the
method, whichever draft decoded it, as the standalone ``suffix`` learns every answer it decodes;
and it follows the plan exactly, a k of "auto" included."""

from __future__ import annotations

from draftwise.bench.methods import AUTO
from draftwise.bench.runner import Runner, build_methods, teach
from draftwise.drafters.factory import capabilities_of, make_drafter
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig


class Plan:
    recommended = {"copy": ("lookup", 3), "chat": ("suffix", 4), "plain": ("none", 0), "overall": ("suffix", 4)}


PROMPTS = ([5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 9, 10], [12, 13, 14, 15])


def test_auto_routed_to_lookup_still_teaches_its_suffix_drafter(tiny):
    runner = Runner(tiny, 8, SamplingConfig(), plan=Plan())
    auto = build_methods(tiny, AUTO, 4, ())[-1]
    alone = build_methods(tiny, "suffix", 4, ())[-1]  # the standalone method, for comparison
    first = runner.questions([auto], Question(1, "copy", ("Say a b c a b c.",)))["auto"][0]
    assert first.stats["draft"] == "lookup"
    cache = runner.auto_drafters[("auto", "suffix")].cache
    assert cache.generations() == [first.token_ids]  # learned, though lookup decoded it
    # as the standalone suffix method learns the same (greedy) answer it decodes itself
    runner.questions([alone], Question(1, "copy", ("Say a b c a b c.",)))
    assert alone.drafter.cache.generations() == cache.generations()
    # a timed run alone teaches nothing; plain decoding's answer and suffix's own are each learned once
    runner.turn(auto, PROMPTS[1], "copy")
    assert len(cache) == 1
    plain = runner.questions([auto], Question(2, "plain", ("Count to five.",)))["auto"][0]
    assert plain.stats["k"] == 0 and cache.generations()[-1] == plain.token_ids
    own = runner.questions([auto], Question(3, "chat", ("Name a colour.",)))["auto"][0]
    assert own.stats["draft"] == "suffix" and len(cache) == 3 and cache.generations()[-1] == own.token_ids
    # the lookup drafter learns nothing (it keeps nothing across generations) and is never taught
    assert not capabilities_of("lookup").learns


def test_teach_is_the_lifecycle_of_a_generation_that_proposed_nothing(tiny):
    drafter = make_drafter("suffix", tiny)
    teach(drafter, [5, 6, 7], [8, 9, 10, 8, 9], SamplingConfig())
    assert drafter.cache.generations() == [[8, 9, 10, 8, 9]]
    # what it learned, it proposes in a later generation whose context repeats the answer's start
    drafter.start([1, 2], SamplingConfig(), SamplingConfig().generator())
    assert drafter.propose([1, 2, 8, 9], 4).tokens[:1] == [10]
    drafter.end(None)


def test_auto_follows_a_plan_whose_k_is_auto(tiny, monkeypatch):
    seen = []

    def fake_policy(model, spec, k, *, capabilities=None):
        seen.append((str(spec), k))
        return 2

    monkeypatch.setattr("draftwise.bench.runner.policy_for", fake_policy)

    class AutoPlan:
        ks = [2, 4, "auto"]
        recommended = {"copy": ("lookup", "auto"), "overall": ("suffix", 4)}

    runner = Runner(tiny, 6, SamplingConfig(), plan=AutoPlan())
    auto = build_methods(tiny, AUTO, 4, ())[-1]  # the user's k is a number: the plan's k is followed
    r = runner.turn(auto, PROMPTS[0], "copy")
    assert seen == [("lookup", "auto")] and r.stats["k"] == "auto"
    r = runner.turn(auto, PROMPTS[1], "qa")  # a category the plan never saw: its overall pick
    assert seen[-1] == ("suffix", 4) and r.stats["plan_choice_for"] == "overall"
    # the user's --k auto does not override a plan that weighed the adaptive k against fixed ones
    user_auto = build_methods(tiny, "auto@k=auto", 4, ())[-1]
    runner.turn(user_auto, PROMPTS[1], "qa")
    assert seen[-1] == ("suffix", 4)
