"""``--k auto``: the adaptive k policy, built from a measured profile's data.

:class:`AdaptiveK` implements the core :class:`~draftwise.core.kpolicy.KPolicy` protocol. Every step
it picks the k (or no speculation) that maximises expected tokens per second, from an online
estimate of per-position acceptance and the profile's measured costs. For k = 0..k_max::

    rate(k) = E(k) / (D(k) + step(k + 1, context)),   E(k) = 1 + sum_{i<k} prod_{j<=i} a_j

(:func:`~draftwise.cost.formulas.expected_committed_by_position`), where ``a_j`` is the conditional
acceptance at draft position j, estimated from the steps seen so far with exponentially decaying
counts (recent text matters more: a generation moves between copying and free writing), each
position shrunk towards the one before it, and ``D`` and ``step`` come from the profile. k = 0 is
a plain step. The chosen k caps the proposal: prompt lookup may still propose fewer tokens.

**Trees.** A draft that scores its tree (suffix decoding: each node's estimated probability
that its whole path is accepted, best first) proposes at the full node budget, and the policy
then keeps the prefix of its nodes (:meth:`AdaptiveK.trim`) that maximises::

    rate(n) = (1 + sum_{i<=n} min(1, lam s_i)) / step(n + 1, context)

(the expected committed tokens of a tree are 1 plus the sum over its nodes of the probability
that the node's path is accepted). ``lam`` calibrates the draft's scores on this generation:
the decayed ratio of tokens accepted to tokens the kept scores predicted (starting from the
draft's ratio over earlier generations, or 1), times the bias of the tree's size
(:class:`TreeSizes`, which the server shares between the requests of a draft). A draft's trees
of one size over-promise more than another's: suffix decoding's budget grows with its match,
and its short trees (from short matches) delivered a smaller share of their scores than its long
ones (docs/benchmarks.md, "Goodput at N concurrent requests"), so one ratio for both kept short
trees the batch did not pay for. Within a tree of each size, the
best node is priced apart from the others (:meth:`TreeSizes.rank_factors`): one ratio for every
node priced the best node at about 0.6 of what the target took and the deeper ones above it,
which kept the batch plain where one node paid. A tree trimmed to nothing still teaches it: its
best node is compared with the token the plain step commits, for free, so trees come back when
the draft turns right again.

When a draft costs next to nothing (prompt lookup) and the policy chose not to speculate, the
draft still proposes in the *shadow*: its first token is compared with the token the plain step
commits, so the estimate keeps learning and speculation resumes when the text turns
repetitive. A costly draft instead gets a one-token probe every ``probe_every`` plain steps.

**Unscored trees** (``lookup:branches=B``, ``eagle:...,topk=T``) get a node budget chosen as a
chain's k is, and their acceptance is counted by depth (the positions a tree offers), not by
node: what the drafter declares (:class:`~draftwise.core.draft.Capabilities`) decides which
of the three a draft gets.

:func:`auto_policy` builds the policy for a model and draft from the model's cached ``auto``
profile (:func:`resolve_profile` measures and caches one the first time, with fixed settings,
in a file of its own: ``draftwise profile`` writes another).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from draftwise.core.draft import Capabilities, Draft
from draftwise.cost.formulas import expected_committed_by_position, tokens_per_second
from draftwise.cost.measure import measure_profile
from draftwise.cost.profile import Profile, default_profile_path, locked
from draftwise.drafters.factory import capabilities_of
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.fsutil import check_writable

PRIOR_TOKENS = 4.0  # the calibration's prior weight: 4 tokens' worth at lam = 1
AUTO_MAX_N = 9  # the auto profile's largest pass (a k of 8, a tree of 8 nodes)
AUTO_REPEATS = 3


class StepCosts(Protocol):
    """The measured costs :class:`AdaptiveK` reads (a :class:`~draftwise.cost.profile.Profile`)."""

    max_n: int

    def step_time(self, n: int, context: float | None = None) -> float: ...

    def draft_time(self, draft: str, k: int) -> float: ...


class TreeSizes:
    """How much of its scores a scored tree delivers, by the number of nodes it proposed,
    relative to trees of every size: decayed counts of the draft tokens accepted against the
    scores the kept nodes predicted. One object may serve many generations of one draft (the
    server's requests), since a size's bias is the draft's, not one text's, and one generation
    sees too few trees of a size to learn it."""

    def __init__(self, sizes: int = 8, decay: float = 0.99) -> None:
        if not 0 < decay <= 1:
            raise ConfigError(f"decay={decay} must be in (0, 1]")
        self.decay = decay
        self.predicted = [0.0] * (sizes + 1)
        self.got = [0.0] * (sizes + 1)
        # per size: the best node against the rest, each as priced before this correction and as taken
        self.ranks_priced = [[0.0, 0.0] for _ in range(sizes + 1)]
        self.ranks_got = [[0.0, 0.0] for _ in range(sizes + 1)]

    def overall(self) -> float:
        """Draft tokens accepted per token the scores predicted, over every size (prior 1)."""
        return (sum(self.got) + PRIOR_TOKENS) / (sum(self.predicted) + PRIOR_TOKENS)

    def factor(self, size: int) -> float:
        """How much more (> 1) or less (< 1) than trees of every size trees of ``size`` deliver
        of their scores; 1 until they have been seen (a prior of :data:`PRIOR_TOKENS` tokens)."""
        b = min(max(size, 0), len(self.got) - 1)
        overall = self.overall()
        return (self.got[b] + PRIOR_TOKENS * overall) / (self.predicted[b] + PRIOR_TOKENS) / overall

    def record(self, size: int, predicted: float, got: float) -> None:
        b = min(max(size, 0), len(self.got) - 1)
        self.predicted[b] = self.predicted[b] * self.decay + predicted
        self.got[b] = self.got[b] * self.decay + got

    def rank_factors(self, size: int) -> tuple[float, float]:
        """How much more (> 1) or less (< 1) than a tree of ``size`` proposed nodes delivers of
        its price overall its best node delivers, and its other nodes (1 and 1 until seen, a
        prior of :data:`PRIOR_TOKENS` tokens each). The price is ``lam`` times the score, the
        same for every node; the target takes the best node more often than its score says,
        relative to the deeper ones, while a whole tree delivers less than its scores promise
        (docs/benchmarks.md, "Goodput at N concurrent requests"). Relative to the size's overall ratio, which
        ``lam`` and :meth:`factor` already carry: the two factors move expected tokens between
        the best node and the rest, and do not scale them again. By size, because a short
        tree's deep nodes (from a short match) deliver less than a long tree's."""
        b = min(max(size, 0), len(self.got) - 1)
        got, priced = self.ranks_got[b], self.ranks_priced[b]
        overall = (sum(got) + PRIOR_TOKENS) / (sum(priced) + PRIOR_TOKENS)
        weights = [p + PRIOR_TOKENS for p in priced]
        ratios = [(g + PRIOR_TOKENS * overall) / w for g, w in zip(got, weights)]
        mean = sum(w * r for w, r in zip(weights, ratios)) / sum(weights)  # as priced: the factors average 1
        return ratios[0] / mean, ratios[1] / mean

    def record_ranks(self, size: int, first: tuple[float, float], rest: tuple[float, float] = (0.0, 0.0)) -> None:
        """A tree of ``size`` proposed nodes: its best node (``first``) and its other kept nodes
        (``rest``), each as ``(priced, got)``: priced by ``lam`` alone, got in tokens accepted."""
        b = min(max(size, 0), len(self.got) - 1)
        for i, (priced, got) in enumerate((first, rest)):
            self.ranks_priced[b][i] = self.ranks_priced[b][i] * self.decay + priced
            self.ranks_got[b][i] = self.ranks_got[b][i] * self.decay + got


class AdaptiveK:
    """Chooses k per step to maximise expected tokens per second (see the module docstring)."""

    def __init__(
        self,
        profile: StepCosts,
        draft: str,
        *,
        capabilities: Capabilities | None = None,
        k_max: int | None = None,
        decay: float = 0.95,
        prior: tuple[float, float] = (1.0, 2.0),
        probe_every: int = 16,
        tree_sizes: TreeSizes | None = None,
    ) -> None:
        if k_max is not None and k_max < 1:
            raise ConfigError(f"k_max={k_max} must be >= 1")
        if not 0 < decay <= 1:
            raise ConfigError(f"decay={decay} must be in (0, 1]")
        #: what the draft declares (capabilities_of(draft) when not given)
        self.capabilities = capabilities if capabilities is not None else capabilities_of(draft)
        #: a draft that scores its trees: propose at the full budget, then trim (see the docstring)
        self.trees = self.capabilities.tree_policy == "scored"
        # k_max: the most tokens a step proposes (default: 8 for a chain, the profile's widest for a tree)
        default = profile.max_n - 1 if self.trees else 8
        self.k_max = min(default if k_max is None else k_max, profile.max_n - 1)
        self.profile = profile
        self.draft = draft
        self.decay = decay
        self.prior_hits, self.prior_tests = prior
        self.tested = [0.0] * self.k_max
        self.hits = [0.0] * self.k_max
        self.predicted, self.got, self._pending, self._shadow = 0.0, 0.0, 0.0, 0.0
        self._ranks: tuple[float, float] | None = None  # the kept tree's best node and rest, priced by lam
        #: each size of proposed tree's bias (shared between generations when given)
        self.tree_sizes = tree_sizes if tree_sizes is not None else TreeSizes(self.k_max)
        self._size = 0
        self.draft_cost = [profile.draft_time(draft, k) for k in range(1, self.k_max + 1)]
        self.shadow = self.draft_cost[0] < 0.02 * profile.step_time(1)
        self.probe_every = probe_every
        self._plain_run = 0

    def rates(self) -> list[float]:
        """The current conditional acceptance estimate a_j for each draft position j.

        Position 0 starts from the prior; each deeper position starts from the estimate of the
        one before it (as ``prior_tests`` pseudo-observations), because deep positions are
        tested only after every earlier one was accepted, so they are seen rarely, and a run of
        copied text that got that far tends to go on. A flat prior there kept ``auto`` at too
        small a k on long copies (translation, rag).
        """
        out: list[float] = []
        prior_hits, prior_tests = self.prior_hits, self.prior_tests
        for h, t in zip(self.hits, self.tested):
            rate = (h + prior_hits) / (t + prior_tests)
            out.append(rate)
            prior_hits = rate * self.prior_tests
        return out

    def expected_rate(self, k: int, context_len: int, rates: Sequence[float] | None = None) -> float:
        """Expected committed tokens per second at this k."""
        rates = self.rates() if rates is None else rates
        cost = self.profile.step_time(k + 1, context_len) + (self.draft_cost[k - 1] if k else 0.0)
        return tokens_per_second(expected_committed_by_position(rates, k), cost)

    def choose(self, context_len: int) -> int:
        if self.trees:
            return self.k_max  # the tree is trimmed once proposed
        rates = self.rates()
        best_k, best = 0, self.expected_rate(0, context_len, rates)
        for k in range(1, self.k_max + 1):
            r = self.expected_rate(k, context_len, rates)
            if r > best:
                best_k, best = k, r
        if best_k == 0 and not self.shadow:
            self._plain_run += 1
            if self._plain_run >= self.probe_every:
                self._plain_run = 0
                best_k = 1  # a probe keeps a costly draft's estimate alive
        else:
            self._plain_run = 0
        return best_k

    def calibration(self, size: int | None = None) -> float:
        """lam: tokens accepted per token the kept trees' scores predicted on this generation,
        net of each size's bias (decayed; its prior is the draft's ratio over the generations its
        :class:`TreeSizes` has seen, 1 before any), times, for trees of ``size`` proposed nodes,
        that size's bias."""
        lam = (self.got + PRIOR_TOKENS * self.tree_sizes.overall()) / (self.predicted + PRIOR_TOKENS)
        return lam if size is None else lam * self.tree_sizes.factor(size)

    def node_tokens(self, scores: Sequence[float], size: int) -> list[float]:
        """Each node's expected accepted draft tokens, for the best ``len(scores)`` nodes of a
        scored tree that proposed ``size``: ``min(1, lam s_i)`` with ``lam`` for that size,
        times that size's correction for its best node or for the others
        (:meth:`TreeSizes.rank_factors`)."""
        lam = self.calibration(size)
        first, rest = self.tree_sizes.rank_factors(size)
        return [min(1.0, lam * s * (first if i == 0 else rest)) for i, s in enumerate(scores)]

    def trim(self, draft: Draft, context_len: int, size: int | None = None) -> Draft:
        """The prefix of a scored tree with the most expected tokens per second (no node kept:
        a plain step); a draft without scores is returned as it is. ``size``: the nodes the
        draft proposed, when ``draft`` is already a prefix of its proposal (its calibration's)."""
        if not self.trees or draft.scores is None or not draft.tokens:
            return draft
        self._size = len(draft.tokens) if size is None else size
        best_n, best, total = 0, 1.0 / self.profile.step_time(1, context_len), 0.0
        for n, tokens in enumerate(self.node_tokens(draft.scores[: self.k_max], self._size), 1):
            total += tokens
            rate = (1.0 + total) / self.profile.step_time(n + 1, context_len)
            if rate > best:
                best_n, best = n, rate
        self._pending = sum(draft.scores[:best_n])
        self._note_ranks(draft.scores[:best_n] if best_n else draft.scores[:1], kept=bool(best_n))
        return draft.prefix(best_n)

    def skip(self, draft: Draft) -> Draft:
        """A scored tree of which none is kept (the batch did not pay for it): a plain step,
        whose committed token still checks the tree's best node, as :meth:`trim` does when it
        keeps nothing, so the calibration for its size keeps learning."""
        if self.trees and draft.scores and draft.tokens:
            self._size, self._pending = len(draft.tokens), 0.0
            self._note_ranks(draft.scores[:1], kept=False)
        return draft.prefix(0)

    def _note_ranks(self, scores: Sequence[float], *, kept: bool) -> None:
        """What the step will check: the kept nodes' scores (their best node and the rest,
        priced by ``lam`` alone, for :meth:`TreeSizes.record_ranks`), or, kept none, the best
        node's score for the shadow check."""
        lam = self.calibration(self._size)
        priced = [min(1.0, lam * s) for s in scores]
        self._ranks = (priced[0], sum(priced[1:])) if scores else None
        self._shadow = scores[0] if scores and not kept else 0.0

    def _update(self, positions: int, accepted: int) -> None:
        for j in range(self.k_max):
            self.tested[j] *= self.decay
            self.hits[j] *= self.decay
        for j in range(min(accepted + 1, positions, self.k_max)):
            self.tested[j] += 1
        for j in range(min(accepted, self.k_max)):
            self.hits[j] += 1

    def observe(self, positions: int, accepted: int) -> None:
        """A verified step: ``accepted`` of ``positions`` draft positions (a chain's length, a
        tree's depth)."""
        if positions:
            self._update(positions, accepted)
        if self._pending:
            self._calibrate(self._pending, accepted)
            self._pending = 0.0
            if self._ranks is not None:
                first = min(accepted, 1)
                self.tree_sizes.record_ranks(self._size, (self._ranks[0], first), (self._ranks[1], accepted - first))
                self._ranks = None

    def _calibrate(self, predicted: float, got: float) -> None:
        """A kept tree's scores predicted ``predicted`` draft tokens and ``got`` were accepted.
        This generation's ratio counts the prediction net of its size's bias, which the
        size's own counts learn, so that the two multiply without counting the bias twice."""
        self.predicted = self.predicted * self.decay + predicted * self.tree_sizes.factor(self._size)
        self.got = self.got * self.decay + got
        self.tree_sizes.record(self._size, predicted, got)

    def observe_shadow(self, proposal: Sequence[int], committed: Sequence[int]) -> None:
        """A plain step with a shadow proposal: did its first token match what was committed?"""
        if proposal and committed:
            self._update(1, int(proposal[0] == committed[0]))
            if self._shadow:  # a tree trimmed to nothing: its best node against the committed token
                hit = int(proposal[0] == committed[0])
                self._calibrate(self._shadow, hit)
                if self._ranks is not None:
                    self.tree_sizes.record_ranks(self._size, (self._ranks[0], hit))
                    self._ranks = None
                self._shadow = 0.0


