"""A bounded-depth suffix trie with counts, updated one token at a time (SuffixDecoding's index).

The trie holds every substring of length <= ``max_depth`` (L) of every sequence added to it.
``count`` of a node is how many start positions spell its string; ``total`` is how many of those
continue (sum of the children's counts), so ``child.count / node.total`` is how often that
continuation followed the node's string. Example, with one sequence ``a b c a b d``::

    root -a(2)- b(2) -c(1)...      after "a b", c followed once and d once:
                     -d(1)          P(c | a b) = P(d | a b) = 1/2

Complexity (n = tokens held, L = max_depth, B = BRANCH):

- ``append``: O(A * B) where A <= L is how many suffixes of the sequence so far are *repeated*
  strings (novel text: A is the length of the longest repeated suffix, a few tokens). A suffix
  that is unique sits in its own *leaf*: a count-1 node that points into the sequence instead of
  holding children, so its later tokens cost nothing (SuffixDecoding's path compression, applied
  to the count-1 tails, where it saves the most). Independent of n.
- ``children``: O(B): each node keeps its B best children (count desc, then most recent first),
  maintained on every increment, so a proposal never scans a node's full fan-out (the root's
  children are the whole vocabulary used so far).
- ``remove`` (evicting a cached sequence): O(len * L * B) once, plus a re-sort of the fan-out of
  the nodes with more than B children whose best list a decrement may have reordered.
- memory: one leaf per unique suffix plus one node per repeated substring (<= n * L in the
  worst case, a text repeated verbatim; a few per token for ordinary text).

The slow reference in ``tests/test_suffix.py`` counts substrings by brute force; the tests check
this structure's children, counts and order against it on random streams.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar, Union

BRANCH = 8  # children a node keeps ranked, and the most a proposal offers at one node


class Seq:
    """Tokens of one sequence; ``base`` orders positions across sequences (recency)."""

    __slots__ = ("tokens", "base", "active")

    def __init__(self, base: int) -> None:
        self.tokens: list[int] = []
        self.base = base
        self.active: list[Node] = []  # nodes where this sequence's repeated suffixes end


class Leaf:
    """A string that occurs once: at ``seq.tokens[start : start + depth]``; its continuation is
    read from the sequence (implicit count-1 chain below it)."""

    __slots__ = ("seq", "start", "depth")
    count = 1

    def __init__(self, seq: Seq, start: int, depth: int) -> None:
        self.seq, self.start, self.depth = seq, start, depth

    @property
    def last(self) -> int:
        """When its string's last token was added (orders siblings of equal count)."""
        return self.seq.base + self.start + self.depth - 1


class Node:
    """A string that occurs ``count`` times (or the root)."""

    __slots__ = ("count", "total", "last", "depth", "kids", "top")

    def __init__(self, count: int, last: int, depth: int) -> None:
        self.count, self.last, self.depth = count, last, depth
        self.total = 0
        self.kids: dict[int, Node | Leaf] = {}
        # up to BRANCH tokens, best first; None: rank when needed (one child needs no list)
        self.top: list[int] | None = None


Where = tuple[Union[Node, Leaf], int]  # a node, and for a leaf how far down its implicit chain


def _rank(node: Node) -> list[int]:
    kids = node.kids
    ranked = sorted(kids, key=lambda t: (kids[t].count, kids[t].last), reverse=True)
    return ranked[:BRANCH]


def _promote(node: Node, token: int) -> None:
    """Child ``token`` was just added or counted (so it is the most recent): re-rank it."""
    top = node.top
    if top is None:
        if len(node.kids) > 1:  # a single child is ranked on demand, without a list
            node.top = _rank(node)
        return
    if top and top[0] == token:
        return  # the most frequent child stays first
    if token in top:
        top.remove(token)
    kids = node.kids
    count = kids[token].count
    i = 0
    while i < len(top) and kids[top[i]].count > count:
        i += 1  # it goes before siblings of equal count: it is more recent
    if i < BRANCH:
        top.insert(i, token)
        del top[BRANCH:]


def _demote(node: Node, token: int) -> None:
    """Child ``token`` lost a count or was removed: re-rank it in place when every child is
    ranked, else re-sort when next needed (a child outside the list may now rank higher)."""
    top = node.top
    if top is None or token not in top:
        return  # an unranked child only got worse
    top.remove(token)
    kids = node.kids
    if len(top) + (token in kids) < len(kids):
        node.top = None
        return
    if token in kids:
        key = (kids[token].count, kids[token].last)
        i = 0
        while i < len(top) and (kids[top[i]].count, kids[top[i]].last) > key:
            i += 1
        top.insert(i, token)


