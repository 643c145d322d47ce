"""Tree verification (draftwise.core.verify), layer by layer.

- hand-built cases from +-100 logits (greedy paths, siblings, bonus at a leaf);
- a chain through verify_tree_* gives EXACTLY the verdicts of verify_greedy / verify_sampled,
  and leaves the generator in the same state, for hundreds of random cases and seeds;
- lossless, exactly: with several candidates per position, the first committed token, and the
  first two tokens (a plain step supplies the second when a pass commits one), follow the
  target's p (point masses: multi-candidate rejection; distributions: SpecInfer's multi-step
  speculative sampling with candidates drawn i.i.d. from q). Pearson's chi-square against the
  exact p, failing below ALPHA = 1e-4 (4 fixed-seed checks);
- power: the same checks, on half the draws, reject verifiers with a deliberately wrong residual
  (rejected siblings left in p; removed or q subtracted but not renormalised, which only skews
  the later siblings' acceptance; x removed instead of q subtracted);
- hypothesis properties of any verdict (the path is a root path, its tokens are the accepted
  ones, bonus exactly at a leaf).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import draftwise.core.verify as verify_tree_module
from draftwise.errors import ConfigError
from draftwise.core.tree import TokenTree
from draftwise.core.verify import verify_greedy, verify_sampled
from draftwise.core.verify import TreeVerdict, verify_tree_greedy, verify_tree_sampled

from .test_distribution import chi_square
from .test_verify import peaked_logits, peaked_probs

ALPHA = 1e-4
V = 8  # vocabulary of the distribution checks
N_DRAWS = 6_000  # passes per distribution check (df of the first-two check: 46)
# 3,000 still reject every broken verifier below by far: the weakest, no_renormalise on iid-q,
# at p = 2.9e-14 (first token) and 1.6e-7 (first two), 600x under ALPHA; the rest below 1e-100
N_POWER = N_DRAWS // 2


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_tree_verdict(v: TreeVerdict, tree: TokenTree) -> None:
    """What every verdict satisfies: path is a root path; its tokens are the accepted ones."""
    assert v.path[0] == 0 and len(v.path) == v.accepted + 1 == len(v.tokens)
    for a, b in zip(v.path, v.path[1:]):
        assert tree.parent(b) == a
    assert v.tokens[: v.accepted] == [tree.token(r) for r in v.path[1:]]
    assert v.bonus == (not tree.children(v.path[-1]))


# -- greedy -----------------------------------------------------------------------------------


def test_greedy_follows_the_argmax_child():
    tree = TokenTree(tokens=[2, 5, 1], parents=[0, 0, 2])  # root -> 2 | 5 -> 1
    logits = peaked_logits([[5], [0], [1], [3]])  # root: 5; after 5: 1; after 5, 1: 3
    v = verify_tree_greedy(tree, logits)
    assert v == TreeVerdict(accepted=2, tokens=[5, 1, 3], bonus=True, path=[0, 2, 3])


def test_greedy_picks_the_right_path_among_siblings():
    # root -> {4, 3}; 4 -> {1, 2, 6}; 3 -> {0}; the target says 4, then 6, then 5 after (4, 6)
    tree = TokenTree(tokens=[4, 3, 1, 2, 6, 0], parents=[0, 0, 1, 1, 1, 2])
    logits = peaked_logits([[4], [6], [0], [0], [0], [5], [0]], vocab=V)
    v = verify_tree_greedy(tree, logits)
    assert v == TreeVerdict(accepted=2, tokens=[4, 6, 5], bonus=True, path=[0, 1, 5])
    # the same tree, but after 4 the target wants 5, which no child proposes: no bonus
    logits = peaked_logits([[4], [5], [0], [0], [0], [5], [0]], vocab=V)
    assert verify_tree_greedy(tree, logits) == TreeVerdict(1, [4, 5], False, [0, 1])
    # the root's argmax is the second sibling, 3, whose only child 0 is the target's next
    logits = peaked_logits([[3], [6], [0], [0], [0], [5], [2]], vocab=V)
    assert verify_tree_greedy(tree, logits) == TreeVerdict(2, [3, 0, 2], True, [0, 2, 6])


def test_greedy_empty_tree_is_a_plain_step():
    v = verify_tree_greedy(TokenTree([], []), peaked_logits([[5]]))
    assert v == TreeVerdict(0, [5], True, [0])


def test_bad_shapes_are_config_errors():
    tree = TokenTree([1, 2], [0, 0])
    with pytest.raises(ConfigError, match=r"target_logits must be \[3, vocab\]"):
        verify_tree_greedy(tree, peaked_logits([[1], [2]]))
    with pytest.raises(ConfigError, match=r"draft_probs must be \[2, vocab\]"):
        verify_tree_sampled(tree, peaked_probs([[1]]), peaked_probs([[1], [2], [3]]), gen(0))


# -- sampled, hand-built ----------------------------------------------------------------------


def test_point_mass_siblings_never_recover_a_rejected_one():
    # p at the root is uniform over {1, 2, 3}; the candidates 1 and 2 are tried in order, so the
    # recovered token (both rejected) is always 3; 1 is committed 1/3 of the time, 2 also: given
    # 1 was rejected, p without 1 gives 2 probability 1/2
    p = peaked_probs([[1, 2, 3], [0], [0]])
    tree = TokenTree([1, 2], [0, 0])
    first = {1: 0, 2: 0, 3: 0}
    for seed in range(600):
        v = verify_tree_sampled(tree, None, p, gen(seed))
        check_tree_verdict(v, tree)
        first[v.tokens[0]] += 1
        if v.tokens[0] == 3:
            assert v == TreeVerdict(0, [3], False, [0])
    assert all(150 <= n <= 250 for n in first.values()), first


def test_specinfer_rejects_duplicates_and_accepts_the_residuals_token():
    # p is certain of 0; q = {4: 1/2, 0: 1/2}; candidates 4, 4, 0 (i.i.d. draws may repeat):
    # 4 has p = 0 and is rejected twice, each time p <- norm(max(0, p - q)) = {0: 1}; then 0 is
    # accepted, and its leaf row gives the bonus 5
    p = peaked_probs([[0], [1], [1], [5]])
    q = peaked_probs([[4, 0], [4, 0], [4, 0]])
    tree = TokenTree([4, 4, 0], [0, 0, 0])
    for seed in range(40):
        assert verify_tree_sampled(tree, q, p, gen(seed)) == TreeVerdict(1, [0, 5], True, [0, 3])


# -- a chain is verify.py's verdict, exactly ----------------------------------------------------


def _random_rows(g: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """[n, vocab] probability rows of varied sharpness, some with zeros."""
    logits = torch.randn(n, vocab, generator=g) * (3.0 * torch.rand(n, 1, generator=g))
    probs = logits.softmax(-1)
    probs[torch.rand(n, vocab, generator=g) < 0.2] = 0.0
    probs[probs.sum(-1) == 0] = 1.0
    return probs / probs.sum(-1, keepdim=True)


def test_a_chain_gives_exactly_the_chain_verdicts():
    g = gen(2024)
    cases = {"accepted some": 0, "rejected": 0, "bonus": 0}
    for seed in range(400):
        k = seed % 7
        vocab = 2 + seed % 5
        p = _random_rows(g, k + 1, vocab)  # [k + 1, vocab]
        q = _random_rows(g, k, vocab) if seed % 3 else None  # [k, vocab] or None
        # mostly the target's likely tokens, so all prefix lengths occur
        proposed = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(k)]
        if k and seed % 4 == 0:
            proposed[-1] = int(torch.randint(vocab, (1,), generator=g))
        chain = TokenTree.chain(proposed)
        g1, g2 = gen(seed), gen(seed)
        want, got = verify_sampled(proposed, q, p, g1), verify_tree_sampled(chain, q, p, g2)
        assert (got.accepted, got.tokens, got.bonus) == (want.accepted, want.tokens, want.bonus)
        assert got.path == list(range(want.accepted + 1))
        assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))  # same state
        cases["bonus" if want.bonus else "rejected"] += 1
        cases["accepted some"] += want.accepted > 0
        logits = torch.randint(-2, 3, (k + 1, vocab), generator=g).float()  # [k + 1, vocab], ties
        want_g, got_g = verify_greedy(proposed, logits), verify_tree_greedy(chain, logits)
        assert (got_g.accepted, got_g.tokens, got_g.bonus) == (want_g.accepted, want_g.tokens, want_g.bonus)
        assert got_g.path == list(range(want_g.accepted + 1))
    assert min(cases.values()) >= 50, cases


# -- lossless, exactly: chi-square against p ---------------------------------------------------


def _target(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p1 [V] after the prompt, p2 [V, V] after each first token: peaked, but not too much."""
    g = gen(seed)
    p1 = (torch.randn(V, generator=g) * 1.5).softmax(-1)  # [V]
    return p1, (torch.randn(V, V, generator=g) * 1.5).softmax(-1)  # [V, V]


