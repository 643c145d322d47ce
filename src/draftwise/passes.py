"""One target pass: feed ``[last, *draft]`` (a chain or a token tree), verify, keep what was
accepted. The decode loop (:mod:`draftwise.decode`) calls :func:`verify_pass` once per step."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .drafters.base import Draft
from .runtime.base import Runtime
from .sampling import SamplingConfig, logits_to_probs
from .tree import TokenTree
from .verify import Verdict, verify_greedy, verify_sampled
from .verify_tree import TreeVerdict, verify_tree_greedy, verify_tree_sampled


@dataclass(frozen=True)
class Step:
    """One target pass: how many tokens (tree nodes) were proposed and what verification
    committed. ``ranks`` traces a tree pass: per depth reached, (children there, the rank of the
    accepted child or -1), which the planner's per-depth, per-sibling-rank acceptance needs."""

    num_proposed: int
    verdict: Verdict | TreeVerdict
    ranks: tuple[tuple[int, int], ...] = ()


_CHAIN_FALLBACK_SAID: set[str] = set()


def _as_chain(draft: Draft, why: str) -> Draft:
    """The tree's first chain (first child at every node), said once per reason."""
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


def _tree_ranks(tree: TokenTree, path: Sequence[int]) -> tuple[tuple[int, int], ...]:
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
) -> tuple[Verdict | TreeVerdict, tuple[tuple[int, int], ...]]:
    """One target pass over ``[last, *draft]``: verify, keep what was accepted (the cache then
    holds ``last`` and the accepted tokens), and trace the tree's ranks."""
    base = runtime.length
    tree = draft.tree
    if tree is not None and not tree.is_chain and not getattr(runtime, "supports_trees", False):
        draft, tree = _as_chain(draft, f"the {type(runtime).__name__} runtime cannot verify trees"), None
    if tree is None or tree.is_chain:
        rows = runtime.forward([last, *draft.tokens])  # [m + 1, vocab]
        if cfg.greedy:
            verdict: Verdict | TreeVerdict = verify_greedy(draft.tokens, rows)
        else:
            verdict = verify_sampled(draft.tokens, draft.probs, logits_to_probs(rows, cfg), generator)
        runtime.rollback(base + 1 + verdict.accepted)
        return verdict, ()
    rows = runtime.forward([last, *tree.tokens], parents=[-1, *tree.parents])  # type: ignore[call-arg]
    if cfg.greedy:
        tv = verify_tree_greedy(tree, rows)
    else:
        tv = verify_tree_sampled(tree, draft.probs, logits_to_probs(rows, cfg), generator)
    runtime.keep(base, tv.path)  # type: ignore[attr-defined]
    return tv, _tree_ranks(tree, tv.path)
