"""Token trees: several guesses verified in one target pass.

A pass feeds ``m + 1`` rows: row 0 is the last committed token (the *root*, not yet in the
target's cache), rows ``1..m`` are the proposed nodes. ``parents[j]`` is the row of node j's
parent, always an earlier row (``0 <= parents[j] < j``), so rows are in topological order. Node j
sits at position ``base + depth(j)`` and attends to the cache and to its own ancestors (and
itself) only. A chain is the tree whose parents are ``0, 1, 2, ..., m - 1``.

Row j of the target's output scores the token after node j's path, so a path is verified by
walking from the root: a child is kept when the target accepts it at its parent's row.

>>> t = TokenTree.chain([5, 6])
>>> t.parents, t.depths, t.is_chain
([0, 1], [1, 2], True)
>>> t = TokenTree(tokens=[5, 9, 6], parents=[0, 0, 1])   # 5 -> 6, and a sibling 9 of 5
>>> t.children(0), t.children(1), t.depths
([1, 2], [3], [1, 1, 2])
>>> t.path_to(3)
[0, 1, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.errors import ConfigError


@dataclass(frozen=True)
class TokenTree:
    """Proposed tokens with a parent row each (see the module docstring).

    tokens:  the m proposed token ids, rows 1..m.
    parents: ``parents[j - 1]`` is the parent row of row j, in ``[0, j)``.
    """

    tokens: list[int]
    parents: list[int]
    _children: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _depths: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ConfigError(f"a tree needs one parent per token: {len(self.tokens)} tokens, {len(self.parents)} parents")
        depths = [0]
        for j, p in enumerate(self.parents, start=1):
            if not 0 <= p < j:
                raise ConfigError(f"node {j}'s parent {p} is not an earlier row (need 0 <= parent < {j})")
            depths.append(depths[p] + 1)
            self._children.setdefault(p, []).append(j)
        self._depths.extend(depths[1:])

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> TokenTree:
        return cls(list(tokens), list(range(len(tokens))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        """Depth of rows 1..m (a root child has depth 1)."""
        return list(self._depths)

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty tree)."""
        return max(self._depths, default=0)

    @property
    def is_chain(self) -> bool:
        return all(p == j for j, p in enumerate(self.parents))

    def children(self, row: int) -> list[int]:
        """Rows whose parent is ``row``, in proposal order (a draft lists its best guess first)."""
        return list(self._children.get(row, ()))

    def token(self, row: int) -> int:
        return self.tokens[row - 1]

    def parent(self, row: int) -> int:
        return self.parents[row - 1]

    def path_to(self, row: int) -> list[int]:
        """Rows from the root (0) down to ``row``."""
        path = [row]
        while path[-1] != 0:
            path.append(self.parent(path[-1]))
        return path[::-1]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": list(self.tokens), "parents": list(self.parents)}
