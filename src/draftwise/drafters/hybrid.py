"""Hybrid drafts (``suffix+eagle:default``): copy what the text repeats, and guess from the target's
features where nothing repeats.

A suffix or lookup draft is nearly free and right where the answer copies the prompt or an
earlier answer; on open-ended text it often proposes nothing and the step is a plain one. An
EAGLE head costs a few milliseconds a step and guesses a token or two anywhere. The hybrid asks
both each step:

- **greedy**: one token tree, the copy draft's tree with the head's chain of ``extra`` tokens
  merged in from the root (a head token equal to a node already there joins that node). Every
  node carries an estimate of the probability that its whole path is accepted: the copy draft's
  frequencies, and for the head's nodes the product of the head's top probabilities along its
  chain; a node both propose keeps the larger. Rows are ordered best first, so every prefix is
  a tree and ``--k auto`` trims the merged tree by those scores as it trims a suffix tree.
- **where the copy draft is sure or has nothing** (``fill``, ``skip_from``; spec options of the
  head part, ``suffix+eagle:default,fill=2,skip_from=4``): the head proposes ``fill`` tokens
  where the copy draft proposes none, and is not run at all where the copy draft's path is
  ``skip_from`` tokens or longer (its cache catches up on the next step it runs). Defaults: 3
  (:data:`~draftwise.drafters.spec.FILL`) and never. Which pay depends on the head's acceptance and
  cost: with earlier heads (acceptance 0.3-0.4 at k=1 while drafting) 2 was no better than 1; with
  the 2,048-conversation head (0.57 on held-out MT-bench) 3 beat 1 and 2 on the dev questions and
  was level with 1 on unseen ones (docs/benchmarks.md).
- **sampled**: the copy draft's tree when it proposes one, else the head's chain (``fill``
  tokens) with its distributions (tree verification of point masses and of distributions are separate schemes;
  see :mod:`draftwise.core.verify`). Either way each step is an ordinary lossless step.

The same pairing, suffix decoding in front of a trained speculator, is what ArcticInference
runs for its hybrid mode (Oliaro et al., 2024, section 4); this is a CPU version of the idea,
written for draftwise's tree verifier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftwise.core.draft import Capabilities, Draft, Drafter
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree
from draftwise.drafters.spec import FILL

#: head tokens merged into each greedy tree (the head's k=1 pays best on the default model)
EXTRA = 1


def merge_chain(draft: Draft, chain: Sequence[int], chain_scores: Sequence[float]) -> Draft:
    """``draft`` (a scored tree, a scored chain, or empty) with ``chain`` merged in from the root;
    rows re-ordered by descending score (parents before children on ties), so every prefix is a
    tree.

    >>> base = Draft([5, 6], tree=TokenTree([5, 6], [0, 1]), scores=(0.9, 0.5))
    >>> d = merge_chain(base, [5, 7], [0.95, 0.6])
    >>> d.tokens, d.tree.parents, d.scores
    ([5, 7, 6], [0, 1, 1], (0.95, 0.6, 0.5))
    """
    tokens = list(draft.tokens)
    if draft.tree is not None:
        parents = list(draft.tree.parents)
    else:
        parents = list(range(len(tokens)))
    scores = list(draft.scores) if draft.scores is not None else [0.0] * len(tokens)
    parent = 0  # row of the current chain node's parent (0: the root)
    for token, score in zip(chain, chain_scores):
        row = next((j + 1 for j in range(len(tokens)) if parents[j] == parent and tokens[j] == token), None)
        if row is None:
            tokens.append(int(token))
            parents.append(parent)
            scores.append(float(score))
            row = len(tokens)
        else:
            scores[row - 1] = max(scores[row - 1], float(score))
        parent = row
    depth = [0] * (len(tokens) + 1)
    for j, p in enumerate(parents, 1):
        depth[j] = depth[p] + 1
    order = sorted(range(1, len(tokens) + 1), key=lambda j: (-scores[j - 1], depth[j], j))
    new = {0: 0, **{old: i for i, old in enumerate(order, 1)}}
    tree = TokenTree([tokens[j - 1] for j in order], [new[parents[j - 1]] for j in order])
    return Draft(list(tree.tokens), None, tree, tuple(scores[j - 1] for j in order))


def path_length(draft: Draft) -> int:
    """The longest path of a draft (a chain's length, a tree's depth)."""
    return draft.tree.depth if draft.tree is not None else len(draft.tokens)


def trusted(draft: Draft) -> Draft:
    """``draft`` with scores to merge by: an unscored copy draft is trusted as a sure chain
    (every node 1.0); a scored or empty one is returned as it is."""
    if not draft.tokens or draft.scores is not None:
        return draft
    return Draft(draft.tokens, None, draft.tree, tuple(1.0 for _ in draft.tokens))


class HybridDrafter:
    """A copy draft (suffix, lookup) and an EAGLE head in one draft (see the module docstring).

    copy:  a drafter that proposes scored trees or chains (point masses).
    head:  an :class:`~draftwise.eagle.drafter.EagleDrafter` (chains; ``propose_scored``).
    extra: head tokens merged into a greedy tree each step.
    fill: head tokens where the copy draft proposes nothing.
    skip_from: skip the head where the copy draft's path is at least this long (0: never).
    """

    def __init__(
        self, copy: Drafter, head: Any, *, extra: int = EXTRA, fill: int = FILL, skip_from: int = 0,
        label: str | None = None,
    ) -> None:
        self.copy, self.head, self.extra, self.fill, self.skip_from = copy, head, int(extra), int(fill), int(skip_from)
        self.skipped = 0  # steps the head was not run
        self.name = label or f"{copy.name}+{head.name}"
        self._greedy = True
        self.capabilities = Capabilities.hybrid(copy.capabilities, head.capabilities)

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self._greedy = sampling.greedy
        self.copy.start(prompt, sampling, generator)
        self.head.start(prompt, sampling, generator)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k < 1:
            return Draft([])
        copied = self.copy.propose(context, k)
        if not self._greedy:
            return copied if copied.tokens else self.head.propose(context, min(k, self.fill))
        if self.skip_from and copied.tokens and path_length(copied) >= self.skip_from:
            self.skipped += 1
            return copied
        guess = self.head.propose_scored(context, min(k, self.extra if copied.tokens else self.fill))
        if not guess.tokens:
            return copied
        merged = merge_chain(trusted(copied), guess.tokens, guess.scores or ())
        return merged.prefix(k)

    def observe(self, num_accepted: int) -> None:
        self.copy.observe(num_accepted)
        self.head.observe(num_accepted)

    def end(self, output: Sequence[int] | None) -> None:
        self.copy.end(output)
        self.head.end(output)
