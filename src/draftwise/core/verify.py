"""Verification: which proposed tokens the target keeps. Pure functions; they never learn which
drafter proposed the tokens.

Vocabulary (used everywhere in draftwise):

- *proposed*: the k draft tokens ``x_1..x_k`` handed to the target;
- *accepted*: the leading proposed tokens the target keeps;
- *recovered*: the token sampled from the residual at the first rejection;
- *bonus*: the token sampled from p at position k+1 when all k were accepted;
- *committed*: accepted + exactly one recovered or bonus token, so 1..k+1 per target pass.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023) keeps the output distribution
exactly the target's:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
    at the first rejection, commit a recovered token ~ norm(max(0, p_i - q_i))
    if all k are accepted, commit a bonus token ~ p_{k+1}

A draft with no distribution (prompt lookup) is a point mass, q_i(x_i) = 1: x_i is accepted with
probability p_i(x_i), and the residual is p_i with x_i removed, renormalised. Greedy decoding
(temperature 0) is the limit: accept while x_i == argmax p_i, then commit argmax p_i.

**Trees.** A pass scores rows ``[root, x_1..x_m]`` of a :class:`~draftwise.core.tree.TokenTree`;
row j of the target's output is p after node j's path. Verification walks down from the root: at a node it
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

One path: a chain is the tree whose nodes have one child each, so chains and trees share one
verifier and one verdict, and the runtime keeps a verdict's ``path`` either way. One read from
the device per pass: every accept test and every row's stopping token are computed with tensor
operations first (gpt-fast's and vLLM's rejection samplers do the same), so a step on an
accelerator waits for the host once.

>>> import torch
>>> from draftwise.core.tree import TokenTree
>>> tree = TokenTree(tokens=[5, 2, 3], parents=[0, 0, 2])   # root -> 5 | 2 -> 3
>>> logits = torch.zeros(4, 8)                               # [m + 1, vocab]
>>> logits[0, 2] = logits[2, 3] = logits[3, 7] = 1.0         # target: 2, then 3, then 7
>>> verify_tree_greedy(tree, logits)
Verdict(accepted=2, tokens=[2, 3, 7], bonus=True, path=[0, 2, 3])
>>> probs = torch.tensor([[0.0, 0, 0.5, 0, 0, 0.5, 0, 0]]).repeat(4, 1)  # p: 2 or 5, half each
>>> v = verify_tree_sampled(TokenTree([5, 2], [0, 0]), None, probs[:3], torch.Generator())
>>> v.tokens[0] in (2, 5) and v.accepted == 1 and v.bonus   # 5 or, once 5 is out, surely 2
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftwise.core.sampling import argmax_ids
from draftwise.core.tree import TokenTree
from draftwise.errors import ConfigError


@dataclass(frozen=True)
class Verdict:
    """The outcome of one target pass over a chain or a tree of proposed tokens.

    accepted: proposed tokens kept (the depth of the kept path), 0..depth.
    tokens:   committed: the accepted tokens, then one recovered or bonus token.
    bonus:    True when the kept path ends at a leaf (for a chain: all k accepted) and the last
              token came from the leaf's row of p.
    path:     the kept rows from the root, ``[0, r_1, .., r_a]`` (``len(path) == accepted + 1``):
              what the runtime keeps. Not given: a chain's, ``[0, 1, .., accepted]``.
    """

    accepted: int
    tokens: list[int]
    bonus: bool
    path: list[int] = None  # type: ignore[assignment]  # filled in by __post_init__

    def __post_init__(self) -> None:
        if self.path is None:
            object.__setattr__(self, "path", list(range(self.accepted + 1)))


TreeVerdict = Verdict  # the name tree code used before chains and trees shared one verdict


def _check_rows(tree: TokenTree, rows: torch.Tensor, what: str, extra: int = 1) -> None:
    m = len(tree)
    if rows.dim() != 2 or rows.shape[0] != m + extra:
        raise ConfigError(
            f"{what} must be [{m + extra}, vocab] for {m} proposed tokens, got {list(rows.shape)}"
        )


def follow(tree: TokenTree, accept: Sequence[bool], final: Sequence[int]) -> Verdict:
    """The walk every verification ends with (host side, after the one read): from the root,
    descend into the first child accepted at each node (``accept[j - 1]`` for row j); stop with
    ``final[row]`` (recovered, or bonus at a leaf) where none is.

    >>> follow(TokenTree([5, 6, 7], [0, 0, 2]), [False, True, True], [1, 2, 3, 4]).path
    [0, 2, 3]
    """
    path = [0]
    while True:
        row = path[-1]
        children = tree.children(row)
        nxt = next((c for c in children if accept[c - 1]), None)
        if nxt is None:
            kept = [tree.token(r) for r in path[1:]]
            return Verdict(len(path) - 1, kept + [int(final[row])], not children, path)
        path.append(nxt)


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> Verdict:
    """Greedy verification: follow the child that is the target's argmax; commit the argmax
    where no child is. One read from the device (the argmax of every row).

    tree:           m proposed nodes (a chain is a tree).
    target_logits:  [m + 1, vocab]; row j scores the token after node j's path (row 0: the root).
    """
    _check_rows(tree, target_logits, "target_logits")
    best = argmax_ids(target_logits)  # [m + 1], the one host read
    accept = [tree.token(j) == best[tree.parent(j)] for j in range(1, len(tree) + 1)]
    return follow(tree, accept, best)


def _by_rank(tree: TokenTree) -> list[tuple[list[int], list[int]]]:
    """Rounds of sibling checks: round i holds each row's i-th child, ``(rows, children)``."""
    rounds: list[tuple[list[int], list[int]]] = []
    for row in range(len(tree) + 1):
        for i, c in enumerate(tree.children(row)):
            if len(rounds) <= i:
                rounds.append(([], []))
            rounds[i][0].append(row)
            rounds[i][1].append(c)
    return rounds


