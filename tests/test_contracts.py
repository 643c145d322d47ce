"""The contracts the core keeps: declared capabilities, one lifecycle, one verification path with
one host read per step, caches owned by one method, and a library that leaves the process alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

from draftwise.core import passes
from draftwise.bench.runner import Runner, build_methods
from draftwise.policy import adaptive
from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.profile import default_profile_path, locked
from draftwise.core.decode import Stream, decode_steps, generate
from draftwise.drafters import Capabilities, Draft, capabilities_of, make_drafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree
from draftwise.core.verify import verify_tree_greedy, verify_tree_sampled

#: the calls that read a tensor's value back to the host (a device synchronisation on a GPU)
HOST_READS = {"tolist", "item", "__float__", "__int__", "__bool__", "__index__", "numpy"}


class CountReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


# -- capabilities -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["lookup", "lookup:branches=3", "suffix", "suffix:cache=0", "self"])
def test_a_drafter_declares_what_its_spec_declares(tiny, spec):
    drafter = make_drafter(spec, tiny)
    assert drafter.capabilities == capabilities_of(spec)


def test_capabilities_say_how_auto_treats_each_kind():
    kinds = {s: capabilities_of(s) for s in ("lookup", "lookup:branches=2", "suffix", "self", "model:x", "eagle:x,topk=2")}
    assert [kinds[s].tree_policy for s in kinds] == ["chain", "unscored", "scored", "chain", "chain", "unscored"]
    assert [kinds[s].replay for s in kinds] == ["exact", "exact", "exact", "hits", "hits", "rates"]
    assert kinds["self"].shares_target_cache and not kinds["lookup"].shares_target_cache
    assert kinds["eagle:x,topk=2"].reads_features and kinds["suffix"].learns
    assert not capabilities_of("suffix:cache=0").learns
    with pytest.raises(ValueError, match="only a drafter that proposes trees"):
        Capabilities(scored=True)


def test_the_planner_and_a_real_run_cache_the_same_answer(tiny):
    """A finished generation hands a learning draft its tokens without the EOS that ended it;
    the planner's trace and replay must do the same, or the replay would propose EOS."""
    from draftwise.planner.replay import answer, replay_lookup

    eos = next(iter(tiny.eos_token_ids))
    assert answer([5, 6, eos], tiny.eos_token_ids) == [5, 6]
    drafter = make_drafter("suffix", tiny)
    replay_lookup(drafter, [1, 2, 3], [5, 6, 7, eos], 4, 16, eos_token_ids=tiny.eos_token_ids)
    assert drafter.cache.generations() == [[5, 6, 7]]


def test_auto_counts_an_unscored_tree_by_depth_and_chooses_its_budget():
    class Costs:
        max_n = 9

        def step_time(self, n, context=None):
            return 0.05 + 0.001 * n

        def draft_time(self, draft, k):
            return 1e-5

    policy = AdaptiveK(Costs(), "lookup:branches=3")
    assert not policy.trees  # unscored: chosen like a chain's k, never trimmed
    draft = Draft([5, 6, 7], tree=TokenTree([5, 6, 7], [0, 0, 1]))
    assert policy.trim(draft, 10) is draft
    for _ in range(30):
        policy.observe(2, 2)  # a depth-2 tree, both positions accepted
    assert policy.tested[2] == 0 and policy.tested[1] > 0  # depth counted, not the 3 nodes
    assert policy.choose(100) >= 2
    scored = AdaptiveK(Costs(), "suffix")
    assert scored.trees and scored.choose(100) == scored.k_max


# -- one verification path, one host read -----------------------------------------------------