class SuffixTrie:
    """Substrings of length <= ``max_depth`` of the sequences added, with counts."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = Node(0, -1, 0)
        self.clock = 0  # tokens ever added: the base of the next sequence

    def new_seq(self) -> Seq:
        return Seq(self.clock)

    def extend(self, seq: Seq, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(seq, t)

    def append(self, seq: Seq, t: int) -> None:
        """Add token ``t`` to ``seq``: every suffix of ``seq`` that is a repeated string moves
        one level down (counted), a suffix that becomes unique gets its own leaf."""
        tokens = seq.tokens
        n = len(tokens)
        tokens.append(t)
        now = seq.base + n
        self.clock = max(self.clock, now + 1)
        limit = self.max_depth
        moved: list[Node] = []
        root = self.root
        root.count += 1
        for node in (*seq.active, root):
            kids = node.kids
            node.total += 1
            child = kids.get(t)
            if child is None:  # a new string: it occurs only here
                kids[t] = Leaf(seq, n - node.depth, node.depth + 1)
                if node.depth:
                    _promote(node, t)
                continue
            if type(child) is Leaf:  # seen once before: now twice, so it needs a real node
                child = self._split(node, t, child, now)
            else:
                assert isinstance(child, Node)
                child.count += 1
                child.last = now
            if node.depth:
                _promote(node, t)
            if child.depth < limit:
                moved.append(child)
        seq.active = moved

    def _split(self, parent: Node, t: int, leaf: Leaf, now: int) -> Node:
        """Replace ``leaf`` (one earlier occurrence) by a node counting it and the new one; the
        earlier occurrence continues in a leaf one level down."""
        node = Node(2, now, leaf.depth)
        other, pos = leaf.seq, leaf.start + leaf.depth
        if leaf.depth < self.max_depth and pos < len(other.tokens):
            nxt = other.tokens[pos]
            node.kids[nxt] = Leaf(other, leaf.start, leaf.depth + 1)
            node.total = 1
        parent.kids[t] = node
        return node

    def remove(self, seq: Seq) -> None:
        """Take every substring of ``seq`` out of the counts (``seq`` must have been added)."""
        tokens = seq.tokens
        root, limit = self.root, self.max_depth
        for i in range(len(tokens)):
            node = root
            root.count -= 1
            for d in range(min(limit, len(tokens) - i)):
                t = tokens[i + d]
                child = node.kids[t]
                node.total -= 1
                if type(child) is Leaf:
                    assert child.seq is seq and child.start == i, "a leaf holds one occurrence"
                    del node.kids[t]
                    _demote(node, t)
                    break
                assert isinstance(child, Node)
                child.count -= 1
                if child.count == 0:
                    del node.kids[t]
                _demote(node, t)
                if child.count == 0:
                    break
                node = child
        seq.active = []

    # -- reading ------------------------------------------------------------------------------

    def step(self, where: Where, t: int) -> Where | None:
        """Where the string at ``where`` followed by ``t`` sits, or None if it never occurred."""
        obj, extra = where
        if type(obj) is Node:
            child = obj.kids.get(t)
            return None if child is None else (child, 0)
        assert isinstance(obj, Leaf)
        depth = obj.depth + extra
        pos = obj.start + depth
        tokens = obj.seq.tokens
        if depth < self.max_depth and pos < len(tokens) and tokens[pos] == t:
            return obj, extra + 1
        return None

    def children(self, where: Where) -> list[tuple[int, float, Where]]:
        """(token, how often it followed, where it leads), best first: at most BRANCH."""
        obj, extra = where
        if type(obj) is Leaf:
            depth = obj.depth + extra
            pos = obj.start + depth
            tokens = obj.seq.tokens
            if depth < self.max_depth and pos < len(tokens):
                return [(tokens[pos], 1.0, (obj, extra + 1))]
            return []
        assert isinstance(obj, Node)
        if not obj.total:
            return []
        top = obj.top
        if top is None:
            top = _rank(obj)
            if obj.depth and len(top) > 1:  # the root's ranking is not maintained
                obj.top = top
        kids, total = obj.kids, obj.total
        return [(t, kids[t].count / total, (kids[t], 0)) for t in top]

    def continues(self, where: Where) -> bool:
        """Whether the string at ``where`` was ever followed by a token (within max_depth)."""
        obj, extra = where
        if type(obj) is Leaf:
            depth = obj.depth + extra
            return depth < self.max_depth and obj.start + depth < len(obj.seq.tokens)
        assert isinstance(obj, Node)
        return obj.total > 0


P = TypeVar("P")  # a place in whatever structure ``children`` reads


def grow_tree(
    start: P,
    children: Callable[[P], Sequence[tuple[int, float, P]]],
    *,
    budget: int,
    max_depth: int,
    min_prob: float,
) -> tuple[list[int], list[int], list[float]]:
    """Best-first token tree: repeatedly add the candidate whose estimated path probability
    (product of the continuation frequencies on its path) is highest, until ``budget`` nodes, no
    candidate of at least ``min_prob``, or no candidate within ``max_depth``.

    Returns (tokens, parents, probs) for rows 1..m: ``parents`` in TokenTree form (0 = root), a
    row's children in descending probability (ties: the order ``children`` gave). Example: after
    ``x``, ``a`` followed 3 times and ``b`` once; after ``x a``, ``c`` always::

        >>> kids = {"x": [(1, .75, "xa"), (2, .25, "xb")], "xa": [(3, 1.0, "xac")], "xb": [], "xac": []}
        >>> grow_tree("x", kids.__getitem__, budget=3, max_depth=4, min_prob=0.1)
        ([1, 3, 2], [0, 1, 0], [0.75, 0.75, 0.25])
    """
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple[float, int, int, int, int, P]] = []  # (-p, order, token, parent, depth, where)
    order = 0

    def push(where: P, p: float, row: int, depth: int) -> None:
        nonlocal order
        room = budget - len(tokens)
        for token, frac, child in children(where):
            q = p * frac
            if q < min_prob or room <= 0:
                break  # children come best first: the rest are no better
            heapq.heappush(heap, (-q, order, token, row, depth + 1, child))
            order += 1
            room -= 1

    if budget > 0 and max_depth > 0:
        push(start, 1.0, 0, 0)
    while heap and len(tokens) < budget:
        neg_p, _, token, parent, depth, where = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_p)
        if depth < max_depth:
            push(where, -neg_p, len(tokens), depth)
    return tokens, parents, probs