def _after_rejection(p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """[n, vocab] each row's normalised target distribution after its candidate was rejected.

    p: [n, vocab] the distributions the candidates ``x`` ([n]) were just checked against; q:
    [n, vocab] the draft's q for them, or None for point masses. Point mass: p without x; with
    q: norm(max(0, p - q)). A row left with no mass (only by rounding: p == q, or all of p on
    x) keeps p itself.
    """
    if q is None:
        residual = p.clone()
        residual[torch.arange(p.shape[0], device=p.device), x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)
    total = residual.sum(dim=-1, keepdim=True)  # [n, 1]
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without making the host wait: pinned memory and an asynchronous
    copy on an accelerator (a pageable copy synchronises); nothing at all on the CPU."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _draw(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[rows] one token per row of ``probs`` ([rows, vocab], each summing to 1), by inverting the
    cumulative distribution at the uniforms ``v`` ([rows]): a token with probability 0 is never
    drawn, and nothing is read back to the host."""
    cdf = probs.double().cumsum(dim=-1)  # [rows, vocab]
    at = (v * cdf[:, -1]).unsqueeze(-1)  # [rows, 1], < the row's total
    return torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def verify_tree_sampled(
    tree: TokenTree,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Multi-candidate rejection-sampling verification (module docstring), with one read from
    the device.

    tree:          m proposed nodes (a chain is a tree); siblings are tried in proposal order.
    draft_probs:   [m, vocab] q; row j - 1 is the distribution node j was drawn from (the draft's
                   at j's parent), or None for point masses (a draft without a distribution).
    target_probs:  [m + 1, vocab] p, after the *same* temperature / top-k / top-p as q; row j is
                   p after node j's path.

    Every node's accept test is computed at once, each against its row's p after its earlier
    siblings were rejected (the only case in which it is consulted), and so is each row's token
    for the case that the walk stops there (all children rejected: the residual; a leaf: p).
    Randomness: ``torch.rand(2m + 1)``, float64, from ``generator``: one uniform per node, then
    one per row's stopping token. What the host knows (uniforms, tokens, the tree's rounds)
    reaches the device in one asynchronous transfer, so on an accelerator the step waits once,
    for the one read at the end.
    """
    m = len(tree)
    p = target_probs
    _check_rows(tree, p, "target_probs")
    q = None
    if draft_probs is not None:
        _check_rows(tree, draft_probs, "draft_probs", extra=0)
        q = draft_probs.to(p.device, non_blocking=True)  # a no-op when they share one
    rounds = _by_rank(tree)
    # everything the host knows, in one transfer (no wait for the device on an accelerator):
    # the uniforms (u: one per node, v: one per row's stopping token), the tokens, each round
    u_v = _to_device(torch.rand(2 * m + 1, generator=generator, dtype=torch.float64), p.device)
    u, v = u_v[:m], u_v[m:]  # [m], [m + 1]
    ints = _to_device(torch.tensor([0, *tree.tokens, *(i for r, c in rounds for i in (*r, *c))]), p.device)
    tokens = ints[: m + 1]  # [m + 1], row 0 unused
    cur = p.clone()  # [m + 1, vocab]: each row's p after the siblings rejected so far
    accept = torch.zeros(m + 1, dtype=torch.bool, device=p.device)  # [m + 1], row 0 unused
    at = m + 1
    for rows, _ in rounds:
        n = len(rows)
        r, c = ints[at : at + n], ints[at + n : at + 2 * n]  # [n] rows, [n] their i-th children
        at += 2 * n
        x = tokens[c]  # [n]
        p_x = cur[r, x].double()
        q_x = torch.ones_like(p_x) if q is None else q[c - 1, x].double()
        accept[c] = u[c - 1] * q_x < p_x  # u < min(1, p/q), without dividing by q = 0
        cur[r] = _after_rejection(cur[r], x, None if q is None else q[c - 1])
    final = _draw(cur, v)  # [m + 1]: the token committed if the walk stops at each row
    read = torch.cat([accept[1:].long(), final]).tolist()  # the one host read
    return follow(tree, [bool(a) for a in read[:m]], read[m:])


def verify_greedy(proposed: Sequence[int], target_logits: torch.Tensor) -> Verdict:
    """Greedy verification of a chain (:func:`verify_tree_greedy` on ``TokenTree.chain``).

    proposed:       k draft tokens.
    target_logits:  [k + 1, vocab], row i scores the token after ``proposed[:i]``.

    >>> logits = torch.full((3, 4), -100.0)
    >>> logits[0, 2] = logits[1, 3] = logits[2, 0] = 100.0   # target says 2, 3, then 0
    >>> v = verify_greedy([2, 1], logits)
    >>> v.accepted, v.tokens, v.bonus
    (1, [2, 3], False)
    """
    return verify_tree_greedy(TokenTree.chain(proposed), target_logits)


def verify_sampled(
    proposed: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Rejection-sampling verification of a chain (:func:`verify_tree_sampled` on
    ``TokenTree.chain``).

    proposed:      k draft tokens x_1..x_k.
    draft_probs:   [k, vocab] q, the distributions the draft sampled from, or None for a point
                   mass (a draft without a distribution).
    target_probs:  [k + 1, vocab] p, after the *same* temperature / top-k / top-p as q.
    """
    return verify_tree_sampled(TokenTree.chain(proposed), draft_probs, target_probs, generator)
