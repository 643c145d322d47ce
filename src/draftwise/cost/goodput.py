"""Goodput at batch: which k each sequence should propose when N requests share every pass, and
what that predicts for aggregate and per-request tokens/s at each concurrency N.

A batched step (:mod:`draftwise.core.engine`) runs one target pass over every running sequence's
rows. Sequence i, proposing k_i tokens with draft d_i, commits E_i(k_i) tokens on average and
feeds r_i(k_i) rows (k_i + 1 for a chain that always proposes). The step costs::

    T_step = T(B, R, c) + sum_i [D_i(k_i) + o(k_i)] + tau * sum_i E_i(k_i),   R = sum_i r_i + prefill rows

where T(B, R, c) is the measured batched pass (:class:`~draftwise.cost.batch_profile.BatchProfile`),
D the draft's cost and o(k) = step(k + 1) - forward(k + 1) the per-sequence verification
overhead, both from the ordinary :class:`~draftwise.cost.profile.Profile` (drafts and
verification run one sequence after another on the model's thread), and tau its per-token
overhead. A serving batch measures o itself, apart for a plain and a speculating sequence
(:class:`~draftwise.policy.outside_pass.OutsidePass`): the profile's one value for both charged
a plain sequence several times what it costs outside a batched pass and a speculating one nothing
more, so proposals looked cheaper than they were (docs/benchmarks.md, "Goodput at N concurrent
requests").
The step's goodput is ``sum_i E_i(k_i) / T_step``; k_i = 0 is a plain step (one row, no
draft). At N = 1 this is the single-stream speedup model; as the batch fills, a proposed row
costs about what another request's row would, so the best k falls, often to 0.

**Acceptance** (:class:`Outcome`, per category, draft and k): from a plan
(:func:`~draftwise.capacity.simulate.workload_from_plan`), each category's candidates give, per
(draft, k), the committed tokens per decoding step and the rows per step, 1 + proposed / steps.
``Candidate.mat`` counts the prefill's first token as a step of its own: over a category's C
answer tokens in U answers (turns), mat = C / (D + U) with D = C / mat - U decoding steps and
A = (mat - 1) (D + U) accepted tokens, so a decoding step commits 1 + A / D tokens and proposes
A / (D acceptance) (C and U from the plan's ``prompts``; without them D + U is taken for D). A
lookup that finds no match proposes nothing and costs one row. These are the replayed
per-category figures of the plan, not an i.i.d. model. Or from explicit conditional
per-position rates (:func:`~draftwise.capacity.simulate.workload_from_rates`):
E = 1 + sum_i prod_{j<=i} a_j, k + 1 rows.

**Choosing the k's** (:func:`choose_ks`): the objective is the goodput of the step's decoding
part (a prompt chunk in the same pass costs the same whatever the k's, so it is priced out:
counted against the step's tokens it would make every proposal look cheap). Local search:
start from the best *uniform* choice (every sequence at the same k, or the largest k its draft
has below it, k = 0 included: a measured pass costs less per row as its rows grow, so one
sequence's proposal may not pay where every sequence's does); each round, try every sequence at
every other k its draft offers (jumps, so a draft whose first token does not pay but whose
fourth does is still found; lower k's too), apply the single change that raises the objective
most, stop when none does (the rows budget bounds every change). Each round costs
O(B K) evaluations of the step's cost; the exhaustive :func:`best_ks_exhaustive` is the slow,
obviously correct reference that the tests compare it with.

The policy object the server would consult is in :mod:`draftwise.policy.batch`; the
workload and the simulation below are in :mod:`draftwise.capacity.simulate`.

**The workload** is the plan's: a *unit* is one question with all its turns, each turn one
request whose history holds the earlier answers (as the plan traces it, as bench and Spec-Bench
run it), each answer up to the plan's ``max_new_tokens``. The plan's acceptance is measured on
exactly that (second turns of MT-bench copy the first answer and accept far more than first
turns; later tokens of an answer accept more than early ones), so it predicts nothing else:
the validation (:mod:`draftwise.server.validate`) sends the same kind of units, and
:func:`~draftwise.capacity.simulate.workload_from_plan` takes ``units=`` to predict the very
requests it sent.

**Predicting a concurrency N** (:func:`~draftwise.capacity.simulate.predict`): a deterministic
simulation of the load test (:mod:`draftwise.server.validate`): N clients, each sending its
units one after the other and a unit's turns one after the other, the units shared as the load
test shares them (:func:`~draftwise.capacity.simulate.client_units`: R a client, or the same
units at every N). A joining request prefills its whole prompt (history
included) in chunks inside the batch (the engine's rule, :func:`draftwise.core.engine.step_chunk`), then decodes
with the policy's k, committing its expected tokens per step (fractional), until its answer's
length. Aggregate tokens/s = all tokens / the simulated wall time; per-request tokens/s = the
mean over requests (turns) of tokens / (end - start), start being when its client sent it.
Both are what the load test reports. Policies: ``plain``; ``fixed`` (every sequence one draft
at one k, for each draft and k of the plan); ``plan`` (each category's recommendation at N = 1,
kept at every N: what ``serve --draft auto`` does today); ``goodput`` (each category's draft, k
chosen every step by :func:`choose_ks`); and ``goodput:<draft>`` (that one draft for every
category).

**Intervals**: the plan gives each (category, draft, k) a 95% interval on its speedup, from its
binomial acceptance counts. With the step costs fixed a speedup is proportional to the tokens
per step, so the tokens per step at the interval's ends are E x lo / S and E x hi / S (never
below 1). Each policy is simulated with every category at its low end and at its high end:
errors treated as fully correlated, so the band is conservative. Timing noise is not in it.

**The crossover** N: the smallest N in the grid at which the best policy that always speculates
(the best ``fixed`` one) is predicted below 1.0x plain batching; ``None`` ("none") when there is
no such N. (The goodput policy can fall back to k = 0, so it is not the one that crosses; it
is reported beside, with the mean k it chooses. It maximises each step's goodput, which is
myopic, e.g. about a batch that is about to shrink, so it can land a little below the best
fixed k or plain; the tests hold it within 3% of the better of the two.)

>>> o = rates_outcomes([0.8], k_max=2)   # a = 0.8 at every position
>>> [round(o[k].tokens, 2) for k in (1, 2)], [o[k].rows for k in (1, 2)]
([1.8, 2.44], [2.0, 3.0])
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from draftwise.cost.batch_profile import BatchProfile
from draftwise.cost.formulas import expected_committed_by_position
from draftwise.cost.profile import Profile
from draftwise.cost.served import ServedProfile
from draftwise.errors import ConfigError

NONE = "none"


@dataclass(frozen=True)
class Outcome:
    """One (category, draft, k): expected committed ``tokens`` and fed ``rows`` per step, and the
    tokens per step at the low and high end of their interval."""

    tokens: float
    rows: float
    low: float
    high: float

    def at(self, scenario: str) -> float:
        return {"point": self.tokens, "low": self.low, "high": self.high}[scenario]


PLAIN = Outcome(1.0, 1.0, 1.0, 1.0)


def rates_outcomes(rates: Sequence[float], k_max: int) -> dict[int, Outcome]:
    """Outcomes for k = 1..k_max from conditional per-position rates (a chain that always proposes)."""
    if not rates or any(not 0 <= a <= 1 for a in rates):
        raise ConfigError(f"acceptance rates must be a non-empty list of numbers in [0, 1], not {list(rates)!r}")
    out = {}
    for k in range(1, k_max + 1):
        e = expected_committed_by_position(rates, k)
        out[k] = Outcome(e, k + 1.0, e, e)
    return out


# -- the step's cost --------------------------------------------------------------------------
@dataclass
class StepCost:
    """T_step of the module docstring, from a batch profile and (optional) an ordinary profile:
    without it, drafts and overheads cost nothing (a test's synthetic costs)."""

    batch: BatchProfile
    profile: Profile | None = None
    #: (plain, speculating): a sequence's seconds outside the pass at batch, as measured while
    #: serving (:class:`~draftwise.policy.outside_pass.OutsidePass`); None: the profile's overhead
    per_sequence: tuple[float, float] | None = None
    #: the served step as measured (:mod:`draftwise.cost.served`): its price outside the pass;
    #: the batch profile is already scaled to served passes (:meth:`served_from`). None: passes alone
    served: ServedProfile | None = None
    _draft: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)
    _overhead: tuple[float, float] | None = field(default=None, repr=False)  # (context, overhead) last asked

    def draft(self, draft: str, k: int) -> float:
        """D(k) of ``draft`` (0 for k = 0, plain, or no profile)."""
        if k == 0 or draft == NONE or self.profile is None:
            return 0.0
        key = (draft, k)
        if key not in self._draft:
            self._draft[key] = self.profile.draft_time(draft, k)
        return self._draft[key]

    def overhead(self, k: int, context: float) -> float:
        """A sequence's verification overhead beyond the pass, for k proposals: one value per
        context whatever k (:meth:`Profile.overhead <draftwise.cost.profile.Profile.overhead>`).
        The policy asks for every k of every sequence before each pass, one sequence's k's
        in a row, so the last context's value is kept. With :attr:`per_sequence` set (a
        server that measures its steps), a plain step's value (k = 0) and a speculating one's."""
        if k < 0:
            raise ConfigError(f"k={k} must be >= 0")
        if self.per_sequence is not None:
            return self.per_sequence[1] if k else self.per_sequence[0]
        if self.served is not None:
            return self.served.per_plain + (self.served.per_speculating if k else 0.0)
        if self.profile is None:
            return 0.0
        last = self._overhead
        if last is None or last[0] != context:
            last = self._overhead = (context, self.profile.overhead(1, context))
        return last[1]

    @classmethod
    def served_from(cls, batch: BatchProfile, profile: Profile | None, served: ServedProfile | None) -> StepCost:
        """The step as served: ``batch`` scaled to the served passes, ``served``'s price outside
        them (drafts still the profile's); ``served`` None: the passes alone."""
        if served is None:
            return cls(batch, profile)
        return cls(served.apply(batch), profile, served=served)

    @property
    def token_overhead(self) -> float:
        """Per committed token, beside the step (a served profile's per-sequence price holds it)."""
        if self.served is not None:
            return 0.0
        return self.profile.token_overhead if self.profile is not None else 0.0

    @property
    def step_overhead(self) -> float:
        """A step's seconds outside its pass whatever it holds (the served profile's; else 0)."""
        return self.served.step_seconds if self.served is not None else 0.0

    def seconds(self, batch: int, rows: float, context: float, extra: float, tokens: float) -> float:
        """One step: the pass, each sequence's draft and overhead (``extra``), the tokens' overhead
        and the step's own."""
        return (self.batch.pass_time(batch, rows, context) + extra + self.token_overhead * tokens
                + self.step_overhead)