P1, P2 = _target(7)
Q1, Q2 = _target(8)  # the draft: another model of the same shape
EXACT = P1.double()[:, None] * P2.double()  # [V, V] P(t1, t2) when sampling from the target


def _point_mass_tree() -> TokenTree:
    """3 fixed candidates at the root (the 1st, 2nd and 4th most likely tokens under p), the
    first with one child (its 2nd most likely next token): acceptances and rejections at both
    depths, a bonus from a depth-2 leaf and from a depth-1 leaf."""
    order = P1.argsort(descending=True).tolist()
    a, b, c = order[0], order[1], order[3]
    d = P2[a].argsort(descending=True).tolist()[1]
    return TokenTree(tokens=[a, b, c, d], parents=[0, 0, 0, 1])


def _rows(tree: TokenTree) -> torch.Tensor:
    """[m + 1, V] p after each node's path: p1 at the root, p2[t] at a depth-1 node t, and (any
    valid row: only the third token depends on it) p2[t] at a deeper node t."""
    return torch.cat([P1[None], P2[tree.tokens]])  # [m + 1, V]


Proposer = Callable[[torch.Generator], tuple[TokenTree, torch.Tensor | None]]


def first_two(draws: int, seed: int, propose: Proposer) -> tuple[torch.Tensor, int, int]:
    """Counts [V, V] of the first two tokens over ``draws`` passes (a pass that commits one is
    followed by a plain step from p2), the tokens accepted, and the passes ending in a bonus."""
    g = gen(seed)
    pairs = [0] * (V * V)  # counted on the host, one tensor at the end
    accepted = bonuses = 0
    for _ in range(draws):
        tree, q = propose(g)
        v = verify_tree_sampled(tree, q, _rows(tree), g)
        accepted += v.accepted
        bonuses += v.bonus
        t1 = v.tokens[0]
        t2 = v.tokens[1] if len(v.tokens) > 1 else int(torch.multinomial(P2[t1], 1, generator=g))
        pairs[t1 * V + t2] += 1
    return torch.tensor(pairs, dtype=torch.float64).view(V, V), accepted, bonuses


