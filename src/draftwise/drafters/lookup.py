"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's tail.

Costs almost nothing: an n-gram index updated incrementally as tokens are committed, so one step
is ``max_ngram - min_ngram + 1`` dictionary look-ups, whatever the context length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ConfigError
from ..sampling import SamplingConfig
from .base import Draft


def find_ngram_match(tokens: Sequence[int], k: int, *, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The slow, obviously-correct reference that the index is tested against.

    Try n = max_ngram down to min_ngram: find the most recent earlier occurrence of the last n
    tokens and return up to k tokens that followed it; the first n that matches wins.

    >>> # tail [7, 8] occurred at positions 1-2 and 4-5; the most recent (4-5) is followed by 9, 7
    >>> find_ngram_match([1, 7, 8, 2, 7, 8, 9, 7, 8], k=2, max_ngram=2)
    [9, 7]
    >>> find_ngram_match([1, 2, 3], k=2)   # nothing repeats: no proposal
    []
    """
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        tail = list(tokens[n_tokens - n :])
        # an occurrence ending at e (exclusive) with e < n_tokens has a continuation
        for e in range(n_tokens - 1, n - 1, -1):
            if list(tokens[e - n : e]) == tail:
                return list(tokens[e : e + k])
    return []


class NgramIndex:
    """For each n, the latest end position of every n-gram seen in the context.

    ``latest[n][ngram] = e`` means ``tokens[e-n:e] == ngram`` and ``e`` is the largest such end
    below ``len(tokens)``: the context's own tail is never indexed, so a look-up finds the most
    recent *earlier* occurrence.
    """

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.latest: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }

    def extend(self, new: Sequence[int]) -> None:
        before = len(self.tokens)
        self.tokens.extend(new)
        # ends e in [before, len - 1] become indexable (each now has a continuation token)
        for e in range(max(before, 1), len(self.tokens)):
            for n in self.latest:
                if e >= n:
                    self.latest[n][tuple(self.tokens[e - n : e])] = e

    def match(self, k: int) -> list[int]:
        size = len(self.tokens)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            e = self.latest[n].get(tuple(self.tokens[size - n :]))
            if e is not None:
                return self.tokens[e : e + k]
        return []


class PromptLookupDrafter:
    """The n-gram / prompt-lookup draft (a point mass: it has no distribution)."""

    name = "lookup"

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ConfigError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index = NgramIndex(max_ngram, min_ngram)

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.index = NgramIndex(self.max_ngram, self.min_ngram)
        self.index.extend(prompt)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        seen = len(self.index.tokens)
        if len(context) < seen:
            raise ValueError("the context shrank: call start() for a new generation")
        self.index.extend(context[seen:])
        return Draft(self.index.match(k))

    def observe(self, num_accepted: int) -> None:
        pass  # committed tokens arrive with the next context
