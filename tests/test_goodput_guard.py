"""The goodput guard (cost.goodput_guard): it measures the goodput policy's steps against plain
steps per kind of batch, from each step's wall time, and turns speculation off where it loses;
then as the batched server's coordinator follows it (every k 0, trees kept to none, one sequence
alone unguarded), and on the tiny model's engine, where outputs stay those of each prompt alone."""

from __future__ import annotations

from typing import Any

import pytest

from draftwise import generate
from draftwise.cost.adaptive import AdaptiveK
from draftwise.cost.goodput_guard import GoodputGuard
from draftwise.cost.goodput_policy import BatchGoodput, BatchKCoordinator
from draftwise.drafters.factory import make_drafter
from draftwise.engine import Engine
from draftwise.errors import ConfigError
from .test_goodput_policy import KNEE4, LINEAR, Costs, Fake, tiny_batched, tree  # noqa: F401 (a fixture)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drive(guard: GoodputGuard, clock: Clock, steps: int, *, n: int, spec_time: float, spec_tokens: float,
          prefill_rows: int = 0, start: int = 0, plain_time: float = 0.1) -> list[bool]:
    """``steps`` engine iterations of ``n`` sequences: a step the policy runs takes ``spec_time``
    and commits ``spec_tokens`` a sequence, a plain one ``plain_time`` and 1; each pass's
    outcomes are observed after the next step's first choice, as the engine orders them."""
    follows = []
    for e in range(start, start + steps):
        follow = guard.begin(e, n=n, prefill_rows=prefill_rows, prefilling=int(prefill_rows > 0), context=300.0)
        follows.append(follow)
        clock.t += spec_time if follow else plain_time
        if follow:  # every sequence verified 2 rows, and kept spec_tokens - 1 of them on average
            for _ in range(n):
                guard.observed(e + 1, positions=2, accepted=0)
            guard.observed(e + 1, positions=0, accepted=round((spec_tokens - 1) * n))
    return follows


def tokens(spec_tokens: float, n: int) -> float:
    """The tokens a sequence ``drive`` commits in a speculative step (its accepted count is whole)."""
    return 1 + round((spec_tokens - 1) * n) / n


def test_speculation_that_measures_slower_than_plain_steps_turns_off_and_is_still_explored() -> None:
    clock = Clock()
    guard = GoodputGuard(lambda b, r, c: 0.1, clock=clock)
    # each policy step takes 1.5x a plain step's time and commits 1.3 tokens a sequence: 0.87x
    follows = drive(guard, clock, 400, n=16, spec_time=0.15, spec_tokens=1.3)
    assert guard.margin(guard.kind(16, 0)) == pytest.approx(tokens(1.3, 16) - 1.5, rel=1e-6)
    late = follows[100:]
    assert 0 < sum(late) and sum(late) / len(late) == pytest.approx(1 / 32, abs=0.01)  # explored, 1 in 4 x 8
    assert sum(follows[:20]) > 10  # until both have samples, the policy runs (plain explored 1 in 8)


def test_speculation_that_pays_keeps_running_with_a_plain_step_now_and_then() -> None:
    clock = Clock()
    guard = GoodputGuard(lambda b, r, c: 0.1, clock=clock)
    follows = drive(guard, clock, 400, n=4, spec_time=0.12, spec_tokens=1.6)  # 1.33x
    assert guard.margin(guard.kind(4, 0)) == pytest.approx(tokens(1.6, 4) - 1.2, rel=1e-6)
    late = follows[100:]
    assert 1 - sum(late) / len(late) == pytest.approx(1 / 32, abs=0.01)
    # a small margin either way keeps exploring every 8th step
    clock2 = Clock()
    guard2 = GoodputGuard(lambda b, r, c: 0.1, clock=clock2)
    follows = drive(guard2, clock2, 200, n=4, spec_time=0.12, spec_tokens=1.25)  # a margin of 0.05
    assert 1 - sum(follows[50:]) / 150 == pytest.approx(1 / 8, abs=0.02)


def test_each_kind_of_batch_decides_for_itself_and_a_prompt_chunk_is_priced_out() -> None:
    clock = Clock()
    # a pass that carries a prompt chunk costs 4x a plain decode-only pass
    guard = GoodputGuard(lambda b, r, c: 0.4 if r > b else 0.1, clock=clock)
    e = 0
    for _ in range(20):
        # no chunk: 1.2 plain steps' time for 1.31 tokens a sequence, it pays
        follows_crowd = drive(guard, clock, 10, n=16, spec_time=0.12, spec_tokens=1.3, start=e)
        e += 10
        # beside a chunk: 1.5 tokens a sequence for 0.07 s more, 0.7 plain decode steps' time a
        # sequence's extra token: it does not pay, though tokens / seconds say 1.28x plain's (0.47 s
        # a step against 0.4) when the chunk's seconds are counted against them
        follows_chunk = drive(guard, clock, 10, n=16, spec_time=0.47, spec_tokens=1.5, prefill_rows=200,
                              start=e, plain_time=0.4)
        e += 10
    assert guard.margin((5, False)) == pytest.approx(tokens(1.3, 16) - 1.2)
    assert guard.margin((5, True)) == pytest.approx(1.5 - 1.7)
    assert sum(follows_crowd) >= 9 and sum(follows_chunk) <= 1
    assert set(guard.summary()) == {"n=16-31", "n=16-31 +prompt"}


