"""The planner's replay knows trees: a tree draft's greedy steps at any node budget replay
exactly from the committed tokens, and a real tree run verifies trees (not a fallback chain)."""

from __future__ import annotations

import pytest

from draftwise.planner.replay import accepted_along, replay_lookup, replayable, trace_generation
from draftwise.drafters import make_drafter
from draftwise.core.draft import Capabilities, Draft
from draftwise.core.tree import TokenTree


def test_accepted_along_chain_and_tree() -> None:
    assert accepted_along(Draft([1, 2, 3]), [1, 2, 9, 9]) == 2
    assert accepted_along(Draft([1, 2]), [1]) == 1  # the truth ran out
    tree = TokenTree(tokens=[5, 7, 6, 8], parents=[0, 0, 1, 2])  # 5 -> 6, 7 -> 8
    assert accepted_along(Draft(tree.tokens, tree=tree), [7, 8, 1]) == 2  # the second branch
    assert accepted_along(Draft(tree.tokens, tree=tree), [5, 8]) == 1
    assert accepted_along(Draft(tree.tokens, tree=tree), [4]) == 0


def test_replayable_kinds() -> None:
    assert replayable("lookup") and replayable("suffix:nodes=8") and replayable("lookup:branches=3")
    assert not replayable("self") and not replayable("model:default")


@pytest.mark.parametrize("spec", ["suffix:nodes=8", "lookup:branches=3"])
def test_tree_replay_equals_the_real_run(tiny, spec) -> None:
    """Decode for real with a tree draft, then replay the committed tokens: the same
    (nodes, accepted) at every step. Two prompts in a row, so a suffix draft's cache of the
    first answer is used on the second, in the run and in the replay alike."""
    prompts = [tiny.encode_prompt("count: one two three one two three one two"),
               tiny.encode_prompt("again: one two three one two three")]
    real = make_drafter(spec, tiny)  # each drafter has its own cache
    replay = make_drafter(spec, tiny)
    for ids in prompts:
        trace = trace_generation(tiny, ids, real, 8, 40)
        assert replay_lookup(replay, ids, trace.tokens, 8, 40) == trace.steps
        # not vacuous: on each prompt some step proposed several nodes, none over the budget of 8
        assert max(m for m, _ in trace.steps) in range(2, 9)
        # each step committed its accepted tokens and one more: the prefill's token and the steps'
        # add up to what was committed (the last step may be cut short by the 40-token budget)
        committed = [a + 1 for _, a in trace.steps]
        assert 1 + sum(committed[:-1]) < len(trace.tokens) <= 1 + sum(committed)


class _TwoGuesses:
    """Proposes the same two sibling guesses, and a child of the second, every step."""

    name = "two-guesses"
    capabilities = Capabilities(trees=True)  # unscored trees

    def start(self, prompt, sampling, generator) -> None:
        pass

    def propose(self, context, k):
        tree = TokenTree(tokens=[7, context[-1], 9][:k], parents=[0, 0, 2][:k])  # within the budget
        return Draft(tree.tokens, tree=tree)

    def observe(self, num_accepted: int) -> None:
        pass

    def end(self, output) -> None:
        pass


def test_tree_pass_is_verified_as_a_tree_on_the_native_runtime(tiny) -> None:
    """A tree draft on the native runtime: every step is a tree pass (no chain fallback), the
    per-depth, per-rank trace adds up, and greedy output equals plain decoding."""
    from draftwise import generate

    ids = tiny.encode_prompt("a b c a b d a b c a b d a b")
    plain = generate(tiny, ids, max_new_tokens=30)
    res = generate(tiny, ids, max_new_tokens=30, draft=_TwoGuesses(), k=3)
    assert res.token_ids == plain.token_ids
    assert tiny.runtime.supports_trees
    st = res.stats
    # every tree pass verified the whole 3-node tree, but for at most one budget-capped 2-node one
    assert 3 * st.tree_passes - 1 <= st.tree_nodes <= 3 * st.tree_passes
    # a tree of depth 2 commits at most 3 tokens a pass; the last steps (budget 1, then 0) at most
    # 3 together: the 29 tokens after the prefill's need at least 9 tree passes
    assert 3 * st.tree_passes + 3 >= len(res.token_ids) - 1
    assert st.proposed - st.tree_nodes <= 1  # at most the last, budget-capped step was a chain
    assert st.rank_tested[0][0] == st.tree_passes  # the first guess is always tried