POINT_MASS_TREE = _point_mass_tree()


def point_masses(g: torch.Generator) -> tuple[TokenTree, None]:
    return POINT_MASS_TREE, None


def iid_from_q(g: torch.Generator) -> tuple[TokenTree, torch.Tensor]:
    """3 root candidates drawn i.i.d. from q1 (repeats allowed), each with one child drawn from
    q2 after it; draft_probs row j - 1 is the q node j was drawn from."""
    xs = torch.multinomial(Q1, 3, replacement=True, generator=g).tolist()
    ys = torch.multinomial(Q2[xs], 1, generator=g)[:, 0].tolist()
    tree = TokenTree(tokens=xs + ys, parents=[0, 0, 0, 1, 2, 3])
    return tree, torch.cat([Q1.expand(3, V), Q2[xs]])  # [6, V]


PROPOSERS = {"point-mass": point_masses, "iid-q": iid_from_q}


@pytest.mark.parametrize("kind", list(PROPOSERS))
def test_first_tokens_follow_the_target_exactly(kind):
    seed = 100 + list(PROPOSERS).index(kind)
    pairs, accepted, bonuses = first_two(N_DRAWS, seed=seed, propose=PROPOSERS[kind])
    stat1, df1, p_first = chi_square(pairs.sum(1), P1.double())
    stat2, df2, p_pair = chi_square(pairs, EXACT)
    print(
        f"\n{kind}: accepted/pass={accepted / N_DRAWS:.2f} bonus rate={bonuses / N_DRAWS:.2f} "
        f"first token chi2={stat1:.1f} df={df1} p={p_first:.3g}; "
        f"first two chi2={stat2:.1f} df={df2} p={p_pair:.3g}"
    )
    # several siblings were used: more accepted than a single candidate could give
    assert accepted > N_DRAWS * float(P1.max()) and 0 < bonuses < N_DRAWS
    assert df1 == V - 1 and df2 >= 30
    assert p_first >= ALPHA, f"first token: chi2={stat1:.1f} on df={df1}: p={p_first:.2g}"
    assert p_pair >= ALPHA, f"first two: chi2={stat2:.1f} on df={df2}: p={p_pair:.2g}"