@dataclass(frozen=True)
class Choice:
    """One sequence's options at this step: ``outcomes[k]`` for each k it may take (0 included)
    and ``extra[k]``, its draft and overhead seconds at that k."""

    outcomes: Mapping[int, Outcome]
    extra: Mapping[int, float]


def default_rows_budget(batch: BatchProfile, deciding: int, fixed_rows: float = 0.0) -> float:
    """The most rows a pass may hold when no budget is given: the rows not chosen (a prompt's
    chunk) and, for each of the ``deciding`` sequences, the largest rows per sequence the batch
    profile measured. (It was the batch times those rows, chunk included, so a pass carrying a
    whole 249-token prompt beside one decoding request left that request no proposal at all.)
    A chain's k is already capped below those rows, so the budget binds a scored tree's nodes;
    a pass past the measured rows is priced by extending the profile's last segment.

    >>> from draftwise.cost.batch_profile import BatchProfile
    >>> bp = BatchProfile(model="m", fingerprint="f", machine_fingerprint="x", dtype="float32", runtime="r",
    ...                   batches=[1, 2], rows=[1, 9], contexts=[128], times={128: [[0.01, 0.02], [0.02, 0.03]]})
    >>> default_rows_budget(bp, 1, fixed_rows=249)
    258.0
    """
    return float(fixed_rows) + deciding * batch.rows[-1]


