"""One statistics object per generation, in the vocabulary of ``verify``.

Conventions:

- every target pass commits at least one token; the prefill pass commits the first token, so
  plain decoding has ``mean_committed_per_pass == 1`` exactly;
- ``mean_committed_per_pass`` (Spec-Bench's #MAT) includes the recovered or bonus token;
- ``acceptance_by_position[i]`` is the *conditional* rate a_i: of the steps that proposed a
  token at draft position i and accepted positions < i, the fraction that accepted position i.
  The cost model's E = 1 + sum_i prod_{j<=i} a_j uses exactly these rates;
- ``committed`` counts the tokens the generation kept (an ending EOS included; tokens past
  max_new_tokens or a stop condition are not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    proposed: int = 0  # tokens the target scored for drafts: a chain's length, a tree's nodes
    depth: int = 0  # draft positions offered: a chain's length, a tree's deepest path
    accepted: int = 0
    recovered: int = 0
    bonus: int = 0
    committed: int = 0
    target_passes: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    tested_at: list[int] = field(default_factory=list)  # [k]: proposals reaching position i
    accepted_at: list[int] = field(default_factory=list)  # [k]: of those, accepted at i
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed by each pass
    tree_passes: int = 0  # passes that verified a tree (not a chain)
    tree_nodes: int = 0  # nodes those passes verified
    #: tree passes only: ``rank_tested[d][r]`` = passes whose node at depth d had a child of rank
    #: r that was tried (every earlier sibling rejected); ``rank_accepted[d][r]`` = of those, the
    #: passes that accepted it. The planner's a[d][r] = accepted / tested.
    rank_tested: list[list[int]] = field(default_factory=list)
    rank_accepted: list[list[int]] = field(default_factory=list)

    def record(
        self, num_proposed: int, verdict: Any, kept: int, *, ranks: Sequence[tuple[int, int]] = (),
        depth: int | None = None,
    ) -> None:
        """Account for one target pass over ``num_proposed`` tokens (or tree nodes), of which
        ``kept`` stayed. ``depth``: the draft positions it offered (a tree's deepest path; None:
        a chain, ``num_proposed``), which the per-position rates count. ``ranks``: a tree pass's
        (children, accepted rank or -1) per depth."""
        positions = num_proposed if depth is None else depth
        if ranks:
            self._record_ranks(num_proposed, ranks)
        self.target_passes += 1
        self.proposed += num_proposed
        self.depth += positions
        self.accepted += verdict.accepted
        if num_proposed:
            if verdict.bonus:
                self.bonus += 1
            else:
                self.recovered += 1
        while len(self.tested_at) < positions:
            self.tested_at.append(0)
            self.accepted_at.append(0)
        # positions 0..accepted were tested; 0..accepted-1 accepted
        for i in range(min(verdict.accepted + 1, positions)):
            self.tested_at[i] += 1
        for i in range(verdict.accepted):
            self.accepted_at[i] += 1
        self.committed += kept
        self.accept_lengths.append(kept)

    def _record_ranks(self, nodes: int, ranks: Sequence[tuple[int, int]]) -> None:
        self.tree_passes += 1
        self.tree_nodes += nodes
        for d, (children, accepted) in enumerate(ranks):
            while len(self.rank_tested) <= d:
                self.rank_tested.append([])
                self.rank_accepted.append([])
            tested, hits = self.rank_tested[d], self.rank_accepted[d]
            tried = children if accepted < 0 else accepted + 1
            while len(tested) < children:
                tested.append(0)
                hits.append(0)
            for r in range(tried):
                tested[r] += 1
            if accepted >= 0:
                hits[accepted] += 1

    @property
    def nodes_per_tree_pass(self) -> float:
        return self.tree_nodes / self.tree_passes if self.tree_passes else 0.0

    @property
    def acceptance_by_depth_rank(self) -> list[list[float]]:
        """a[d][r] (see ``rank_tested``)."""
        return [[a / t if t else 0.0 for a, t in zip(hs, ts)] for hs, ts in zip(self.rank_accepted, self.rank_tested)]

    @property
    def mean_committed_per_pass(self) -> float:
        return self.committed / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / t if t else 0.0 for a, t in zip(self.accepted_at, self.tested_at)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "proposed": self.proposed,
            "depth": self.depth,
            "accepted": self.accepted,
            "recovered": self.recovered,
            "bonus": self.bonus,
            "committed": self.committed,
            "target_passes": self.target_passes,
            "mean_committed_per_pass": self.mean_committed_per_pass,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "tested_by_position": list(self.tested_at),
            "accept_lengths": list(self.accept_lengths),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "tree_passes": self.tree_passes,
            "nodes_per_tree_pass": self.nodes_per_tree_pass,
            "acceptance_by_depth_rank": self.acceptance_by_depth_rank,
            "rank_tested": [list(t) for t in self.rank_tested],
        }
