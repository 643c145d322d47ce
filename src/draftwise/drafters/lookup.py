"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's tail.

Costs almost nothing: an n-gram index updated incrementally as tokens are committed, so one step
is ``max_ngram - min_ngram + 1`` dictionary look-ups, whatever the context length.

With ``branches=B > 1`` the proposal is a token tree: the continuations of up to B earlier
occurrences of the matched n-gram (most recent first, each one that adds a node to the tree),
merged where they share a prefix, within k nodes. The index then also links each occurrence
to the one before it, so a step walks at most ``SCAN_PER_BRANCH * B`` occurrences.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftwise.core.draft import Capabilities, Draft
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree
from draftwise.errors import ConfigError

SCAN_PER_BRANCH = 8  # earlier occurrences looked at per wanted branch (repeats add nothing)


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

    def __init__(self, max_ngram: int, min_ngram: int, *, linked: bool = False) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.latest: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }
        # linked: earlier[n][e] = the end of the previous occurrence of the n-gram ending at e
        self.earlier: dict[int, dict[int, int]] | None = (
            {n: {} for n in self.latest} if linked else None
        )

    def extend(self, new: Sequence[int]) -> None:
        before = len(self.tokens)
        self.tokens.extend(new)
        # ends e in [before, len - 1] become indexable (each now has a continuation token)
        for e in range(max(before, 1), len(self.tokens)):
            for n in self.latest:
                if e >= n:
                    key = tuple(self.tokens[e - n : e])
                    if self.earlier is not None and key in self.latest[n]:
                        self.earlier[n][e] = self.latest[n][key]
                    self.latest[n][key] = e

    def match(self, k: int) -> list[int]:
        size = len(self.tokens)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            e = self.latest[n].get(tuple(self.tokens[size - n :]))
            if e is not None:
                return self.tokens[e : e + k]
        return []

    def continuations(self, k: int, branches: int) -> list[list[int]]:
        """Up to ``branches`` continuations (each up to k tokens) of the longest matching
        n-gram's earlier occurrences, most recent first, each adding a node to the tree of the
        ones before it (not a prefix of one of them). Needs ``linked=True``."""
        assert self.earlier is not None, "continuations() needs NgramIndex(..., linked=True)"
        size = len(self.tokens)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            e = self.latest[n].get(tuple(self.tokens[size - n :]))
            if e is None:
                continue
            paths: list[list[int]] = []
            for _ in range(SCAN_PER_BRANCH * branches):
                path = self.tokens[e : e + k]
                if not any(p[: len(path)] == path for p in paths):
                    paths.append(path)
                    if len(paths) == branches:
                        break
                e = self.earlier[n].get(e, -1)
                if e < 0:
                    break
            return paths
        return []


def merge_paths(paths: Sequence[Sequence[int]], k: int) -> TokenTree:
    """Continuations (best first) as one tree of at most k nodes that shares common prefixes.
    Nodes are added level by level, each level in the paths' order, so a better path is never
    cut shorter than a worse one and the first child at every node follows the best path.

    >>> t = merge_paths([[5, 6, 7], [5, 8], [9]], k=5)
    >>> t.tokens, t.parents      # 5 -> (6 -> 7, 8), and 9
    ([5, 9, 6, 8, 7], [0, 0, 1, 1, 3])
    """
    rows: dict[tuple[int, int], int] = {}  # (parent row, token) -> row
    tokens: list[int] = []
    parents: list[int] = []
    at = [0] * len(paths)  # the row each path has reached
    longest = max((len(p) for p in paths), default=0)
    for depth in range(longest):
        for i, path in enumerate(paths):
            if depth >= len(path):
                continue
            row = rows.get((at[i], path[depth]))
            if row is None:
                if len(tokens) == k:
                    return TokenTree(tokens, parents)
                tokens.append(path[depth])
                parents.append(at[i])
                row = rows[(at[i], path[depth])] = len(tokens)
            at[i] = row
    return TokenTree(tokens, parents)


class PromptLookupDrafter:
    """The n-gram / prompt-lookup draft (a point mass: it has no distribution)."""

    name = "lookup"

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1, branches: int = 1) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ConfigError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if branches < 1:
            raise ConfigError(f"lookup needs branches >= 1, got {branches}")
        self.max_ngram, self.min_ngram, self.branches = max_ngram, min_ngram, branches
        self.capabilities = Capabilities(trees=branches > 1, replay="exact", cost="host")
        self.index = self._new_index()

    def _new_index(self) -> NgramIndex:
        return NgramIndex(self.max_ngram, self.min_ngram, linked=self.branches > 1)

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.index = self._new_index()
        self.index.extend(prompt)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        seen = len(self.index.tokens)
        if len(context) < seen:
            raise ValueError("the context shrank: call start() for a new generation")
        self.index.extend(context[seen:])
        if self.branches == 1:
            return Draft(self.index.match(k))
        tree = merge_paths(self.index.continuations(k, self.branches), k)
        return Draft(tree.tokens, tree=tree) if len(tree) else Draft([])

    def observe(self, num_accepted: int) -> None:
        pass  # committed tokens arrive with the next context

    def end(self, output: Sequence[int] | None) -> None:
        pass  # nothing is kept across generations
