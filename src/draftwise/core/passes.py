"""One target pass: feed ``[last, *draft]`` (a chain or a token tree; a chain is a tree), verify,
keep what was accepted. The decode loop (:mod:`draftwise.core.decode`) calls :func:`verify_pass` once
per step."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftwise.core.draft import Draft
from draftwise.core.sampling import SamplingConfig, logits_to_probs
from draftwise.core.tree import TokenTree
from draftwise.core.verify import Verdict, verify_tree_greedy, verify_tree_sampled
from draftwise.runtime.base import Runtime


@dataclass(frozen=True)
class Step:
    """One target pass: how many tokens (tree nodes) were proposed, how deep they went (a
    chain's length, a tree's deepest path), and what verification committed. ``ranks`` traces a
    tree pass: per depth reached, (children there, the rank of the accepted child or -1), which
    the planner's per-depth, per-sibling-rank acceptance needs."""

    num_proposed: int
    verdict: Verdict
    ranks: tuple[tuple[int, int], ...] = ()
    depth: int = -1  # -1: as many as num_proposed (a chain)

    @property
    def positions(self) -> int:
        """Draft positions this pass tested: a chain's length, a tree's depth."""
        return self.num_proposed if self.depth < 0 else self.depth


_CHAIN_FALLBACK_SAID: set[str] = set()


def first_chain(draft: Draft, why: str) -> Draft:
    """The tree's first chain (first child at every node), said once per reason: what a runtime
    that cannot verify trees gets instead."""
    assert draft.tree is not None
    if why not in _CHAIN_FALLBACK_SAID:
        _CHAIN_FALLBACK_SAID.add(why)
        warnings.warn(f"{why}: verifying the first chain of each proposed tree", stacklevel=3)
    rows, row = [], 0
    while draft.tree.children(row):
        row = draft.tree.children(row)[0]
        rows.append(row)
    probs = None if draft.probs is None else draft.probs[[r - 1 for r in rows]]
    return Draft([draft.tree.token(r) for r in rows], probs)


def tree_ranks(tree: TokenTree, path: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Per depth along the kept ``path``: (children there, the rank of the kept child or -1)."""
    out = []
    for d, row in enumerate(path):
        children = tree.children(row)
        if not children:
            break
        nxt = path[d + 1] if d + 1 < len(path) else None
        out.append((len(children), children.index(nxt) if nxt is not None else -1))
    return tuple(out)


def verify_pass(
    runtime: Runtime, last: int, draft: Draft, cfg: SamplingConfig, generator: torch.Generator
) -> tuple[Verdict, tuple[tuple[int, int], ...], TokenTree]:
    """One target pass over ``[last, *draft]``: verify, keep the accepted path (the cache then
    holds ``last`` and the accepted tokens), and trace a tree's ranks (``()`` for a chain).
    Returns the tree it verified too: a runtime that cannot verify trees gets the first chain,
    and the statistics must count that, not the tree that was proposed."""
    base = runtime.length
    if draft.tree is not None and not draft.tree.is_chain and not runtime.supports_trees:
        draft = first_chain(draft, f"the {type(runtime).__name__} runtime cannot verify trees")
    tree = draft.tree if draft.tree is not None else TokenTree.chain(draft.tokens)
    ids = [last, *tree.tokens]
    # [m + 1, vocab]; a chain runs with the plain causal mask
    rows = runtime.forward(ids) if tree.is_chain else runtime.forward(ids, parents=[-1, *tree.parents])
    if cfg.greedy:
        verdict = verify_tree_greedy(tree, rows)
    else:
        verdict = verify_tree_sampled(tree, draft.probs, logits_to_probs(rows, cfg), generator)
    runtime.keep(base, verdict.path)
    return verdict, (() if tree.is_chain else tree_ranks(tree, verdict.path)), tree