def _rows(g: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    return torch.randn(n, vocab, generator=g)


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("with_q", [False, True])
def test_verification_reads_the_device_once_per_step(shape, with_q):
    g = torch.Generator().manual_seed(3)
    tree = TokenTree.chain([1, 2, 3, 4]) if shape == "chain" else TokenTree([1, 2, 3, 4, 5], [0, 0, 1, 1, 3])
    m, vocab = len(tree), 11
    logits = _rows(g, m + 1, vocab)  # [m + 1, vocab]
    p = logits.softmax(-1)
    q = _rows(g, m, vocab).softmax(-1) if with_q else None  # [m, vocab]
    with CountReads() as greedy_reads:
        verify_tree_greedy(tree, logits)
    with CountReads() as sampled_reads:
        verify_tree_sampled(tree, q, p, g)
    assert greedy_reads.reads == ["numpy"] and sampled_reads.reads == ["tolist"]  # greedy on the CPU: numpy's argmax


class _FakeRuntime:
    """Returns fixed logits; records what it was asked to keep."""

    def __init__(self, logits: torch.Tensor, trees: bool) -> None:
        self.logits, self.supports_trees, self.length, self.kept = logits, trees, 10, None

    def forward(self, ids, *, layers=None, parents=None):
        self.parents = parents
        return self.logits[: len(ids)]

    def keep(self, base, rows):
        self.kept = (base, list(rows))


def test_a_runtime_without_trees_verifies_the_first_chain_and_says_so_once(monkeypatch):
    monkeypatch.setattr(passes, "_CHAIN_FALLBACK_SAID", set())
    logits = torch.full((6, 9), -10.0)
    logits[0, 5] = logits[1, 6] = logits[2, 8] = 10.0  # the target says 5, 6, then 8
    draft = Draft([5, 7, 6], tree=TokenTree([5, 7, 6], [0, 0, 1]))  # 5 -> 6, and a sibling 7
    rt = _FakeRuntime(logits, trees=False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        verdict, ranks, verified = passes.verify_pass(rt, 1, draft, SamplingConfig(), torch.Generator())
        passes.verify_pass(rt, 1, draft, SamplingConfig(), torch.Generator())
    assert rt.parents is None  # the chain [5, 6] ran with the plain causal mask
    assert (verdict.accepted, verdict.tokens, ranks) == (2, [5, 6, 8], ())
    assert (verified.tokens, verified.depth) == ([5, 6], 2)  # what the statistics count
    assert rt.kept == (10, [0, 1, 2])
    assert len([w for w in said if "first chain" in str(w.message)]) == 1
    tree_rt = _FakeRuntime(logits, trees=True)
    verdict, ranks, verified = passes.verify_pass(tree_rt, 1, draft, SamplingConfig(), torch.Generator())
    assert tree_rt.parents == [-1, 0, 0, 1] and verdict.path == [0, 1, 3] and ranks == ((2, 0), (1, 0))
    assert verified is draft.tree


# -- lifecycle and cache ownership ------------------------------------------------------------


def test_suffix_learns_from_a_finished_generation_and_never_from_a_cancelled_one(tiny):
    drafter = make_drafter("suffix", tiny)
    assert isinstance(drafter, SuffixDrafter) and drafter.cache is not None
    out = generate(tiny, [5, 6, 7, 8], max_new_tokens=6, draft=drafter, k=4)
    assert drafter.cache.generations() == [out.token_ids]
    s = Stream(tiny, [5, 6, 7, 9], max_new_tokens=20, sampling=SamplingConfig(), stop=(), drafter=drafter, k=4)
    next(iter(s))
    s.close()  # a client hung up
    assert drafter.cache.generations() == [out.token_ids]
    generate(tiny, [5, 6, 7, 8], max_new_tokens=6, draft=drafter, k=4, learn=False)  # a warm-up
    assert len(drafter.cache) == 1


def test_the_loop_starts_a_drafter_before_the_targets_prefill(tiny):
    order: list[str] = []

    class Spy:
        name = "spy"
        capabilities = Capabilities()

        def start(self, prompt, sampling, generator):
            order.append(f"start at length {tiny.runtime.length}")

        def propose(self, context, k):
            return Draft([])

        def observe(self, n):
            pass

        def end(self, output):
            order.append("end")

    tiny.runtime.rollback(0)
    steps = decode_steps(tiny.runtime, [3, 4, 5], SamplingConfig(), torch.Generator(), drafter=Spy(), k=2)
    next(steps)
    assert order == ["start at length 0"]


def test_two_bench_methods_with_one_spec_and_auto_never_share_a_cache(tiny):
    methods = build_methods(tiny, "suffix,suffix@k=6", 4, ())
    caches = [m.drafter.cache for m in methods if m.drafter is not None]
    assert len(caches) == 2 and caches[0] is not caches[1]

    class Plan:
        recommended = {"overall": ("suffix", 4)}

    runner = Runner(tiny, 6, SamplingConfig(), plan=Plan())
    auto = build_methods(tiny, "auto", 4, ())[-1]
    hi = Question(1, "qa", ("Hi.",))
    runner.questions([methods[1]], hi)  # each learns the answer it keeps
    runner.questions([auto], hi)
    own = runner.auto_drafters[("auto", "suffix")].cache
    assert own is not caches[0] and len(own) == 1 and len(caches[0]) == 1 and len(caches[1]) == 0
    # a second auto method routed to the same draft keeps a cache of its own too
    other = build_methods(tiny, "auto@k=3", 4, ())[-1]
    runner.questions([other], hi)
    theirs = runner.auto_drafters[(other.name, "suffix")].cache
    assert theirs is not own and len(theirs) == 1 and len(own) == 1


def test_bench_auto_runs_the_adaptive_k_under_k_auto(tiny, monkeypatch):
    seen = {}

    def fake_policy(model, spec, k, *, capabilities=None):
        seen["k"], seen["caps"] = k, capabilities
        return 2

    monkeypatch.setattr("draftwise.bench.runner.policy_for", fake_policy)

    class Plan:
        recommended = {"overall": ("lookup", 5)}

    runner = Runner(tiny, 4, SamplingConfig(), plan=Plan())
    result = runner.turn(build_methods(tiny, "auto", "auto", ())[-1], [5, 6, 7], "rag")
    assert seen["k"] == "auto" and seen["caps"] == capabilities_of("lookup")
    assert result.stats["k"] == "auto" and result.stats["plan_choice_for"] == "overall"


# -- state: profiles and the process ----------------------------------------------------------


def test_k_auto_keeps_its_own_profile_file(tiny):
    assert default_profile_path(tiny, "auto") != default_profile_path(tiny)
    assert default_profile_path(tiny, "auto").name.endswith("-auto.json")


def test_two_resolvers_take_turns_and_keep_each_others_drafts(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    from draftwise.cost.profile import Profile, model_fingerprint

    def fake_measure(model, *, drafts, max_n, contexts, repeats, progress):
        time.sleep(0.2)  # long enough for the other thread to try at the same time
        return Profile(model=model.name, fingerprint=model_fingerprint(model), dtype=model.mode,
                       runtime="x", forward={128: [0.01] * max_n}, step={128: [0.01] * max_n},
                       drafts={d: [1e-5] * (max_n - 1) for d in drafts})

    monkeypatch.setattr(adaptive, "measure_profile", fake_measure)
    threads = [threading.Thread(target=adaptive.resolve_profile, args=(tiny, d)) for d in ("lookup", "suffix")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saved = Profile.load(default_profile_path(tiny, "auto"))
    assert set(saved.drafts) == {"lookup", "suffix"}


def test_a_lock_holder_keeps_others_waiting(tmp_path):
    path = tmp_path / "p.json"
    events: list[str] = []

    def other() -> None:
        with locked(path):
            events.append("other")

    with locked(path):
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.2)
        events.append("holder")
    t.join()
    assert events == ["holder", "other"]


def test_a_library_generation_leaves_threads_and_the_environment_alone(tiny, tmp_path):
    code = (
        "import os, sys, torch\n"
        "before_env, before = dict(os.environ), torch.get_num_threads()\n"
        "import draftwise\n"
        "from draftwise import threads\n"
        f"m = draftwise.load_model({str(tiny.folder)!r})\n"
        "draftwise.generate(m, [5, 6, 7], max_new_tokens=3, draft='lookup')\n"
        "assert dict(os.environ) == before_env, 'the environment changed'\n"
        "assert torch.get_num_threads() == before, 'the thread count changed'\n"
        "assert not threads._state['registered'], 'registered as a decoding process'\n"
        "print('untouched')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["DRAFTWISE_SHARE_CORES"] = "0"  # the case where importing used to set GOMP_SPINCOUNT
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "untouched" in proc.stdout, proc.stderr[-3000:]
