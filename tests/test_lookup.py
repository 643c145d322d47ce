"""Prompt lookup: the reference n-gram match, the incremental index against it, and its cost."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.drafters import Draft, NgramIndex, PromptLookupDrafter, find_ngram_match
from draftwise.errors import ConfigError
from draftwise.core.sampling import SamplingConfig

# -- the reference ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "k", "max_ngram", "min_ngram", "expected"),
    [
        # tail [7, 8] occurs at 1-2 and 4-5: the most recent earlier one (4-5) is followed by 9, 7
        ([1, 7, 8, 2, 7, 8, 9, 7, 8], 2, 2, 1, [9, 7]),
        ([1, 2, 3], 2, 3, 1, []),  # nothing repeats
        ([], 3, 3, 1, []),
        ([5], 3, 3, 1, []),  # a single token has no earlier occurrence
        ([5, 5], 3, 3, 1, [5]),  # the tail [5] occurred at 0, followed by the tail itself
        ([4, 5, 6, 4], 5, 3, 1, [5, 6, 4]),  # the continuation may run into the tail
        # a longer n wins over a more recent shorter match: [1, 2] at 0-1 beats [2] at 3
        ([1, 2, 9, 2, 8, 1, 2], 1, 2, 1, [9]),
        ([1, 2, 9, 2, 8, 1, 2], 1, 1, 1, [8]),  # with 1-grams only, the most recent 2 wins
        ([1, 2, 9, 2, 8, 3, 2], 2, 3, 2, []),  # min_ngram=2: the 1-gram match does not count
        ([3, 1, 2, 3, 1, 2], 4, 3, 3, [3, 1, 2]),  # k past the end: as many as exist
        ([3, 1, 2, 3, 1, 2], 0, 3, 1, []),  # k = 0
    ],
)
def test_find_ngram_match_cases(tokens, k, max_ngram, min_ngram, expected):
    assert find_ngram_match(tokens, k, max_ngram=max_ngram, min_ngram=min_ngram) == expected


# -- the index against the reference ----------------------------------------------------------


@st.composite
def lookup_cases(draw):
    alphabet = draw(st.integers(1, 4))  # small alphabets make repeats (and ties) common
    tokens = draw(st.lists(st.integers(0, alphabet - 1), max_size=40))
    min_ngram = draw(st.integers(1, 4))
    max_ngram = draw(st.integers(min_ngram, 5))
    k = draw(st.integers(0, 6))
    cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=6)))
    return tokens, k, max_ngram, min_ngram, cuts


@settings(max_examples=400, deadline=None)
@given(lookup_cases())
def test_index_fed_in_chunks_equals_the_reference(case):
    tokens, k, max_ngram, min_ngram, cuts = case
    index = NgramIndex(max_ngram, min_ngram)
    start = 0
    for end in [*cuts, len(tokens)]:  # chunks may be empty
        index.extend(tokens[start:end])
        start = end
        assert index.match(k) == find_ngram_match(
            tokens[:end], k, max_ngram=max_ngram, min_ngram=min_ngram
        ), tokens[:end]


@settings(max_examples=400, deadline=None)
@given(lookup_cases())
def test_a_proposal_continues_an_earlier_occurrence_of_the_tail(case):
    tokens, k, max_ngram, min_ngram, _ = case
    proposal = find_ngram_match(tokens, k, max_ngram=max_ngram, min_ngram=min_ngram)
    assert len(proposal) <= k
    if not proposal:
        return
    size = len(tokens)
    assert any(
        tokens[e - n : e] == tokens[size - n :] and tokens[e : e + len(proposal)] == proposal
        for n in range(min_ngram, max_ngram + 1)
        for e in range(n, size)  # e < size: an *earlier* occurrence, with a continuation
    )


@settings(max_examples=200, deadline=None)
@given(lookup_cases())
def test_drafter_follows_a_growing_context(case):
    tokens, k, max_ngram, min_ngram, cuts = case
    if not tokens:
        return
    drafter = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    first = max(1, cuts[0] if cuts else 1)
    drafter.start(tokens[:first], SamplingConfig(), torch.Generator())
    for end in [c for c in cuts if c >= first] + [len(tokens)]:
        draft = drafter.propose(tokens[:end], k)
        assert draft.probs is None  # a point mass
        expected = find_ngram_match(tokens[:end], k, max_ngram=max_ngram, min_ngram=min_ngram)
        assert draft.tokens == expected


def test_drafter_proposes_nothing_when_nothing_repeats():
    drafter = PromptLookupDrafter()
    drafter.start([10, 11, 12, 13], SamplingConfig(), torch.Generator())
    assert drafter.propose([10, 11, 12, 13, 14], 4) == Draft([])
    # and something once the tail repeats
    assert drafter.propose([10, 11, 12, 13, 14, 11], 4).tokens == [12, 13, 14, 11]


def test_drafter_start_forgets_the_previous_generation():
    drafter = PromptLookupDrafter()
    drafter.start([1, 2, 3, 1], SamplingConfig(), torch.Generator())
    assert drafter.propose([1, 2, 3, 1], 2).tokens == [2, 3]
    drafter.start([7, 8], SamplingConfig(), torch.Generator())
    assert drafter.propose([7, 8, 1], 2).tokens == []


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 0), (2, 3), (0, 0), (3, -1)])
def test_bad_ngram_sizes_raise(max_ngram, min_ngram):
    with pytest.raises(ConfigError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


# -- cost: work per step, not wall time ---------------------------------------------------------


class CountingDict(dict):
    """A dict that counts look-ups and writes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gets = 0
        self.sets = 0

    def get(self, key, default=None):
        self.gets += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.gets += 1
        return super().__getitem__(key)

    def __contains__(self, key):
        self.gets += 1
        return super().__contains__(key)

    def __setitem__(self, key, value):
        self.sets += 1
        super().__setitem__(key, value)


class CountingList(list):
    """A list that counts how many elements indexing and slicing read, and iterations."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = 0

    def __getitem__(self, item):
        out = super().__getitem__(item)
        self.read += len(out) if isinstance(item, slice) else 1
        return out

    def __iter__(self):
        self.read += len(self)
        return super().__iter__()


def _long_context(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_step_costs_a_few_lookups_whatever_the_context_length():
    """After indexing 8192 tokens, one propose() of one new token does (max - min + 1) writes
    per new token, at most (max - min + 1) look-ups, and reads O(max_ngram + k) tokens: no rescan."""
    max_ngram, min_ngram, k = 4, 1, 5
    sizes = max_ngram - min_ngram + 1
    context = _long_context(8192)
    drafter = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    drafter.start(context, SamplingConfig(), torch.Generator())
    index = drafter.index
    index.latest = {n: CountingDict(d) for n, d in index.latest.items()}
    index.tokens = CountingList(index.tokens)
    for step, new in enumerate([[7], [3, 9], [context[100]]]):
        context = context + new
        draft = drafter.propose(context, k)
        assert draft.tokens == find_ngram_match(context, k, max_ngram=max_ngram, min_ngram=min_ngram)
        gets = sum(d.gets for d in index.latest.values())
        sets = sum(d.sets for d in index.latest.values())
        assert gets <= sizes, (step, gets)
        assert sets <= sizes * len(new), (step, sets)
        assert index.tokens.read <= sizes * (max_ngram + len(new)) + max_ngram * sizes + k, (
            step,
            index.tokens.read,
        )
        for d in index.latest.values():
            d.gets = d.sets = 0
        index.tokens.read = 0
    assert draft.tokens  # the last step repeated a token of the context: a real match was found
