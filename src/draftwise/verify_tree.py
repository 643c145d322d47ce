"""Verification of a token tree: which root-to-node path the target keeps. Pure functions, in the
vocabulary of :mod:`draftwise.verify` (proposed, accepted, recovered, bonus, committed).

A pass scored rows ``[root, x_1..x_m]`` of a :class:`~draftwise.tree.TokenTree`; row j of the
target's output is p after node j's path. Verification walks down from the root: at a node it
tries the children in proposal order, descends into the first one it accepts, and stops with a
*recovered* token when every child is rejected, or with a *bonus* token from the row of an
accepted leaf. So at most one path is kept, and 1..depth+1 tokens are committed per pass.

Several candidates for one position stay lossless if each rejection updates the target
distribution the next sibling is checked against (multi-round rejection sampling):

- **point masses** (``draft_probs is None``: candidates chosen, not sampled, e.g. lookup). At a
  node with target distribution p and children ``c_1..c_r``: accept ``c_i`` with probability
  ``p_i(c_i)``, where ``p_i`` is p with the earlier rejected siblings zeroed and renormalised;
  if all are rejected, commit a token from p with all of them zeroed (renormalised). This is
  sampling ``y ~ p`` and asking "is it c_1? else, is it c_2? ...": given ``y != c_1``, y follows
  p without c_1, renormalised, and so on, so the committed token is exactly ``y ~ p``.
- **distributions** (``draft_probs`` given: the r children were drawn i.i.d. from the draft's q
  at their parent). SpecInfer's multi-step speculative sampling (Miao et al. 2023, "SpecInfer",
  Algorithm 2): accept ``c_i`` with ``min(1, p(c_i) / q(c_i))``; on a rejection
  ``p <- norm(max(0, p - q))``; after all are rejected, commit a token from the final p. Each
  step is the one-candidate rule of Leviathan et al. applied to the residual left by the last,
  so the committed token follows the original p. The siblings must be i.i.d. draws from one q;
  candidates drawn *without* replacement need recursive rejection sampling (Jeon et al. 2024,
  "Recursive Speculative Decoding"), which also updates q; pass such drafts as point masses.

Randomness: one uniform per node, all m drawn up front (``torch.rand(m)``, float64), then one
:func:`~draftwise.sampling.sample` for the recovered or bonus token. For a chain this is the
order :func:`~draftwise.verify.verify_sampled` uses, so a chain gets exactly its verdicts.

>>> import torch
>>> from draftwise.tree import TokenTree
>>> tree = TokenTree(tokens=[5, 2, 3], parents=[0, 0, 2])   # root -> 5 | 2 -> 3
>>> logits = torch.zeros(4, 8)                               # [m + 1, vocab]
>>> logits[0, 2] = logits[2, 3] = logits[3, 7] = 1.0         # target: 2, then 3, then 7
>>> verify_tree_greedy(tree, logits)
TreeVerdict(accepted=2, tokens=[2, 3, 7], bonus=True, path=[0, 2, 3])
>>> probs = torch.tensor([[0.0, 0, 0.5, 0, 0, 0.5, 0, 0]]).repeat(4, 1)  # p: 2 or 5, half each
>>> v = verify_tree_sampled(TokenTree([5, 2], [0, 0]), None, probs[:3], torch.Generator())
>>> v.tokens[0] in (2, 5) and v.accepted == 1 and v.bonus   # 5 or, once 5 is out, surely 2
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError
from .sampling import sample
from .tree import TokenTree
from .verify import Verdict


@dataclass(frozen=True)
class TreeVerdict(Verdict):
    """A :class:`~draftwise.verify.Verdict` plus the rows kept.

    path: the accepted rows from the root, ``[0, r_1, .., r_a]`` (``len(path) == accepted + 1``);
          ``tokens[:accepted]`` are those rows' tokens, ``tokens[-1]`` the recovered or bonus one.
    bonus: True when the path ends at a leaf (every proposed token on it was accepted, and the
           last token came from the leaf's row); for a chain: all k accepted.
    """

    path: list[int]


def _check_rows(tree: TokenTree, rows: torch.Tensor, what: str, extra: int = 1) -> None:
    m = len(tree)
    if rows.dim() != 2 or rows.shape[0] != m + extra:
        raise ConfigError(
            f"{what} must be [{m + extra}, vocab] for a tree of {m} nodes, got {list(rows.shape)}"
        )


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """Greedy verification of a tree: follow the child that is the target's argmax.

    tree:           m proposed nodes.
    target_logits:  [m + 1, vocab]; row j scores the token after node j's path (row 0: the root).
    """
    _check_rows(tree, target_logits, "target_logits")
    best = target_logits.argmax(dim=-1).tolist()  # [m + 1]
    path = [0]
    while True:
        row = path[-1]
        children = tree.children(row)
        nxt = next((c for c in children if tree.token(c) == best[row]), None)
        if nxt is None:  # no child is the argmax: commit it (a bonus when row is a leaf)
            accepted = [tree.token(r) for r in path[1:]]
            return TreeVerdict(len(path) - 1, accepted + [best[row]], not children, path)
        path.append(nxt)


def _after_rejection(p: torch.Tensor, x: int, q: torch.Tensor | None) -> torch.Tensor:
    """[vocab] the normalised target distribution left after candidate x was rejected.

    p: [vocab] the distribution x was just checked against; q: [vocab] the draft's q for x, or
    None for a point mass. Point mass: p without x; with q: norm(max(0, p - q)).
    """
    if q is None:
        residual = p.clone()
        residual[x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    if total <= 0.0:  # only reachable by rounding (p == q, or all of p on x): keep p itself
        residual, total = p, float(p.sum())
    return residual / total


def verify_tree_sampled(
    tree: TokenTree,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> TreeVerdict:
    """Multi-candidate rejection-sampling verification of a tree (module docstring).

    tree:          m proposed nodes; siblings are tried in proposal order.
    draft_probs:   [m, vocab] q; row j - 1 is the distribution node j was drawn from (the draft's
                   at j's parent), or None for point masses (a draft without a distribution).
    target_probs:  [m + 1, vocab] p, after the *same* temperature / top-k / top-p as q; row j is
                   p after node j's path.
    """
    m = len(tree)
    p = target_probs
    _check_rows(tree, p, "target_probs")
    q = None
    if draft_probs is not None:
        _check_rows(tree, draft_probs, "draft_probs", extra=0)
        q = draft_probs.to(p.device)  # a no-op when they share one
    # one uniform per node, drawn together (as verify_sampled does for a chain)
    u = torch.rand(m, generator=generator, dtype=torch.float64).tolist() if m else []
    path = [0]
    while True:
        row = path[-1]
        children = tree.children(row)
        p_row = p[row]  # [vocab] what the next candidate is checked against
        for c in children:
            x = tree.token(c)
            q_x = 1.0 if q is None else float(q[c - 1, x])
            if u[c - 1] * q_x < float(p_row[x]):  # u < min(1, p/q), without dividing by q = 0
                path.append(c)
                break
            p_row = _after_rejection(p_row, x, None if q is None else q[c - 1])
        else:  # every child rejected (recovered from the residual), or a leaf (bonus from p)
            accepted = [tree.token(r) for r in path[1:]]
            token = sample(p_row, generator)
            return TreeVerdict(len(path) - 1, accepted + [token], not children, path)