def test_idle_gaps_and_skipped_passes_are_not_counted() -> None:
    clock = Clock()
    guard = GoodputGuard(lambda b, r, c: 0.1, clock=clock)
    guard.begin(0, n=2, prefill_rows=0, prefilling=0, context=50.0)
    clock.t += 5.0  # the server sat idle: 50x the pass's price
    guard.begin(1, n=2, prefill_rows=0, prefilling=0, context=50.0)
    clock.t += 0.1
    guard.begin(4, n=2, prefill_rows=0, prefilling=0, context=50.0)  # passes 2-4 ran without a choice
    clock.t += 0.1
    guard.begin(5, n=2, prefill_rows=0, prefilling=0, context=50.0)
    clock.t += 0.1
    guard.begin(6, n=2, prefill_rows=0, prefilling=0, context=50.0)
    assert guard.dropped == 2 and guard.samples((2, False)) == (1.0, 0.0)  # only pass 5's step counts


def test_bad_settings_are_refused() -> None:
    for kw in ({"explore": 1}, {"explore": True}, {"warmup": 0}, {"decay": 0.0}, {"decay": 1.5}):
        with pytest.raises(ConfigError):
            GoodputGuard(lambda b, r, c: 0.1, **kw)  # type: ignore[arg-type]


class Says:
    """A guard stand-in that answers every step with ``follow``, and records what it was told."""

    def __init__(self, follow: bool) -> None:
        self.follow, self.begun, self.seen = follow, [], []

    def begin(self, epoch: int, **shape: Any) -> bool:
        self.begun.append((epoch, shape["n"]))
        return self.follow

    def resize(self, epoch: int, **shape: Any) -> None:
        self.begun.append((epoch, shape["n"]))

    def observed(self, epoch: int, *, positions: int, accepted: int) -> None:
        self.seen.append((epoch, positions, accepted))


def test_the_coordinator_runs_plain_steps_when_the_guard_says_so() -> None:
    epoch, decisions = [0], []
    says = Says(False)
    coord = BatchKCoordinator(BatchGoodput(KNEE4, k_max=8), epoch=lambda: epoch[0], guard=says,  # type: ignore[arg-type]
                              on_guard=decisions.append)
    alone = coord.policy(Fake(alone_k=5), "lookup")
    assert alone.choose(100) == 5 and says.begun == []  # one sequence alone: its own policy, unguarded
    other = coord.policy(Fake(trees=True), "suffix")
    epoch[0] = 1
    assert alone.choose(100) == 5  # still alone: the other has not asked yet
    assert other.choose(100) == 0 and says.begun == [(1, 2)]  # it joins: a guarded step of two, plain
    assert len(other.trim(tree([0.95, 0.9, 0.9]), 100)) == 0 and other.adaptive.skipped == [3]  # kept to none
    epoch[0] = 2
    assert alone.choose(100) == 0 and other.choose(100) == 0  # a plain step: not even a tree is drafted
    assert says.begun == [(1, 2), (2, 2)] and decisions == [False, False]
    alone.observe(2, 1)
    assert says.seen == [(2, 2, 1)]
    says.follow = True
    epoch[0] = 3
    alone.choose(100)
    assert other.choose(100) == 8  # the policy runs: the tree is proposed whole again
    assert decisions == [False, False, True] and not coord.plain


def test_the_engine_under_the_guard_stays_exact(tiny_batched: Any, tiny: Any) -> None:
    """The real guard on the engine, with exploration every other step, so both modes run often."""
    prompts = [tiny.tokenizer.encode(t) for t in ("a b c d a b c d a b", "one two three one two three",
                                                  "red green blue red green blue")]
    eng = Engine(tiny_batched, max_batch=3, context=160, prefill_chunk=8)
    guard = GoodputGuard(LINEAR.pass_time, explore=2, warmup=1)
    decisions: list[bool] = []
    coord = BatchKCoordinator(BatchGoodput(KNEE4, Costs(), k_max=8), epoch=lambda: eng.stats.passes,  # type: ignore[arg-type]
                              guard=guard, on_guard=decisions.append)
    for draft in ("lookup", "suffix"):
        slots = [make_drafter(draft, m) for m in eng.slot_models]
        got = eng.generate_all(prompts, max_new_tokens=24, drafters=slots,
                               k=lambda: coord.policy(AdaptiveK(Costs(), draft), draft))  # type: ignore[arg-type]
        assert [r.token_ids for r in got] == [generate(tiny, p, max_new_tokens=24).token_ids for p in prompts]
    assert True in decisions and False in decisions
    assert sum(t.steps for t in guard.tallies.values()) > 0
