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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    """The outcome of one target pass over k proposed tokens."""

    accepted: int  # proposed tokens kept, 0..k
    tokens: list[int]  # committed: the accepted tokens, then one recovered or bonus token
    bonus: bool  # True when all k were accepted and the last token came from p_{k+1}


def verify_greedy(proposed: Sequence[int], target_logits: torch.Tensor) -> Verdict:
    """Greedy verification.

    proposed:       k draft tokens.
    target_logits:  [k + 1, vocab], row i scores the token after ``proposed[:i]``.

    >>> logits = torch.full((3, 4), -100.0)
    >>> logits[0, 2] = logits[1, 3] = logits[2, 0] = 100.0   # target says 2, 3, then 0
    >>> verify_greedy([2, 1], logits)
    Verdict(accepted=1, tokens=[2, 3], bonus=False)
    """
    k = len(proposed)
    assert target_logits.shape[0] == k + 1, "need one row of target logits per proposed token + 1"
    best = target_logits.argmax(dim=-1).tolist()  # [k + 1]
    n = 0
    while n < k and proposed[n] == best[n]:
        n += 1
    return Verdict(accepted=n, tokens=list(proposed[:n]) + [best[n]], bonus=n == k)


def verify_sampled(
    proposed: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Rejection-sampling verification.

    proposed:      k draft tokens x_1..x_k.
    draft_probs:   [k, vocab] q, the distributions the draft sampled from, or None for a point
                   mass (a draft without a distribution).
    target_probs:  [k + 1, vocab] p, after the *same* temperature / top-k / top-p as q.
    """
    k = len(proposed)
    p = target_probs
    assert p.shape[0] == k + 1, "need one row of target probabilities per proposed token + 1"
    q = None if draft_probs is None else draft_probs.to(p.device)  # a no-op when they share one
    # the uniforms come from the generator's device (the CPU); tokens are drawn by `sample`,
    # which copies a row there if p lives elsewhere
    u = torch.rand(k, generator=generator, dtype=torch.float64).tolist() if k else []
    for i, x in enumerate(proposed):
        p_x = float(p[i, x])
        q_x = 1.0 if q is None else float(q[i, x])
        if u[i] * q_x < p_x:  # u < min(1, p/q), without dividing by a zero q
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0.0:  # only reachable by rounding (p == q): fall back to p itself
            residual, total = p[i], float(p[i].sum())
        recovered = sample(residual / total, generator)
        return Verdict(accepted=i, tokens=list(proposed[:i]) + [recovered], bonus=False)
    bonus = sample(p[k], generator)
    return Verdict(accepted=k, tokens=list(proposed) + [bonus], bonus=True)
