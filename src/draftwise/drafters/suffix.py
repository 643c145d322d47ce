"""Suffix decoding: propose a token tree from what followed the context's tail before, in this
generation (prompt and output so far) and in earlier generations' outputs.

After SuffixDecoding (Oliaro et al., 2024, arXiv 2411.04975; Snowflake's ArcticInference):

- a per-generation suffix trie over the prompt and the output so far, and a *global* trie over
  the outputs of the last ``cache`` generations (evicted oldest first). Prompts are not cached:
  the current prompt is already in the per-generation trie, other users' prompts are rarely
  repeated by the model, and outputs are what recur across requests (templated answers, code,
  a category answered question after question); and a cached generation costs only its output;
- in each trie, the longest suffix of the context (up to ``MAX_MATCH`` tokens) that was followed
  by something before is the match. Its continuations are scored by frequency (how often each
  followed the matched string), and a tree is grown best first by estimated path probability
  (the product of the frequencies on the path; at most ``nodes`` nodes, ``depth`` levels, paths
  below ``min_prob`` dropped);
- the budget adapts to the match: ``min(k, nodes, ceil(factor * match_len))`` (the paper's
  spec factor; at factor 4 a 1-token match earns 4 nodes, a 3-token one 12). ArcticInference
  defaults to 1; 4 suits a CPU, where a pass over 8-16 tokens costs little more than one: on
  the default model's recorded dev answers (offline greedy replay, k=16) factor 1 commits 1.77
  tokens per pass with 1.7 nodes, factor 4 1.96 with 4.0, prompt lookup at k=8 1.88 with 4.6;
- of the two trees (per-generation, global) the one with the higher score (sum of its path
  probabilities: the expected number of accepted tokens under the empirical model) is proposed.

Cost per step, whatever the history length: appending a token moves each *repeated* suffix of
the context one level down its trie (at most ``MAX_MATCH + depth``), and the global match is
kept incrementally the same way; a proposal reads the ``BRANCH`` best children of at most
``nodes`` nodes (see :mod:`.suffix_trie`). Adding a finished generation to the global cache
costs the same per token, paid once when the next generation starts (measured per step and
per cached generation: docs/trees.md, "The drafts").

Ownership: a drafter owns its :class:`SuffixCache`; nothing is shared through the process.
Whoever keeps the drafter object keeps the cache: one bench method across its questions, one
server across its requests, one planner replay. Two methods of one benchmark (even with the
same spec, or ``auto`` routed to ``suffix``) never see each other's answers. ``end(output)``
adds a finished generation's output to the cache; ``end(None)`` (a cancelled request, a
warm-up, a repeat that must not find its own answer) adds nothing.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftwise.core.draft import Capabilities, Draft
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree
from draftwise.drafters.suffix_trie import Node, Seq, SuffixTrie, Where, grow_tree
from draftwise.errors import ConfigError

MAX_MATCH = 16  # the longest context suffix matched; the tries hold MAX_MATCH + depth levels
# Memory a cached generation may take, for refusing a cache that cannot fit: a text repeated
# verbatim is the worst case (a node per level per token); this bound per level leaves a margin
# over what was measured (docs/trees.md, "The drafts").
BYTES_PER_TOKEN_LEVEL = 170
TOKENS_PER_GENERATION = 2048  # assumed size of one cached output, for that estimate


def cache_bytes(cache: int, depth: int) -> int:
    """A generous estimate of the memory ``cache`` cached generations take (see above)."""
    return cache * TOKENS_PER_GENERATION * (MAX_MATCH + depth) * BYTES_PER_TOKEN_LEVEL


def physical_memory() -> int | None:
    """This machine's RAM in bytes, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_suffix_options(nodes: int, depth: int, cache: int, factor: float, min_prob: float, most: int) -> None:
    """One-line errors for suffix options that cannot work (DraftSpec calls this)."""
    for key, n in (("nodes", nodes), ("depth", depth)):
        if not 1 <= n <= most:
            raise ConfigError(f"suffix:{key}={n} is out of range; use 1..{most}")
    if cache < 0:
        raise ConfigError(f"suffix:cache={cache} is negative; use 0 (off) or a number of generations")
    if not (0 < factor < math.inf) or not 0 <= min_prob < 1:
        raise ConfigError(f"suffix needs factor > 0 and 0 <= min_prob < 1, got factor={factor}, min_prob={min_prob}")
    need, ram = cache_bytes(cache, depth), physical_memory()
    if ram is not None and need > ram // 2:
        fit = (ram // 2) // cache_bytes(1, depth)
        raise ConfigError(
            f"suffix:cache={cache} could take ~{need / 2**30:.1f} GiB, over half of this machine's "
            f"{ram / 2**30:.1f} GiB of memory; use cache={fit} or less"
        )


class SuffixCache:
    """Outputs of the last ``capacity`` generations in one suffix trie, oldest evicted first.

    Thread-safe: one lock guards additions, evictions and the readers' walks.
    """

    def __init__(self, capacity: int, max_depth: int) -> None:
        if capacity < 0:
            raise ConfigError(f"a suffix cache holds 0 or more generations, got {capacity}")
        self.capacity = capacity
        self.trie = SuffixTrie(max_depth)
        self.seqs: deque[Seq] = deque()
        self.lock = threading.Lock()
        self.version = 0  # bumped on every change, so readers know to re-match

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, tokens: Sequence[int]) -> None:
        """Cache one generation's output (evicting the oldest past capacity)."""
        if self.capacity == 0 or not tokens:
            return
        with self.lock:
            seq = self.trie.new_seq()
            self.trie.extend(seq, tokens)
            self.seqs.append(seq)
            while len(self.seqs) > self.capacity:
                self.trie.remove(self.seqs.popleft())
            self.version += 1

    def clear(self) -> None:
        with self.lock:
            self.trie = SuffixTrie(self.trie.max_depth)
            self.seqs.clear()
            self.version += 1

    def generations(self) -> list[list[int]]:
        """The cached outputs, oldest first."""
        with self.lock:
            return [list(s.tokens) for s in self.seqs]