# -- power: the same check catches a wrong residual -------------------------------------------

_right_residual = verify_tree_module._after_rejection


def keep_rejected(p, x, q):
    """BROKEN: the rejected candidate stays in p (later siblings and the recovered token)."""
    return p


def no_renormalise(p, x, q):
    """BROKEN: the rejected candidates are removed but p is not renormalised, so later siblings
    are accepted too rarely (the final draw still normalises: it scales by the row's total).
    p: [n, V], x: [n], q: [n, V] or None, as the verifier's own."""
    r = p.clone() if q is None else (p - q).clamp_min(0.0)
    if q is None:
        r[torch.arange(p.shape[0]), x] = 0.0
    return r


def ignore_q(p, x, q):
    """BROKEN for distributions: on a rejection, remove x (the point-mass rule), not q."""
    return _right_residual(p, x, None)


@pytest.mark.parametrize(
    ("kind", "broken"),
    [
        ("point-mass", keep_rejected),
        ("point-mass", no_renormalise),
        ("iid-q", keep_rejected),
        ("iid-q", no_renormalise),
        ("iid-q", ignore_q),
    ],
)
def test_the_check_rejects_a_wrong_residual(kind, broken, monkeypatch):
    monkeypatch.setattr(verify_tree_module, "_after_rejection", broken)
    pairs, _, _ = first_two(N_POWER, seed=200, propose=PROPOSERS[kind])
    stat1, df1, p_first = chi_square(pairs.sum(1), P1.double())
    stat2, df2, p_pair = chi_square(pairs, EXACT)
    print(
        f"\n{broken.__name__} {kind}: first token chi2={stat1:.1f} p={p_first:.3g}; "
        f"first two chi2={stat2:.1f} p={p_pair:.3g}"
    )
    assert p_first < ALPHA and p_pair < ALPHA


# -- properties -------------------------------------------------------------------------------


@st.composite
def tree_cases(draw):
    m = draw(st.integers(0, 8))
    vocab = draw(st.integers(2, 6))
    parents = [draw(st.integers(0, j - 1)) for j in range(1, m + 1)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=m, max_size=m))
    seed = draw(st.integers(0, 2**32 - 1))
    with_q = draw(st.booleans())
    return TokenTree(tokens, parents), vocab, seed, with_q


@settings(max_examples=300, deadline=None)
@given(tree_cases())
def test_any_verdict_is_a_root_path_of_accepted_tokens(case):
    tree, vocab, seed, with_q = case
    g = gen(seed)
    m = len(tree)
    p = _random_rows(g, m + 1, vocab)  # [m + 1, vocab]
    q = _random_rows(g, m, vocab) if with_q and m else None  # [m, vocab]
    v = verify_tree_sampled(tree, q, p, g)
    check_tree_verdict(v, tree)
    last = v.path[-1]
    assert float(p[last, v.tokens[-1]]) > 0.0  # never commits what the target rules out
    if q is None and not v.bonus:  # every child was rejected: none of them is recovered
        assert v.tokens[-1] not in {tree.token(c) for c in tree.children(last)}
    logits = torch.randint(-2, 3, (m + 1, vocab), generator=g).float()  # [m + 1, vocab], ties
    vg = verify_tree_greedy(tree, logits)
    check_tree_verdict(vg, tree)
    best = logits.argmax(-1).tolist()
    assert all(tree.token(r) == best[tree.parent(r)] for r in vg.path[1:])
    assert vg.tokens[-1] == best[vg.path[-1]]
    assert best[vg.path[-1]] not in {tree.token(c) for c in tree.children(vg.path[-1])}
