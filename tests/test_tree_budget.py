"""--k auto for scored trees: suffix decoding proposes its best-first tree and AdaptiveK keeps the
prefix of nodes with the most expected tokens per second (policy/adaptive.py)."""

from __future__ import annotations

import pytest
import torch

from draftwise.policy.adaptive import PRIOR_TOKENS, AdaptiveK
from draftwise.core.draft import Draft
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree


class _Costs:
    """A profile stand-in: ``step(n)`` seconds for a step feeding n tokens, free drafts."""

    def __init__(self, step, max_n=9):
        self.step, self.max_n = step, max_n

    def step_time(self, n, context=None, *, sampled=False):
        return self.step(n)

    def draft_time(self, draft, k):
        return 0.0


def _tree(scores):
    """A best-first tree: rows 1-2 a chain, then siblings of row 1, with the given scores."""
    parents = [0, 1, 0, 1, 2, 0][: len(scores)]
    tokens = list(range(10, 10 + len(scores)))
    return Draft(tokens, tree=TokenTree(tokens, parents), scores=tuple(scores))


def test_a_prefix_of_a_scored_tree_is_a_tree_and_scores_must_descend():
    d = _tree([0.9, 0.8, 0.3, 0.2, 0.1])
    p = d.prefix(3)
    assert p.tokens == [10, 11, 12] and list(p.tree.parents) == [0, 1, 0] and p.scores == (0.9, 0.8, 0.3)
    assert d.prefix(9) is d and d.prefix(0).tokens == []
    with pytest.raises(ValueError, match="descending"):
        Draft([1, 2], scores=(0.1, 0.5))
    with pytest.raises(ValueError, match="one per token"):
        Draft([1, 2], scores=(0.5,))


def test_trim_keeps_the_nodes_that_pay_for_their_place_in_the_pass():
    scores = [0.95, 0.9, 0.2, 0.1]
    gentle = AdaptiveK(_Costs(lambda n: 0.010 * (1 + 0.1 * (n - 1))), "suffix")
    # rate(n) = (1 + sum of the first n scores) / step(n + 1): 0.100, 0.177, 0.238, 0.235, 0.231
    assert len(gentle.trim(_tree(scores), 100)) == 2
    free = AdaptiveK(_Costs(lambda n: 0.010), "suffix")
    assert len(free.trim(_tree(scores), 100)) == 4
    steep = AdaptiveK(_Costs(lambda n: 0.012 * n), "suffix")  # n tokens cost 1.2 n plain steps
    assert steep.trim(_tree(scores), 100).tokens == []
    assert gentle.choose(100) == gentle.k_max == 8  # a tree draft proposes at the full budget
    wide = AdaptiveK(_Costs(lambda n: 0.010, max_n=16), "suffix")  # the profile's whole node range
    assert wide.k_max == 15 and len(wide.trim(_tree(scores), 100)) == 4
    wide.observe(4, 2)
    assert wide.rates()[0] > 0.5
    chain = AdaptiveK(_Costs(lambda n: 0.010), "lookup")
    assert chain.trim(_tree(scores), 100) is not None and len(chain.trim(_tree(scores), 100)) == 4  # untouched


def test_scores_that_overpromise_are_calibrated_down():
    # each node costs a quarter of a plain step: rate(n) at lam = 1 is 0.100, 0.156, 0.190, 0.174, ...
    policy = AdaptiveK(_Costs(lambda n: 0.010 * (1 + 0.25 * (n - 1))), "suffix")
    assert policy.calibration() == policy.calibration(4) == 1.0
    kept = []
    for _ in range(30):  # the draft promises ~1.85 tokens a step, the target accepts none
        d = policy.trim(_tree([0.95, 0.9, 0.2, 0.1]), 100)
        kept.append(len(d))
        if d.tokens:
            policy.observe(len(d), 0)
        else:  # trimmed to nothing: its best node is checked against the plain step's token
            policy.observe_shadow([10], [99])
    assert policy.calibration(4) < 0.25  # then a node (0.95 lam) no longer pays a quarter step
    assert kept[0] == 2 and kept[-1] == 0
    for _ in range(30):  # the draft turns right again: the shadow checks bring the trees back
        d = policy.trim(_tree([0.95, 0.9, 0.2, 0.1]), 100)
        if d.tokens:
            policy.observe(len(d), len(d))
        else:
            policy.observe_shadow([10], [10])
    assert len(policy.trim(_tree([0.95, 0.9, 0.2, 0.1]), 100)) >= 2


def _chain(scores):
    tokens = list(range(10, 10 + len(scores)))
    return Draft(tokens, tree=TokenTree(tokens, list(range(len(scores)))), scores=tuple(scores))