@dataclass(frozen=True)
class Proposal:
    """Where the last proposal came from: ``local`` (this generation), ``global`` (the cache)
    or ``none``; the match length, the node budget it earned and its score (expected number of
    accepted tokens under the empirical frequencies: the sum of its nodes' path ``probs``)."""

    source: str = "none"
    match_len: int = 0
    budget: int = 0
    score: float = 0.0
    probs: Sequence[float] = ()


class SuffixDrafter:
    """The suffix-decoding draft (a point mass: it has no distribution); proposes token trees.

    nodes:    most nodes per tree (the ``k`` passed to ``propose`` is a further cap).
    depth:    most levels per tree.
    factor:   nodes earned per matched token (the match-length-adaptive spec factor).
    min_prob: drop paths whose estimated probability is below this.
    cache:    the global cache of earlier outputs, or None for none (``cache=0``).
    """

    name = "suffix"

    def __init__(
        self,
        *,
        nodes: int = 16,
        depth: int = 8,
        factor: float = 4.0,
        min_prob: float = 0.1,
        cache: SuffixCache | None = None,
    ) -> None:
        if nodes < 1 or depth < 1:
            raise ConfigError(f"suffix needs nodes >= 1 and depth >= 1, got nodes={nodes}, depth={depth}")
        if not factor > 0 or not 0 <= min_prob < 1:
            raise ConfigError(f"suffix needs factor > 0 and 0 <= min_prob < 1, got {factor}, {min_prob}")
        self.nodes, self.depth, self.factor, self.min_prob = nodes, depth, factor, min_prob
        self.max_depth = MAX_MATCH + depth
        if cache is not None and cache.trie.max_depth != self.max_depth:
            raise ValueError(f"this cache holds {cache.trie.max_depth} levels; depth={depth} needs {self.max_depth}")
        self.cache = cache if cache is not None and cache.capacity > 0 else None
        self.capabilities = Capabilities(trees=True, scored=True, learns=self.cache is not None,
                                         replay="exact", cost="host")
        self.local: SuffixTrie | None = None
        self.seq = Seq(0)
        self.prompt_len = 0
        self.last = Proposal()
        self._where: list[Where] = []  # _where[l - 1]: the context's last l tokens in the cache
        self._version = -1

    # -- a generation -----------------------------------------------------------------------------

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Begin a generation (one that was never ended teaches the cache nothing)."""
        self._begin(prompt)

    def end(self, output: Sequence[int] | None) -> None:
        """End the generation: a finished one's ``output`` joins the global cache; None (a
        cancelled generation, a warm-up) adds nothing. Ending twice adds once."""
        if self.local is not None and self.cache is not None and output:
            self.cache.add(list(output))
        self.local = None

    def _begin(self, prompt: Sequence[int]) -> None:
        self.local = SuffixTrie(self.max_depth)
        self.seq = self.local.new_seq()
        self.local.extend(self.seq, prompt)
        self.prompt_len = len(prompt)
        self._where, self._version = [], -1

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if self.local is None:  # no start(): what the first call shows is the prompt
            self._begin(context)
        assert self.local is not None
        seen = len(self.seq.tokens)
        if len(context) < seen:
            raise ValueError("the context shrank: call start() for a new generation")
        new = context[seen:]
        self.local.extend(self.seq, new)
        best: tuple[list[int], list[int], Proposal] = ([], [], Proposal())
        local = self._local_match()
        if local is not None:
            best = self._grow(self.local, (local, 0), local.depth, k, "local", best)
        if self.cache is not None:
            with self.cache.lock:
                self._follow(new)
                match = self._global_match()
                if match is not None:
                    best = self._grow(self.cache.trie, match[0], match[1], k, "global", best)
        tokens, parents, self.last = best
        if not tokens:
            return Draft([])
        return Draft(tokens, tree=TokenTree(tokens, parents), scores=tuple(self.last.probs))

    def observe(self, num_accepted: int) -> None:
        pass  # committed tokens arrive with the next context

    # -- matching ---------------------------------------------------------------------------------

    def _local_match(self) -> Node | None:
        for node in self.seq.active:  # deepest first: the repeated suffixes of the context
            if node.depth <= MAX_MATCH and node.total > 0:
                return node
        return None

    def _follow(self, new: Sequence[int]) -> None:
        """Move the context's matches in the global trie along ``new`` tokens (re-match from
        the context's tail when the cache changed since)."""
        assert self.cache is not None
        if self._version != self.cache.version:
            self._version, new = self.cache.version, self.seq.tokens
        if len(new) >= MAX_MATCH:  # matches depend on the last MAX_MATCH tokens only
            self._where, new = [], new[-MAX_MATCH:]
        trie = self.cache.trie
        for t in new:
            first = trie.step((trie.root, 0), t)
            if first is None:
                self._where = []
                continue
            moved = [first]
            for where in self._where[: MAX_MATCH - 1]:
                nxt = trie.step(where, t)
                if nxt is None:
                    break
                moved.append(nxt)
            self._where = moved

    def _global_match(self) -> tuple[Where, int] | None:
        assert self.cache is not None
        for length in range(len(self._where), 0, -1):
            if self.cache.trie.continues(self._where[length - 1]):
                return self._where[length - 1], length
        return None

    def _grow(self, trie: SuffixTrie, where: Where, match_len: int, k: int, source: str,
              best: tuple[list[int], list[int], Proposal]) -> tuple[list[int], list[int], Proposal]:
        budget = min(k, self.nodes, math.ceil(self.factor * match_len - 1e-9))
        tokens, parents, probs = grow_tree(
            where, trie.children, budget=budget, max_depth=self.depth, min_prob=self.min_prob
        )
        score = sum(probs)
        if tokens and score > best[2].score:
            return tokens, parents, Proposal(source, match_len, budget, score, probs)
        return best