def auto_policy(
    model: Any, draft: DraftSpec | str, *, capabilities: Capabilities | None = None, status: Any = None
) -> AdaptiveK:
    """The adaptive-k policy for ``draft`` on ``model``, from its auto profile (measured if
    missing); ``capabilities``: the drafter's own statement (default: what the spec declares)."""
    key = str(DraftSpec.parse(draft))
    return AdaptiveK(resolve_profile(model, key, status=status), key, capabilities=capabilities)


def _cached_auto_profile(model: Any, path: Any) -> Profile | None:
    """The auto profile at ``path`` if it is sound, made for ``model`` with the auto settings."""
    if not path.exists():
        return None
    try:
        profile = Profile.load(path)
        profile.check_model(model)
    except ConfigError:
        return None  # corrupt, or made on another model: measure a fresh one
    return profile if profile.max_n == AUTO_MAX_N else None


def _serves(profile: Profile | None, wanted: set[str]) -> bool:
    """Whether a cached ``profile`` holds current costs for every draft of ``wanted``."""
    return profile is not None and wanted <= set(profile.drafts) and not profile.stale_drafts(wanted)


def resolve_profile(
    model: Any, draft: DraftSpec | str | Sequence[DraftSpec | str], *, status: Any = None
) -> Profile:
    """The model's cached ``auto`` profile, measured now (and cached) if missing, lacking a
    draft or holding a stale one (:meth:`~draftwise.cost.profile.Profile.stale_drafts`);
    ``draft`` is one spec or several, and all missing ones are measured in one go, always
    with the same settings (:data:`AUTO_MAX_N`, :data:`AUTO_REPEATS`), so ``--k auto`` behaves
    the same whichever command ran first.

    Two processes resolving at once take turns (a file lock): the second finds what the first
    measured and adds its own drafts, so no one's entries are lost. The cache folder is checked
    for writing *before* measuring, so a read-only cache fails in a second with one line.
    """
    path = default_profile_path(model, "auto")
    specs = [draft] if isinstance(draft, (str, DraftSpec)) else list(draft)
    wanted = {str(DraftSpec.parse(d)) for d in specs} - {"none"}
    profile = _cached_auto_profile(model, path)
    if _serves(profile, wanted):
        return profile
    try:
        check_writable(path.parent, "profile cache folder")
    except ConfigError as exc:
        raise ConfigError(f"{exc} (set DRAFTWISE_CACHE to a writable folder)") from None
    with locked(path):
        profile = _cached_auto_profile(model, path)  # another process may have just written it
        if _serves(profile, wanted):
            return profile
        if status is not None:
            status(f"measuring this machine's costs for --k auto (once; cached at {path})")
        drafts = sorted({*(profile.drafts if profile else {}), *wanted})
        room = model.runtime.max_context - AUTO_MAX_N - 8
        contexts = sorted({min(128, room // 4), min(1024, room)})
        fresh = measure_profile(model, drafts=drafts, max_n=AUTO_MAX_N, contexts=contexts,
                                repeats=AUTO_REPEATS, progress=False)
        fresh.save(path)
    return fresh