def choose_ks(
    choices: Sequence[Choice], cost: StepCost, *, context: float, fixed_rows: float = 0.0, fixed_batch: int = 0,
    rows_budget: float | None = None, scenario: str = "point",
) -> list[int]:
    """Each sequence's k for this step, by local search from the best uniform k (module docstring).

    The objective is the goodput of the step's decoding part: its tokens over the seconds of a
    plain decode-only step of these n sequences plus what the proposals add to the whole pass
    (T(B, R) - T(B, R at k = 0), so a pass past its knee in rows prices each proposed row at the
    knee), their drafts and overheads. ``fixed_rows`` and ``fixed_batch``: rows and sequences in
    the pass that are not choosing (a prompt's chunk). Counting a chunk's seconds against the
    step's tokens would make the step look slow and every proposal cheap against it; the chunk
    costs the same whatever the k's. (Maximising each step's own goodput is myopic: a batch that
    is about to shrink is not planned for; the load simulation shows what that costs against the
    best fixed k, and ``tests/test_goodput.py`` checks it stays within a few percent.)
    ``rows_budget``: the most rows the pass may hold (default: :func:`default_rows_budget`)."""
    n = len(choices)
    if not n:
        return []
    batch = n + fixed_batch
    budget = rows_budget if rows_budget is not None else default_rows_budget(cost.batch, n, fixed_rows)
    curve = cost.batch.rows_curve(batch, context)
    tau = cost.token_overhead
    floor = fixed_rows + sum(c.outcomes[0].rows for c in choices)
    # the decode-only plain pass, less the chunk, and the step's own seconds
    base = cost.batch.rows_curve(n, context)(n) - curve(floor) + cost.step_overhead

    # The server runs this on the model's thread before every pass, so its cost is the policy's
    # own overhead: each sequence's options are flattened once, and the pass's price of a row
    # total, which the rounds ask for again and again, is looked up once per total. Same
    # arithmetic, same k's. (Pricing each row total again and interpolating each sequence's
    # overhead per k made the choice several times slower; StepCost keeps the overhead per
    # context. docs/benchmarks.md, "Goodput at N concurrent requests".)
    options = [[(k, o.rows, o.at(scenario), c.extra[k]) for k, o in c.outcomes.items()] for c in choices]
    priced: dict[float, float] = {}

    def seconds(rows: float, tokens: float, extra: float) -> float:
        pass_time = priced.get(rows)
        if pass_time is None:
            pass_time = priced[rows] = curve(rows)
        return base + pass_time + extra + tau * tokens

    def value(sel: Sequence[tuple[int, float, float, float]]) -> float:
        r = fixed_rows + sum(o[1] for o in sel)
        if r > budget + 1e-9:
            return -1.0
        t = sum(o[2] for o in sel)
        return t / seconds(r, t, sum(o[3] for o in sel))

    # The start: the best of every sequence at one k (or its largest k below it), k = 0 included.
    # A measured pass costs less per row as rows grow (a concave curve), so one sequence's
    # proposal may not pay where every sequence's does; an ascent from k = 0 stopped there
    # (a simulated load on a measured profile, N = 2-16: 6-73 distinct choices a run ended below
    # the best uniform k, some of them because of the budget :func:`default_rows_budget` fixed).
    starts = []
    for k in sorted({o[0] for opts in options for o in opts}):
        starts.append([max((o for o in opts if o[0] <= k), key=lambda o: o[0]) for opts in options])
    cur = max(starts, key=value)  # each sequence's option now; the first of the ties (k = 0 first)
    tokens = sum(o[2] for o in cur)
    rows = fixed_rows + sum(o[1] for o in cur)
    extra = sum(o[3] for o in cur)
    best = value(cur)
    for _ in range(2 * n * max(len(c.outcomes) for c in choices)):  # bounded: every move raises the objective
        move = None
        for i, opts in enumerate(options):
            k0, r0, t0, x0 = cur[i]
            for o in opts:
                if o[0] == k0:
                    continue
                r = rows - r0 + o[1]
                if r > budget + 1e-9:
                    continue
                t = tokens - t0 + o[2]
                v = t / seconds(r, t, extra - x0 + o[3])
                if v > best + 1e-12 * abs(best):
                    best, move = v, (i, o)
        if move is None:
            break
        i, o = move
        k0, r0, t0, x0 = cur[i]
        tokens += o[2] - t0
        rows += o[1] - r0
        extra += o[3] - x0
        cur[i] = o
    return [o[0] for o in cur]


