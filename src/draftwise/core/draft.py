"""The drafter protocol: one shape and one lifecycle for every kind of draft.

A generation calls ``start`` once, before the target's prefill; then each step
``propose(context, k)`` and, after the target has verified, ``observe(num_accepted)``; and
finally ``end(output)``, with the committed tokens when the generation finished, or None when
it was cancelled (a draft that learns across generations, such as suffix decoding's cache,
learns only from finished ones). ``context`` is every token so far (prompt and committed
output); its last token is not yet in the target's cache. A drafter may propose fewer than k
tokens, or none: the step is then a plain decode step.

Each drafter declares what it can do in :class:`Capabilities`; the decode loop, the cost model
and the planner read that statement, never a spec string, ``isinstance`` or ``getattr``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from draftwise.core.sampling import SamplingConfig, argmax_ids, logits_to_probs, sample
from draftwise.core.tree import TokenTree


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and, for drafts that sample, the distributions they came from.

    tokens: m <= k proposed token ids.
    probs:  [m, vocab] q after the generation's sampling transform, or None for a point mass
            (prompt lookup, or any draft in greedy mode). For a tree, row j-1 is the q that
            node j was drawn from (the distribution at its parent).
    tree:   None for a chain of ``tokens`` (each token follows the one before). When a draft
            proposes a tree (:class:`draftwise.core.tree.TokenTree`), ``tokens == tree.tokens``
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


#: how a draft's cost is measured and priced: ``host`` (a search on the CPU: lookup, suffix),
#: ``model`` (passes of its own model), ``target_layers`` (passes of some of the target's own
#: layers, in the target's cache), ``head`` (a small head over the target's features)
CostKind = Literal["host", "model", "target_layers", "head"]
#: how the planner replays a traced greedy answer at another k: ``exact`` (the proposals are a
#: pure function of the tokens seen, so any k replays exactly), ``hits`` (a chain whose first j
#: tokens at any k are its proposal at j: replay from per-position hits), ``rates`` (proposals
#: depend on the draft's own earlier guesses: only the traced acceptance rates carry over)
ReplayKind = Literal["exact", "hits", "rates"]


@dataclass(frozen=True)
class Capabilities:
    """What a drafter does, stated once (STYLE principle 12).

    trees:               may propose token trees (``Draft.tree`` other than a chain); the ``k``
                         it is given is then a node budget.
    scored:              its trees carry ``Draft.scores`` (each node's estimated probability of
                         acceptance, best first), so ``--k auto`` trims them node by node.
    reads_features:      reads the target's hidden features (EAGLE): the target records them
                         during its passes, so its proposals need the target's runtime.
    shares_target_cache: runs on the target's own runtime and cache (self-speculation): its
                         proposals leave the target's cache where they found it.
    learns:              keeps what it learns across generations (suffix decoding's cache of
                         earlier outputs); such a drafter object belongs to one owner (a bench
                         method, a server) and is never shared between two of them.
    replay:              how the planner replays it (:data:`ReplayKind`).
    cost:                how its cost is measured (:data:`CostKind`).

    >>> Capabilities(trees=True, scored=True).tree_policy
    'scored'
    >>> Capabilities(trees=True).tree_policy, Capabilities().tree_policy
    ('unscored', 'chain')
    """

    trees: bool = False
    scored: bool = False
    reads_features: bool = False
    shares_target_cache: bool = False
    learns: bool = False
    replay: ReplayKind = "exact"
    cost: CostKind = "host"

    def __post_init__(self) -> None:
        if self.scored and not self.trees:
            raise ValueError("only a drafter that proposes trees can score its nodes")

    @classmethod
    def hybrid(cls, copy: Capabilities, head: Capabilities) -> Capabilities:
        """A copy draft's tree with a head's guesses merged in (``suffix+eagle:...``): a scored
        tree, replayed from rates, priced as the head; it keeps what either part keeps."""
        return cls(trees=True, scored=True, reads_features=copy.reads_features or head.reads_features,
                   shares_target_cache=copy.shares_target_cache or head.shares_target_cache,
                   learns=copy.learns or head.learns, replay="rates", cost=head.cost)

    @property
    def tree_policy(self) -> Literal["chain", "scored", "unscored"]:
        """How ``--k auto`` treats the proposals: chains by k, scored trees trimmed by their
        scores, unscored trees by node budget with acceptance counted by depth."""
        return "chain" if not self.trees else ("scored" if self.scored else "unscored")


@runtime_checkable
class Drafter(Protocol):
    """Proposes tokens for the target to verify (see the module docstring for the lifecycle)."""

    name: str
    capabilities: Capabilities

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Begin a generation, before the target's prefill of ``prompt``: forget the earlier
        one's state (what a draft learns across generations it keeps on purpose); sample with
        ``generator`` when not greedy."""
        ...

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to k tokens that might follow ``context`` (a chain, or a tree of at most k nodes)."""
        ...

    def observe(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""
        ...

    def end(self, output: Sequence[int] | None) -> None:
        """The generation is over: ``output`` is what it committed when it finished, None when
        it was cancelled or must not be learned from (a warm-up, a repeat of a question, a
        profile's measurement). A planner's trace and replay pass the traced answer, as the run
        they model would."""
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
            token = argmax_ids(logits)[0]
        else:
            q = logits_to_probs(logits, sampling)  # [vocab]
            token = sample(q, generator)
            probs.append(q)
        tokens.append(token)
        if i < k - 1:
            logits = step(token)
    return Draft(tokens, torch.stack(probs) if probs else None)  # probs: [k, vocab]
