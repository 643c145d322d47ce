"""Suffix decoding and lookup trees: the incremental suffix trie against a brute-force reference,
the drafter's proposals against a reference drafter, frequency order, budget and depth, the
global cache (eviction oldest first, off with cache=0, shared per model and spec), the spec
grammar with its one-line errors, and lookup's branches. No timing here: benchmarks/suffix_cost.py
measures the per-step cost."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import draftwise.drafters.suffix as suffix_module
from draftwise.drafters import Draft, DraftSpec, PromptLookupDrafter, find_ngram_match, make_drafter
from draftwise.drafters.lookup import NgramIndex, merge_paths
from draftwise.drafters.suffix import MAX_MATCH, SuffixCache, SuffixDrafter
from draftwise.drafters.suffix_trie import BRANCH, SuffixTrie, grow_tree
from draftwise.errors import ConfigError
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree

GREEDY, GEN = SamplingConfig(), torch.Generator()

# -- the slow, obviously-correct reference ------------------------------------------------------


def ref_children(seqs: Sequence[Sequence[int]], s: tuple[int, ...], limit: int) -> list[tuple[int, float, tuple[int, ...]]]:
    """Tokens that followed string ``s`` in ``seqs`` (strings of at most ``limit`` tokens):
    (token, count / continued occurrences, s + token), by count, then the most recent
    occurrence (later sequence, later position) first; the best BRANCH."""
    if len(s) >= limit:
        return []
    stats: dict[int, list] = {}
    for si, seq in enumerate(seqs):
        for i in range(len(seq) - len(s)):
            if tuple(seq[i : i + len(s)]) == s:
                t = seq[i + len(s)]
                entry = stats.setdefault(t, [0, (-1, -1)])
                entry[0] += 1
                entry[1] = max(entry[1], (si, i + len(s)))
    total = sum(c for c, _ in stats.values())
    order = sorted(stats, key=lambda t: (stats[t][0], stats[t][1]), reverse=True)[:BRANCH]
    return [(t, stats[t][0] / total, s + (t,)) for t in order]


def ref_count(seqs: Sequence[Sequence[int]], s: tuple[int, ...]) -> int:
    return sum(tuple(seq[i : i + len(s)]) == s for seq in seqs for i in range(len(seq) - len(s) + 1))


def ref_proposal(context, outputs, k, *, nodes, depth, factor, min_prob):
    """What SuffixDrafter should propose: the best-scoring of the local and global trees."""
    limit = MAX_MATCH + depth
    best = ([], [], 0.0)
    for seqs, longest in (([context], len(context) - 1), (outputs, len(context))):
        for n in range(min(MAX_MATCH, longest), 0, -1):
            s = tuple(context[len(context) - n :])
            if ref_children(seqs, s, limit):
                budget = min(k, nodes, math.ceil(factor * n - 1e-9))
                tokens, parents, probs = grow_tree(
                    s, lambda p, seqs=seqs: ref_children(seqs, p, limit),
                    budget=budget, max_depth=depth, min_prob=min_prob,
                )
                if tokens and sum(probs) > best[2]:
                    best = (tokens, parents, sum(probs))
                break
    return best[0], best[1]


def locate(trie: SuffixTrie, s: Sequence[int]):
    where = (trie.root, 0)
    for t in s:
        where = trie.step(where, t)
        if where is None:
            return None
    return where


def check_trie(trie: SuffixTrie, seqs: Sequence[Sequence[int]]) -> None:
    """Every substring (and some absent strings) against the reference: found iff it occurs,
    the same ranked children with the same frequencies, counts where a node keeps one."""
    limit = trie.max_depth
    strings = {tuple(seq[i : i + n]) for seq in seqs for n in range(1, limit + 1) for i in range(len(seq) - n + 1)}
    alphabet = sorted({t for seq in seqs for t in seq}) + [99]
    absent = {s + (t,) for s in list(strings)[:30] for t in alphabet} - strings
    for s in sorted(strings | absent):
        where = locate(trie, s) if len(s) <= limit else None
        if s not in strings:
            assert where is None, s
            continue
        assert where is not None, s
        got = [(t, round(p, 12)) for t, p, _ in trie.children(where)]
        want = [(t, round(p, 12)) for t, p, _ in ref_children(seqs, s, limit)]
        assert got == want, (s, got, want)
        if where[1] == 0 and hasattr(where[0], "total"):
            assert where[0].count == ref_count(seqs, s), s


# -- the trie against the reference -------------------------------------------------------------


@st.composite
def streams(draw, max_size=50):
    alphabet = draw(st.integers(1, 4))  # small alphabets: long repeats, ties, deep matches
    tokens = draw(st.lists(st.integers(0, alphabet - 1), max_size=max_size))
    cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=4)))
    return tokens, cuts


@settings(max_examples=150, deadline=None)
@given(streams(), st.integers(1, 6))
def test_trie_fed_in_chunks_equals_the_reference(case, limit):
    tokens, cuts = case
    trie = SuffixTrie(limit)
    seq = trie.new_seq()
    begin = 0
    for end in [*cuts, len(tokens)]:
        trie.extend(seq, tokens[begin:end])
        begin = end
        check_trie(trie, [tokens[:end]])


@settings(max_examples=100, deadline=None)
@given(st.lists(streams(max_size=25), min_size=1, max_size=5), st.integers(1, 5), st.integers(1, 3))
def test_a_cache_of_sequences_with_eviction_equals_the_reference(cases, limit, capacity):
    cache = SuffixCache(capacity, limit)
    for tokens, _ in cases:
        cache.add(tokens)
    kept = [tokens for tokens, _ in cases if tokens][-capacity:]
    assert cache.generations() == kept  # the oldest went first
    check_trie(cache.trie, kept)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=20, max_size=60), min_size=2, max_size=6), st.integers(1, 3))
def test_eviction_keeps_the_ranking_of_a_wide_fan_out(seqs, capacity):
    """Nodes with more than BRANCH children rank only their best BRANCH: a child outside that
    list may overtake one that lost counts to an eviction."""
    cache = SuffixCache(capacity, 3)
    for tokens in seqs:
        cache.add(tokens)
    check_trie(cache.trie, seqs[-capacity:])


def test_a_repeated_continuation_ranks_by_frequency_then_recency():
    a, b, c, d, e = 1, 2, 3, 4, 5
    trie = SuffixTrie(4)
    seq = trie.new_seq()
    trie.extend(seq, [a, b, c, 0, a, b, d, 0, a, b, c, 0, a, b, e, 0, a, b])
    # after "a b": c twice, then d and e once each, e more recently than d
    assert [(t, p) for t, p, _ in trie.children(locate(trie, [a, b]))] == [(c, 0.5), (e, 0.25), (d, 0.25)]


def test_grow_tree_is_best_first_within_budget_and_depth():
    kids = {
        "": [(1, 0.6, "1"), (2, 0.4, "2")],
        "1": [(3, 0.5, "13"), (4, 0.5, "14")],
        "2": [(5, 1.0, "25")],
        "13": [(6, 1.0, "136")], "14": [], "25": [(7, 1.0, "257")], "136": [], "257": [],
    }
    tokens, parents, probs = grow_tree("", kids.__getitem__, budget=5, max_depth=9, min_prob=0.0)
    assert tokens == [1, 2, 5, 7, 3] and parents == [0, 0, 2, 3, 1]  # 0.6, 0.4, 0.4, 0.4, 0.3
    assert grow_tree("", kids.__getitem__, budget=9, max_depth=1, min_prob=0.0)[0] == [1, 2]
    assert grow_tree("", kids.__getitem__, budget=9, max_depth=9, min_prob=0.35)[0] == [1, 2, 5, 7]
    assert grow_tree("", kids.__getitem__, budget=0, max_depth=9, min_prob=0.0)[0] == []


# -- the drafter ---------------------------------------------------------------------------------


@st.composite
def generations(draw):
    alphabet = draw(st.integers(2, 5))
    gens = []
    for _ in range(draw(st.integers(1, 4))):
        prompt = draw(st.lists(st.integers(0, alphabet - 1), max_size=20))
        output = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=40))
        gens.append((prompt, output))
    options = dict(
        nodes=draw(st.integers(1, 12)), depth=draw(st.integers(1, 5)),
        factor=draw(st.sampled_from([0.5, 1.0, 2.5])), min_prob=draw(st.sampled_from([0.0, 0.1, 0.3])),
    )
    steps = draw(st.lists(st.integers(1, 20), min_size=1, max_size=8))  # tokens per pass
    return gens, options, draw(st.integers(0, 3)), draw(st.integers(1, 16)), steps


@settings(max_examples=200, deadline=None)
@given(generations())
def test_proposals_equal_the_reference_drafter(case):
    gens, options, capacity, k, steps = case
    cache = SuffixCache(capacity, MAX_MATCH + options["depth"]) if capacity else None
    drafter = SuffixDrafter(cache=cache, **options)
    outputs: list[list[int]] = []
    for prompt, output in gens:
        drafter.start(prompt, GREEDY, GEN)
        ends, i = [0], 0
        while i < len(output):  # a pass commits 1..20 tokens (the drafter catches up at once)
            i = min(len(output), i + steps[len(ends) % len(steps)])
            ends.append(i)
        for i in ends:
            context = prompt + output[:i]
            draft = drafter.propose(context, k)
            want = ref_proposal(context, outputs[-capacity:] if capacity else [], k, **options)
            assert (draft.tokens, draft.tree.parents if draft.tree else []) == want, (context, outputs)
            if draft.tree is not None:
                assert draft.tokens == draft.tree.tokens
                assert len(draft.tree) <= min(k, options["nodes"]) and draft.tree.depth <= options["depth"]
                assert len(draft.tree) <= math.ceil(options["factor"] * drafter.last.match_len - 1e-9)
        drafter.end(output)  # a finished generation: its output joins the cache
        if capacity:
            outputs.append(list(output))


def test_a_tree_offers_the_frequent_continuation_first_and_the_rest_as_siblings():
    drafter = SuffixDrafter(nodes=8, depth=3, factor=4, cache=None)
    text = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3]
    drafter.start(text, GREEDY, GEN)
    tree = drafter.propose(text, 8).tree
    assert tree is not None and tree.tokens[0] == 4  # 4 followed "0 1 2 3" twice, 5 once
    assert [(tree.token(r), tree.children(r)) for r in tree.children(0)][1][0] == 5
    assert drafter.last.source == "local" and drafter.last.match_len == 4


def test_the_global_cache_teaches_the_next_generation_and_cache_0_turns_it_off():
    answer = [7, 8, 9, 10, 11, 12, 13, 14]
    for capacity, expect in ((4, answer[2:6]), (0, [])):
        cache = SuffixCache(capacity, MAX_MATCH + 4) if capacity else None
        drafter = SuffixDrafter(nodes=4, depth=4, factor=2, cache=cache)
        drafter.start([1, 2], GREEDY, GEN)
        drafter.propose([1, 2, *answer], 4)
        drafter.end(answer)  # the first output goes into the cache here
        drafter.start([3, 4], GREEDY, GEN)
        assert drafter.propose([3, 4, 7, 8], 4).tokens == expect
        assert (drafter.last.source == "global") == bool(capacity)


def test_end_adds_a_finished_output_once_and_a_cancelled_one_never():
    cache = SuffixCache(8, MAX_MATCH + 2)
    drafter = SuffixDrafter(depth=2, cache=cache)
    drafter.start([1], GREEDY, GEN)
    drafter.propose([1, 5, 6], 2)
    drafter.end([5, 6])
    drafter.end([5, 6])
    drafter.start([1], GREEDY, GEN)
    drafter.propose([1, 7], 2)
    drafter.end(None)  # cancelled
    drafter.start([1], GREEDY, GEN)
    drafter.propose([1, 8], 2)  # never ended
    drafter.start([1], GREEDY, GEN)
    assert cache.generations() == [[5, 6]]  # prompts are not cached


def test_the_context_may_not_shrink():
    drafter = SuffixDrafter(cache=None)
    drafter.start([1, 2, 3], GREEDY, GEN)
    with pytest.raises(ValueError, match="shrank"):
        drafter.propose([1, 2], 4)


def test_every_suffix_drafter_owns_its_cache(monkeypatch):
    model = SimpleNamespace(folder="/models/a", runtime=SimpleNamespace(max_context=512))
    one, two = make_drafter("suffix", model), make_drafter(DraftSpec.parse("suffix"), model)
    assert isinstance(one, SuffixDrafter) and one.cache is not None and two.cache is not None
    assert one.cache is not two.cache  # same model, same spec: still two owners, two caches
    assert make_drafter("suffix:cache=0", model).cache is None
    assert (one.nodes, one.depth, one.factor, one.min_prob) == (16, 8, 4.0, 0.1)
    with pytest.raises(ConfigError, match="over this model's context of 4 tokens"):
        make_drafter("suffix:depth=8", SimpleNamespace(folder="x", runtime=SimpleNamespace(max_context=4)))


# -- the spec grammar ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("suffix", "suffix"),
        ("suffix:nodes=16,depth=8,cache=64,factor=4,min_prob=0.1", "suffix"),
        (" suffix: depth=4, nodes=8 ", "suffix:nodes=8,depth=4"),
        ("suffix:cache=0", "suffix:cache=0"),
        ("suffix:factor=2.50,min_prob=0.05", "suffix:factor=2.5,min_prob=0.05"),
        ("lookup:branches=1", "lookup"),
        ("lookup:branches=3,max=4", "lookup:max=4,branches=3"),
    ],
)
def test_canonical_suffix_and_branch_specs(text, canonical):
    spec = DraftSpec.parse(text)
    assert str(spec) == canonical and DraftSpec.parse(canonical) == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("suffix:nodes=0", "suffix:nodes= takes a whole number >= 1"),
        ("suffix:depth=-2", "suffix:depth= takes a whole number >= 1"),
        ("suffix:nodes=300", "nodes=300 is out of range"),
        ("suffix:depth=1000", "depth=1000 is out of range"),
        ("suffix:cache=-1", "whole number >= 0"),
        ("suffix:cache=lots", "whole number >= 0"),
        ("suffix:factor=0", "factor= takes a number > 0"),
        ("suffix:min_prob=1", r"min_prob= takes a number in \[0, 1\)"),
        ("suffix:min_prob=nan", "min_prob="),
        ("suffix:width=3", "unknown suffix draft option"),
        ("suffix:nodes=4,nodes=5", "given twice"),
        ("suffix:cache=99999999", "use cache=[0-9]+ or less"),
        ("lookup:branches=0", "whole number >= 1"),
        ("suffix:nodes=" + "9" * 5000, "whole number"),
    ],
)
def test_bad_suffix_options_are_one_clear_line(text, needle):
    with pytest.raises(ConfigError, match=needle) as exc:
        DraftSpec.parse(text)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 200


def test_a_cache_that_cannot_fit_in_memory_is_refused(monkeypatch):
    monkeypatch.setattr(suffix_module, "physical_memory", lambda: 2**30)  # a 1 GiB machine
    fits = (2**30 // 2) // suffix_module.cache_bytes(1, 8)
    DraftSpec.parse(f"suffix:cache={fits}")
    with pytest.raises(ConfigError, match=f"use cache={fits} or less"):
        DraftSpec.parse(f"suffix:cache={fits + 1}")


def test_a_tree_draft_keeps_its_tokens_and_tree_together():
    tree = TokenTree([5, 6], [0, 0])
    assert Draft([5, 6], tree=tree).tree is tree and Draft([5]).tree is None
    with pytest.raises(ValueError, match="tree's tokens"):
        Draft([6, 5], tree=tree)


# -- lookup trees --------------------------------------------------------------------------------


def ref_continuations(tokens, k, branches, max_ngram, min_ngram):
    """The reference for NgramIndex.continuations: the longest matching n, its earlier
    occurrences most recent first, each continuation kept if it adds a node."""
    size = len(tokens)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = tokens[size - n :]
        ends = [e for e in range(size - 1, n - 1, -1) if tokens[e - n : e] == tail]
        if not ends:
            continue
        paths: list[list[int]] = []
        for e in ends[: 8 * branches]:
            path = tokens[e : e + k]
            if not any(p[: len(path)] == path for p in paths):
                paths.append(path)
                if len(paths) == branches:
                    break
        return paths
    return []


@settings(max_examples=300, deadline=None)
@given(streams(max_size=40), st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2))
def test_lookup_branches_make_a_proper_tree_of_distinct_continuations(case, k, branches, max_ngram, lo):
    tokens, _ = case
    min_ngram = max(1, max_ngram - lo)
    chain = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    tree_drafter = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram, branches=branches)
    for d in (chain, tree_drafter):
        d.start(tokens[:3], GREEDY, GEN)
    for end in range(3, len(tokens) + 1):
        context = tokens[:end]
        plain = chain.propose(context, k)
        assert plain.tree is None and plain.tokens == find_ngram_match(context, k, max_ngram=max_ngram, min_ngram=min_ngram)
        draft = tree_drafter.propose(context, k)
        paths = ref_continuations(context, k, branches, max_ngram, min_ngram)
        index = NgramIndex(max_ngram, min_ngram, linked=True)
        index.extend(context)
        assert index.continuations(k, branches) == paths
        if branches == 1:  # today's chain, unchanged
            assert draft == plain and (paths[0] if paths else []) == plain.tokens
            continue
        if not paths:
            assert draft.tokens == [] and draft.tree is None
            continue
        tree = draft.tree
        assert tree is not None and draft.tokens == tree.tokens and 1 <= len(tree) <= k
        for row in range(len(tree) + 1):  # siblings are distinct tokens
            kids = [tree.token(c) for c in tree.children(row)]
            assert len(set(kids)) == len(kids)
        for row in range(1, len(tree) + 1):  # every path is a prefix of a continuation
            path = [tree.token(r) for r in tree.path_to(row)[1:]]
            assert any(p[: len(path)] == path for p in paths)
        first, row = [], 0
        while tree.children(row):  # the first chain follows the most recent continuation (an
            row = tree.children(row)[0]  # older one that extends it may continue it)
            first.append(tree.token(row))
        common = min(len(first), len(plain.tokens))
        assert first[:common] == plain.tokens[:common] and (len(first) >= len(plain.tokens) or len(tree) == k)
        if len(tree) < k:  # room left: every continuation is in the tree whole
            leaves = {tuple(tree.token(r) for r in tree.path_to(x)[1:]) for x in range(1, len(tree) + 1)}
            assert all(tuple(p) in leaves for p in paths)


def test_merge_paths_shares_prefixes_and_stops_at_the_budget():
    t = merge_paths([[5, 6, 7], [5, 8], [9]], k=5)
    assert (t.tokens, t.parents) == ([5, 9, 6, 8, 7], [0, 0, 1, 1, 3])
    t = merge_paths([[5, 6, 7], [5, 8], [9]], k=3)
    assert (t.tokens, t.parents) == ([5, 9, 6], [0, 0, 1])
    assert len(merge_paths([], k=4)) == 0 and len(merge_paths([[1, 2]], k=0)) == 0


def test_lookup_branches_through_the_factory():
    drafter = make_drafter("lookup:branches=2", SimpleNamespace(folder="x"))
    assert isinstance(drafter, PromptLookupDrafter) and drafter.branches == 2
    text = [5, 1, 2, 3, 0, 5, 1, 2, 4, 0, 5, 1, 2]  # "5 1 2" went on with 3 0 .., then 4 0 ..
    drafter.start(text, GREEDY, GEN)
    draft = drafter.propose(text, 4)
    assert draft.tree is not None and (draft.tokens, draft.tree.parents) == ([4, 3, 0, 0], [0, 0, 1, 2])
    rng = random.Random(0)
    assert make_drafter("lookup", None).propose([rng.randrange(3) for _ in range(30)], 4).tree is None


# -- through the decode loop ----------------------------------------------------------------------


@pytest.mark.parametrize("draft", ["suffix", "suffix:cache=0,factor=1,nodes=4", "lookup:branches=3"])
def test_greedy_output_with_a_tree_draft_equals_plain_decoding(tiny, draft):
    from draftwise import generate

    prompt = "Repeat after me: one two three, one two three, one two three."
    plain = generate(tiny, prompt, max_new_tokens=24)
    drafter = make_drafter(draft, tiny)
    for _ in range(2):  # the second run learns from the first through the drafter's own cache
        out = generate(tiny, prompt, max_new_tokens=24, draft=drafter, k=6)
        assert out.token_ids == plain.token_ids