def step_goodput(choices: Sequence[Choice], ks: Sequence[int], cost: StepCost, *, context: float,
                 fixed_rows: float = 0.0, fixed_batch: int = 0, scenario: str = "point") -> float:
    """The objective :func:`choose_ks` maximises, written out plainly: the step's decoding tokens
    per second of a plain decode-only pass of its n sequences plus what the k's add to the pass,
    their drafts, overheads and tokens' overhead."""
    n = len(choices)
    batch = n + fixed_batch
    tokens = sum(c.outcomes[k].at(scenario) for c, k in zip(choices, ks))
    rows = fixed_rows + sum(c.outcomes[k].rows for c, k in zip(choices, ks))
    plain_rows = fixed_rows + sum(c.outcomes[0].rows for c in choices)
    curve = cost.batch.rows_curve(batch, context)  # as choose_ks prices it: a chunk's rows at their share may
    added = curve(rows) - curve(plain_rows)  # number fewer than the pass's sequences
    seconds = (cost.batch.pass_time(n, n, context) + added + sum(c.extra[k] for c, k in zip(choices, ks))
               + cost.token_overhead * tokens + cost.step_overhead)
    return tokens / seconds


def best_ks_exhaustive(choices: Sequence[Choice], cost: StepCost, *, context: float, fixed_rows: float = 0.0,
                       fixed_batch: int = 0, rows_budget: float | None = None) -> tuple[list[int], float]:
    """Every combination of k's tried (slow; the reference :func:`choose_ks` is tested against)."""
    budget = rows_budget if rows_budget is not None else default_rows_budget(cost.batch, len(choices), fixed_rows)
    best: tuple[list[int], float] = ([0] * len(choices), -1.0)
    for combo in itertools.product(*(sorted(c.outcomes) for c in choices)):
        if fixed_rows + sum(c.outcomes[k].rows for c, k in zip(choices, combo)) > budget + 1e-9:
            continue
        g = step_goodput(choices, combo, cost, context=context, fixed_rows=fixed_rows, fixed_batch=fixed_batch)
        if g > best[1]:
            best = (list(combo), g)
    return best


