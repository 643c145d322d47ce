"""Verification, layer by layer: hand-built cases from +-100 logits (probabilities ~0 or ~1),
exact-probability checks on a 3-token vocabulary, and hypothesis properties of any verdict.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftwise.core.verify import Verdict, verify_greedy, verify_sampled

VOCAB = 6
HIGH, LOW = 100.0, -100.0


def peaked_logits(rows: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """[len(rows), vocab] logits: +100 at the listed tokens of each row, -100 elsewhere."""
    out = torch.full((len(rows), vocab), LOW)
    for i, tokens in enumerate(rows):
        out[i, tokens] = HIGH
    return out


def peaked_probs(rows: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """Their softmax: uniform over each row's listed tokens, exactly 0 elsewhere (exp(-200))."""
    return peaked_logits(rows, vocab).softmax(dim=-1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def four_sigma(p: float, n: int) -> float:
    """Four binomial standard deviations of a frequency estimated from n trials."""
    return 4.0 * math.sqrt(p * (1.0 - p) / n)


# -- greedy -----------------------------------------------------------------------------------


def test_greedy_all_accepted_commits_the_bonus():
    logits = peaked_logits([[3], [1], [4], [0]])  # target says 3, 1, 4, then 0
    assert verify_greedy([3, 1, 4], logits) == Verdict(accepted=3, tokens=[3, 1, 4, 0], bonus=True)


def test_greedy_first_rejected_commits_the_target_token():
    logits = peaked_logits([[3], [1], [4], [0]])
    assert verify_greedy([2, 1, 4], logits) == Verdict(accepted=0, tokens=[3], bonus=False)


def test_greedy_middle_rejected():
    logits = peaked_logits([[3], [1], [4], [0]])
    # later agreement (x_3 == 4) must not count after a mismatch at x_2
    assert verify_greedy([3, 5, 4], logits) == Verdict(accepted=1, tokens=[3, 1], bonus=False)


def test_greedy_with_no_proposal_is_a_plain_step():
    assert verify_greedy([], peaked_logits([[5]])) == Verdict(accepted=0, tokens=[5], bonus=True)


# -- sampled, with a draft distribution q -----------------------------------------------------


def test_sampled_all_accepted_bonus_comes_from_the_last_row():
    # p is certain of 3, 1, then 5 at the bonus position; q put only some mass on its tokens,
    # so min(1, p/q) = 1 everywhere
    p = peaked_probs([[3], [1], [5]])
    q = peaked_probs([[3, 0], [1, 2]])
    for seed in range(20):
        assert verify_sampled([3, 1], q, p, gen(seed)) == Verdict(2, [3, 1, 5], True)


def test_sampled_first_rejected_recovers_from_the_residual():
    # p = {0: 1/2, 1: 1/2}; q = {1: 1/2, 4: 1/2}; the draft proposed 4 (p(4) = 0: always rejected).
    # norm(max(0, p - q)) = {0: 1}: the recovered token is always 0; sampling it from p instead
    # would give 1 half the time.
    p = peaked_probs([[0, 1], [2], [3]])
    q = peaked_probs([[1, 4], [2]])
    for seed in range(40):
        assert verify_sampled([4, 2], q, p, gen(seed)) == Verdict(0, [0], False)


def test_sampled_middle_rejected():
    p = peaked_probs([[3], [0, 1], [5], [2]])
    q = peaked_probs([[3], [1, 4], [5]])
    for seed in range(40):
        assert verify_sampled([3, 4, 5], q, p, gen(seed)) == Verdict(1, [3, 0], False)


def test_sampled_token_with_zero_draft_probability_is_accepted_when_p_is_positive():
    # q(x) = 0 (the draft "could not" have proposed x): min(1, p/q) is 1, no division by zero
    p = peaked_probs([[2], [4]])
    q = peaked_probs([[1]])
    assert verify_sampled([2], q, p, gen(0)) == Verdict(1, [2, 4], True)


# -- sampled, point-mass drafts (no distribution) ---------------------------------------------


def test_point_mass_accepted_when_target_is_certain():
    p = peaked_probs([[3], [1], [5]])
    for seed in range(20):
        assert verify_sampled([3, 1], None, p, gen(seed)) == Verdict(2, [3, 1, 5], True)


def test_point_mass_rejected_when_target_gives_it_nothing():
    p = peaked_probs([[3], [0, 1], [5]])
    for seed in range(20):
        verdict = verify_sampled([3, 4], None, p, gen(seed))
        assert verdict.accepted == 1 and not verdict.bonus
        assert verdict.tokens[0] == 3 and verdict.tokens[1] in (0, 1)


def test_point_mass_recovered_token_is_never_the_rejected_one():
    # p(x) = 1/2: x is rejected about half the time, and then the residual (p without x) is a
    # point mass on the other token; a recovered token sampled from p would be x half the time
    p = peaked_probs([[2, 4], [0]])
    outcomes = {"accepted": 0, "rejected": 0}
    for seed in range(200):
        verdict = verify_sampled([2], None, p, gen(seed))
        if verdict.accepted:
            assert verdict == Verdict(1, [2, 0], True)
            outcomes["accepted"] += 1
        else:
            assert verdict == Verdict(0, [4], False)
            outcomes["rejected"] += 1
    assert min(outcomes.values()) > 50, outcomes


# -- exact probabilities on a 3-token vocabulary ----------------------------------------------

TRIALS = 8_000  # verifications per check below; every tolerance is 4 sigma at its own n
# What that still catches, in binomial sigmas of the right frequency (exact arithmetic from P, Q
# and p2; the bugs the comments above and the docstrings below name):
# - recovered from p, not norm(max(0, p - q)): ~540 recovered 2s where 0 are allowed; recovered
#   0 at 1/2, not 2/3: 21 sigma; committed 2 at 0.2175, not 0.15: 17 sigma;
# - point mass recovered from p, not p without x: ~2000 recovered 0s where 0 are allowed;
#   recovered 1 at 0.35, not 0.7: 48 sigma;
# - one uniform for both positions: pair (2, 0) at 0.06, not 0.015: 33 sigma (both accepted:
#   8.6 sigma).
# The price of 8,000 over 20,000: a frequency near 1/2 must be off by 0.022 (not 0.014) to fail.
P = torch.tensor([0.5, 0.35, 0.15])  # target
Q = torch.tensor([0.2, 0.2, 0.6])  # draft
# min(1, p/q) per token: [1, 1, 0.25]; averaged over x ~ q: sum(min(p, q)) = 0.2 + 0.2 + 0.15
ACCEPT_BY_TOKEN = [1.0, 1.0, 0.25]
ACCEPT = 0.55
RESIDUAL = [2 / 3, 1 / 3, 0.0]  # norm(max(0, p - q)) = norm([0.3, 0.15, 0])


def test_acceptance_rate_and_residual_match_the_formulas():
    """x ~ q, one verification: P(accept | x) = min(1, p(x)/q(x)); recovered ~ norm(max(0, p-q));
    and the committed first token is distributed exactly as p. Tolerances: 4 binomial sigmas."""
    g_draft, g_verify = gen(11), gen(12)
    target = torch.stack([P, P])  # [k + 1, vocab]: row 1 (the bonus) is unused here
    proposed = torch.multinomial(Q, TRIALS, replacement=True, generator=g_draft).tolist()
    tried, kept = [0, 0, 0], [0, 0, 0]
    recovered = [0, 0, 0]
    first = [0, 0, 0]
    for x in proposed:
        verdict = verify_sampled([x], Q[None], target, g_verify)
        tried[x] += 1
        kept[x] += verdict.accepted
        if not verdict.accepted:
            recovered[verdict.tokens[0]] += 1
        first[verdict.tokens[0]] += 1
    accept_rate = sum(kept) / TRIALS
    assert abs(accept_rate - ACCEPT) <= four_sigma(ACCEPT, TRIALS), accept_rate
    for x in range(3):
        rate = kept[x] / tried[x]
        expect = ACCEPT_BY_TOKEN[x]
        assert abs(rate - expect) <= four_sigma(expect, tried[x]) + 1e-12, (x, rate)
    n_rec = sum(recovered)
    assert n_rec == TRIALS - sum(kept)
    for t in range(3):
        freq = recovered[t] / n_rec
        assert abs(freq - RESIDUAL[t]) <= four_sigma(RESIDUAL[t], n_rec) + 1e-12, (t, freq)
    for t in range(3):  # the lossless property itself: what is committed follows p
        freq = first[t] / TRIALS
        assert abs(freq - float(P[t])) <= four_sigma(float(P[t]), TRIALS), (t, freq)


def test_point_mass_acceptance_rate_and_residual_match_the_formulas():
    """A point mass on x = 0: accepted with probability p(0); the recovered token follows p with
    0 removed, renormalised ([0, 0.7, 0.3]); the committed token again follows p."""
    g = gen(13)
    target = torch.stack([P, P])
    accepted = 0
    recovered = [0, 0, 0]
    first = [0, 0, 0]
    for _ in range(TRIALS):
        verdict = verify_sampled([0], None, target, g)
        accepted += verdict.accepted
        if not verdict.accepted:
            recovered[verdict.tokens[0]] += 1
        first[verdict.tokens[0]] += 1
    p0 = float(P[0])
    assert abs(accepted / TRIALS - p0) <= four_sigma(p0, TRIALS)
    assert recovered[0] == 0
    n_rec = TRIALS - accepted
    expect = [0.0, 0.35 / 0.5, 0.15 / 0.5]
    for t in (1, 2):
        assert abs(recovered[t] / n_rec - expect[t]) <= four_sigma(expect[t], n_rec)
    for t in range(3):
        assert abs(first[t] / TRIALS - float(P[t])) <= four_sigma(float(P[t]), TRIALS)


def test_two_positions_accept_independently_and_commit_p_times_p():
    """k = 2 with fixed rows (the target's next-token distribution does not depend on the
    context here): both accepted with probability a_1 * a_2, a_i = sum(min(p_i, q_i)), and the
    first two output tokens (a second pass when only one was committed) follow p_1 x p_2 exactly.
    A verifier that reused one uniform u for both positions would accept both with
    E[min(r_1, r_2)] = 0.375 (r_i = min(1, p_i/q_i) of the drawn x_i), not 0.33; and after
    accepting x_1 = 2 (r_1 = 0.25, so u < 0.25) it would accept x_2 = 0 (r_2 = 0.2) with 0.8, not
    0.2: the pair (2, 0) would come 0.06 of the time, not 0.015."""
    p2 = torch.tensor([0.1, 0.6, 0.3])
    q2 = torch.tensor([0.5, 0.3, 0.2])
    a1, a2 = ACCEPT, 0.1 + 0.3 + 0.2
    target = torch.stack([P, p2, p2])  # [k + 1, vocab]; the bonus row is p2 again
    draft = torch.stack([Q, q2])  # [k, vocab]
    g = gen(15)
    xs1 = torch.multinomial(Q, TRIALS, replacement=True, generator=g).tolist()
    xs2 = torch.multinomial(q2, 2 * TRIALS, replacement=True, generator=g).tolist()
    both = 0
    pairs = torch.zeros(3, 3)
    for n in range(TRIALS):
        verdict = verify_sampled([xs1[n], xs2[n]], draft, target, g)
        both += verdict.accepted == 2
        tokens = verdict.tokens
        if len(tokens) == 1:  # the next pass proposes x ~ q2 against p2
            x = xs2[TRIALS + n]
            tokens = tokens + verify_sampled([x], q2[None], torch.stack([p2, p2]), g).tokens
        pairs[tokens[0], tokens[1]] += 1
    assert abs(both / TRIALS - a1 * a2) <= four_sigma(a1 * a2, TRIALS), both / TRIALS
    expect = P[:, None] * p2[None, :]
    for i in range(3):
        for j in range(3):
            e = float(expect[i, j])
            assert abs(float(pairs[i, j]) / TRIALS - e) <= four_sigma(e, TRIALS), (i, j)


def test_bonus_token_follows_the_row_after_the_last_proposed_one():
    # row 0 accepts x = 1 surely; the bonus must come from row 1 = [0.25, 0, 0.75], never row 0
    target = torch.tensor([[0.0, 1.0, 0.0], [0.25, 0.0, 0.75]])
    g = gen(14)
    n = 4000
    counts = [0, 0, 0]
    for _ in range(n):
        verdict = verify_sampled([1], torch.tensor([[0.0, 1.0, 0.0]]), target, g)
        assert verdict.accepted == 1 and verdict.bonus
        counts[verdict.tokens[1]] += 1
    assert counts[1] == 0
    assert abs(counts[2] / n - 0.75) <= four_sigma(0.75, n)


# -- properties -------------------------------------------------------------------------------


def _rows(draw, n: int, vocab: int) -> torch.Tensor:
    """n probability rows of width vocab from hypothesis-drawn weights (zeros allowed)."""
    weights = draw(
        st.lists(
            st.lists(st.floats(0.0, 1.0), min_size=vocab, max_size=vocab), min_size=n, max_size=n
        )
    )
    t = torch.tensor(weights, dtype=torch.float32).reshape(n, vocab)
    t[t.sum(-1) == 0] = 1.0  # an all-zero row becomes uniform
    return t / t.sum(-1, keepdim=True)


@st.composite
def sampled_cases(draw):
    k = draw(st.integers(0, 6))
    vocab = draw(st.integers(2, 6))
    p = _rows(draw, k + 1, vocab)  # [k + 1, vocab]
    q = _rows(draw, k, vocab) if (k and draw(st.booleans())) else None  # [k, vocab] or None
    proposed = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
    seed = draw(st.integers(0, 2**32 - 1))
    return proposed, q, p, seed


def check_verdict(verdict: Verdict, proposed: list[int]) -> None:
    k = len(proposed)
    assert 1 <= len(verdict.tokens) <= k + 1
    assert verdict.accepted == len(verdict.tokens) - 1
    assert verdict.tokens[: verdict.accepted] == list(proposed[: verdict.accepted])
    assert verdict.bonus == (verdict.accepted == k)


@settings(max_examples=300, deadline=None)
@given(sampled_cases())
def test_verify_sampled_verdict_shape(case):
    proposed, q, p, seed = case
    verdict = verify_sampled(proposed, q, p, gen(seed))
    check_verdict(verdict, proposed)
    # nothing the target gives probability 0 is ever committed (accepted, recovered or bonus)
    for i, token in enumerate(verdict.tokens):
        assert float(p[i, token]) > 0.0, (i, token)


@st.composite
def greedy_cases(draw):
    k = draw(st.integers(0, 6))
    vocab = draw(st.integers(2, 6))
    logits = torch.tensor(
        draw(st.lists(st.floats(-10.0, 10.0), min_size=(k + 1) * vocab, max_size=(k + 1) * vocab))
    ).reshape(k + 1, vocab)
    best = logits.argmax(-1).tolist()
    # each position proposes the target's argmax or a random token, so every prefix length occurs
    agree = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    other = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
    proposed = [best[i] if agree[i] else other[i] for i in range(k)]
    return proposed, logits


@settings(max_examples=300, deadline=None)
@given(greedy_cases())
def test_verify_greedy_verdict_shape(case):
    proposed, logits = case
    verdict = verify_greedy(proposed, logits)
    check_verdict(verdict, proposed)
    best = logits.argmax(-1).tolist()
    n = verdict.accepted
    assert proposed[:n] == best[:n]
    assert n == len(proposed) or proposed[n] != best[n]  # stopped at the first disagreement
    assert verdict.tokens[-1] == best[n]
