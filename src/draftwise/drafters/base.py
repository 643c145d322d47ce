"""The drafter protocol: one shape for every kind of draft.

A generation calls ``start`` once, then each step ``propose(context, k)`` and, after the target
has verified, ``observe(num_accepted)``. ``context`` is every token so far (prompt and committed
output); its last token is not yet in the target's cache. A drafter may propose fewer than k
tokens, or none: the step is then a plain decode step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..sampling import SamplingConfig, greedy, logits_to_probs, sample
from ..tree import TokenTree


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and, for drafts that sample, the distributions they came from.

    tokens: m <= k proposed token ids.
    probs:  [m, vocab] q after the generation's sampling transform, or None for a point mass
            (prompt lookup, or any draft in greedy mode). For a tree, row j-1 is the q that
            node j was drawn from (the distribution at its parent).
    tree:   None for a chain of ``tokens`` (each token follows the one before). When a draft
            proposes a tree (:class:`draftwise.tree.TokenTree`), ``tokens == tree.tokens``
            (rows 1..m in topological order) and the ``k`` passed to ``propose`` was the node
            budget: ``len(tree) <= k``.
    scores: for a tree, the draft's own estimate of the probability that each node's whole path
            is accepted, rows 1..m, in descending order, so that every prefix of the rows is a
            tree (suffix decoding's frequencies); ``--k auto`` trims the tree by them
            (:meth:`prefix`). None when the draft has no such estimate.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    tree: TokenTree | None = None
    scores: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.tree is not None and list(self.tree.tokens) != list(self.tokens):
            raise ValueError("a tree draft's tokens must be its tree's tokens, rows 1..m in order")
        if self.scores is not None and (len(self.scores) != len(self.tokens)
                                        or any(a < b for a, b in zip(self.scores, self.scores[1:]))):
            raise ValueError("a draft's scores must be one per token, in descending order")

    def __len__(self) -> int:
        return len(self.tokens)

    def prefix(self, n: int) -> Draft:
        """The first ``n`` rows: a chain's first n tokens, or the subtree of a tree's first n
        rows (a tree lists every parent before its children, so a prefix is a tree)."""
        if n >= len(self.tokens):
            return self
        probs = None if self.probs is None else self.probs[:n]
        tree = None if self.tree is None else TokenTree(self.tokens[:n], self.tree.parents[:n])
        scores = None if self.scores is None else self.scores[:n]
        return Draft(self.tokens[:n], probs, tree, scores)


@runtime_checkable
class Drafter(Protocol):
    """Proposes tokens for the target to verify.

    A drafter may also define ``before_prefill()``, which the decode loop calls before the
    target's prefill of each generation (an EAGLE head sets which layers the target records)."""

    name: str

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Begin a generation: forget the earlier one's state (what a draft learns across
        generations, such as suffix's cache of earlier outputs, it keeps on purpose); sample
        with ``generator`` when not greedy."""
        ...

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to k tokens that might follow ``context`` (a chain, or a tree of at most k nodes)."""
        ...

    def observe(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""
        ...


def draft_autoregressive(
    logits: torch.Tensor,
    step: Callable[[int], torch.Tensor],
    k: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> Draft:
    """Propose k tokens one at a time from a model-like draft.

    logits: [vocab], the draft's scores for the first proposed token.
    step:   feeds one token to the draft and returns its [vocab] scores for the next.
    Greedy proposes the argmax (no distribution needed); sampling draws each token from q and
    keeps q, which verification needs.
    """
    tokens: list[int] = []
    probs: list[torch.Tensor] = []
    for i in range(k):
        if sampling.greedy:
            token = int(greedy(logits).item())
        else:
            q = logits_to_probs(logits, sampling)  # [vocab]
            token = sample(q, generator)
            probs.append(q)
        tokens.append(token)
        if i < k - 1:
            logits = step(token)
    return Draft(tokens, torch.stack(probs) if probs else None)  # probs: [k, vocab]