def test_each_size_of_tree_is_calibrated_on_its_own():
    """Short trees that over-promise are trimmed while long ones that deliver are kept: one
    ratio for both (the old calibration) would keep the short ones or cut the long ones."""
    policy = AdaptiveK(_Costs(lambda n: 0.010 * (1 + 0.25 * (n - 1))), "suffix")
    for _ in range(40):
        short = policy.trim(_chain([0.95, 0.9, 0.85, 0.8]), 100)  # from a short match: always wrong
        if short.tokens:
            policy.observe(len(short), 0)
        else:
            policy.observe_shadow([10], [99])
        long = policy.trim(_chain([0.95, 0.94, 0.93, 0.92, 0.91, 0.9, 0.89, 0.88]), 100)
        policy.observe(len(long), len(long))  # from a long match: always right
    assert policy.calibration(4) < 0.2 < 0.8 < policy.calibration(8)
    assert len(policy.trim(_chain([0.95, 0.9, 0.85, 0.8]), 100)) == 0
    assert len(policy.trim(_chain([0.95, 0.94, 0.93, 0.92, 0.91, 0.9, 0.89, 0.88]), 100)) == 8


def test_what_one_generation_learns_of_a_size_the_next_starts_from():
    from draftwise.policy.adaptive import TreeSizes

    costs = _Costs(lambda n: 0.010 * (1 + 0.25 * (n - 1)))
    shared = TreeSizes()
    first = AdaptiveK(costs, "suffix", tree_sizes=shared)
    for _ in range(40):
        short = first.trim(_chain([0.95, 0.9, 0.85, 0.8]), 100)
        if short.tokens:
            first.observe(len(short), 0)
        else:
            first.observe_shadow([10], [99])
        long = first.trim(_chain([0.95, 0.94, 0.93, 0.92, 0.91, 0.9, 0.89, 0.88]), 100)
        first.observe(len(long), len(long))
    fresh_alone = AdaptiveK(costs, "suffix")
    fresh_shared = AdaptiveK(costs, "suffix", tree_sizes=shared)
    assert len(fresh_alone.trim(_chain([0.95, 0.9, 0.85, 0.8]), 100)) > 0  # knows nothing yet
    assert len(fresh_shared.trim(_chain([0.95, 0.9, 0.85, 0.8]), 100)) == 0  # knows short trees fail
    assert len(fresh_shared.trim(_chain([0.95, 0.94, 0.93, 0.92, 0.91, 0.9, 0.89, 0.88]), 100)) == 8


def test_a_tree_the_batch_skips_still_teaches_its_size():
    policy = AdaptiveK(_Costs(lambda n: 0.010), "suffix")
    before = policy.calibration(4)
    for _ in range(10):
        assert policy.skip(_chain([0.9, 0.8, 0.7, 0.6])).tokens == []
        policy.observe_shadow([10], [99])  # its best node was wrong each time
    assert policy.calibration(4) < 0.5 * before and policy.calibration(8) < before


def test_the_suffix_draft_scores_its_tree_best_first():
    d = SuffixDrafter(nodes=8, depth=4)
    text = [5, 6, 7, 8, 5, 6, 9, 5, 6, 7, 8, 5, 6]
    d.start(text, SamplingConfig(), torch.Generator())
    draft = d.propose(text, 8)
    assert draft.tree is not None and draft.scores is not None and len(draft.scores) == len(draft)
    assert list(draft.scores) == sorted(draft.scores, reverse=True) and 0 < draft.scores[-1] <= draft.scores[0] <= 1
    assert sum(draft.scores) == pytest.approx(d.last.score)


def test_the_best_node_is_priced_apart_from_the_rest():
    """Trees whose best node the target always takes and whose deeper nodes it never does: the
    best node's price rises to 1 and the others' fall, so the policy keeps that one node (one
    ratio for every node priced it at a third and kept three nodes, two of which never deliver).
    The two factors average 1 as priced: lam alone carries the level."""
    policy = AdaptiveK(_Costs(lambda n: 0.010 * (1 + 0.25 * (n - 1))), "suffix")
    scores = [0.9, 0.85, 0.8, 0.75]
    for _ in range(60):
        d = policy.trim(_chain(scores), 100)
        if d.tokens:
            policy.observe(len(d), 1)
        else:
            policy.observe_shadow([10], [10])
    sizes = policy.tree_sizes
    first, rest = sizes.rank_factors(4)
    assert first > 1.1 and rest < 0.5
    assert sizes.rank_factors(8) == (1.0, 1.0)  # another size: nothing seen
    weights = [p + PRIOR_TOKENS for p in sizes.ranks_priced[4]]
    assert abs((weights[0] * first + weights[1] * rest) / sum(weights) - 1) < 1e-9
    nodes = policy.node_tokens(scores, 4)
    assert nodes[0] > 0.95 and max(nodes[1:]) < 0.4
    assert len(policy.trim(_chain(scores), 100)) == 1
