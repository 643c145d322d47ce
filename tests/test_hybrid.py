"""Hybrid drafts (``suffix+eagle:PATH``): the spec, the merged tree, and lossless decoding.

- ``merge_chain`` puts the head's chain into the copy draft's tree: a head token equal to a node
  there joins it (keeping the larger score), others become new nodes; rows come out best first
  with every prefix a tree.
- Greedy decoding with a suffix + EAGLE hybrid equals plain greedy decoding, with fixed k and
  with a policy that trims the merged tree; the steps where the copy draft has nothing still
  draft (the head's token). The sampled-mode chi-square test covers a lookup + EAGLE hybrid
  (``hybrid`` in tests/test_distribution.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from draftwise.core.decode import decode_steps
from draftwise.drafters import PromptLookupDrafter, factory, make_drafter
from draftwise.core.draft import Draft
from draftwise.eagle.drafter import EagleDrafter
from draftwise.eagle.files import LoadedHead
from draftwise.drafters.hybrid import HybridDrafter, merge_chain
from draftwise.drafters.spec import DraftSpec, parse_draft_list
from draftwise.core.draft import Capabilities
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.errors import ConfigError
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree

from . import test_eagle3
from .test_eagle import PROMPT, _greedy
from .test_eagle3 import _head

target = test_eagle3.target  # the module-scoped tiny target fixture, shared


def test_hybrid_specs_parse_print_and_refuse_what_cannot_pair():
    spec = DraftSpec.parse(" suffix:nodes=8 + eagle:default ")
    assert (spec.kind, spec.nodes, str(spec.then), str(spec)) == ("suffix", 8, "eagle:default", "suffix:nodes=8+eagle:default")
    assert DraftSpec.parse(str(spec)) == spec
    listed = [(str(s), k) for s, k in parse_draft_list("none,lookup:max=4,min=2+eagle:h@k=3,suffix+eagle:default")]
    assert listed == [("none", 4), ("lookup:max=4,min=2+eagle:h", 3), ("suffix+eagle:default", 4)]
    assert str(DraftSpec.parse("eagle:/x/a+b")) == "eagle:/x/a+b"  # a '+' inside a path stays
    for bad in ("self+eagle:default", "suffix+lookup", "suffix+eagle:a+eagle:b", "eagle:h+eagle:default"):
        with pytest.raises(ConfigError, match="hybrid draft is a copy draft"):
            DraftSpec.parse(bad)


def _tree(tokens, parents, scores) -> Draft:
    return Draft(tokens, tree=TokenTree(tokens, parents), scores=tuple(scores))


def test_merge_joins_equal_nodes_adds_new_ones_and_orders_best_first():
    base = _tree([5, 9, 6], [0, 0, 1], [0.6, 0.3, 0.2])  # 5 -> 6, and 9
    merged = merge_chain(base, [9, 4], [0.7, 0.35])  # the head agrees on 9, then guesses 4 after it
    assert merged.tokens == [9, 5, 4, 6]
    assert merged.tree.parents == [0, 0, 1, 2]
    assert merged.scores == (0.7, 0.6, 0.35, 0.2)  # 9 kept the larger score
    for n in range(len(merged) + 1):  # every prefix is a tree
        assert merged.prefix(n).tree is None or len(merged.prefix(n).tree) == n
    assert merge_chain(Draft([]), [3], [0.4]).tokens == [3]
    chain = merge_chain(Draft([1, 2], scores=(0.9, 0.8)), [1, 2], [0.5, 0.2])  # a chain, fully shared
    assert (chain.tokens, chain.tree.parents, chain.scores) == ([1, 2], [0, 1], (0.9, 0.8))


def _hybrid(target, copy) -> HybridDrafter:
    return HybridDrafter(copy, EagleDrafter(target, LoadedHead(_head(target, "eagle3"), None, {})))


class TrimToTwo:
    """A k policy that proposes a 6-node budget and keeps the best two nodes of scored trees."""

    k_max, shadow = 6, False

    def choose(self, context_len: int) -> int:
        return 6

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def observe_shadow(self, proposal, committed) -> None:
        pass

    def trim(self, draft: Draft, context_len: int) -> Draft:
        return draft.prefix(2)


def test_greedy_with_a_suffix_eagle_hybrid_equals_plain_greedy(target):
    plain = _greedy(target, None, k=1)
    assert _greedy(target, _hybrid(target, SuffixDrafter(nodes=6, depth=4)), k=6) == plain
    assert _greedy(target, _hybrid(target, PromptLookupDrafter(min_ngram=2)), k=3) == plain
    drafter = _hybrid(target, SuffixDrafter(nodes=6, depth=4))
    steps = decode_steps(target, PROMPT, SamplingConfig(), torch.Generator(), drafter=drafter, k=TrimToTwo())
    out, proposed = [], []
    for step in steps:
        out += step.verdict.tokens
        proposed.append(step.num_proposed)
        if len(out) >= 40:
            break
    steps.close()
    assert out[:40] == plain
    # after the prefill's step, every step drafts (the head guesses where suffix has nothing), trimmed to two
    assert proposed[0] == 0 and max(proposed) == 2 and min(proposed[1:]) >= 1


def test_a_hybrid_keeps_a_suffix_cache_of_its_own(monkeypatch):
    """Interleaved in one bench, ``suffix`` and ``suffix+eagle:...`` decode the same answers; a
    shared cache would hand each the other's answer to copy."""
    head = Capabilities(reads_features=True, replay="rates", cost="head")
    monkeypatch.setattr(factory, "eagle_drafter",
                        lambda source, model, **kw: SimpleNamespace(name=f"eagle:{source}", capabilities=head))
    model = SimpleNamespace(folder="/models/a", runtime=SimpleNamespace(max_context=512))
    plain, hybrid = make_drafter("suffix", model), make_drafter("suffix+eagle:x", model)
    assert isinstance(hybrid, HybridDrafter) and hybrid.name == "suffix+eagle:x"
    assert hybrid.copy.cache is not None and hybrid.copy.cache is not plain.cache
    assert make_drafter("suffix+eagle:x", model).copy.cache is not hybrid.copy.cache
    assert hybrid.capabilities == factory.capabilities_of("suffix+eagle:x")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf"])
def test_export_says_no_engine_runs_a_hybrid_and_gives_its_copy_part(engine):
    from draftwise.planner.export import export_dict

    got = export_dict("suffix+eagle:default", 4, engine)
    alone = export_dict("suffix", 4, engine)
    assert got["draft"] == "suffix+eagle:default" and got["supported"] is False
    assert got["options"] == alone["options"] and "no hybrid" in got["note"]


def test_the_planner_prices_a_hybrid_from_its_trace_not_a_replay():
    from draftwise.planner.replay import rates_only, replayable

    assert replayable("suffix") and not replayable("suffix+eagle:default") and not replayable("eagle:default")
    assert rates_only("suffix+eagle:default") and rates_only("eagle:default") and not rates_only("suffix")


def test_the_profile_times_the_hybrids_head_with_real_features(target, monkeypatch):
    """D(k) of a hybrid must include its head's proposals: the head needs the target's features
    of every position, which the measurement supplies through target passes, as for EAGLE."""
    from draftwise.cost import measure
    from draftwise.cost.measure import _time_draft

    monkeypatch.setattr(measure, "_synthetic", lambda n, seed: [(seed + i) % 30 + 3 for i in range(n)])  # tiny vocabulary

    hybrid = _hybrid(target, SuffixDrafter(nodes=6, depth=4))
    sizes: list[int] = []
    scored = hybrid.head.propose_scored
    hybrid.head.propose_scored = lambda context, k: sizes.append(len(out := scored(context, k))) or out
    _time_draft(hybrid, target, list(PROMPT) * 3, 1, repeats=4)
    assert len(sizes) >= 5 and all(n == 1 for n in sizes)
    target.capture_features(enabled=False)
    target.rollback(0)


def test_fill_and_skip_from_parse_print_and_stay_hybrid_options():
    spec = DraftSpec.parse("suffix+eagle:default,fill=2,skip_from=4")
    assert (spec.then.fill, spec.then.skip_from, str(spec)) == (2, 4, "suffix+eagle:default,fill=2,skip_from=4")
    assert DraftSpec.parse(str(spec)) == spec and DraftSpec.parse("suffix+eagle:default").then.fill == 3
    assert str(DraftSpec.parse("suffix+eagle:default,fill=1")) == "suffix+eagle:default,fill=1"  # the old default, named
    assert str(DraftSpec.parse("suffix+eagle:default,fill=3")) == "suffix+eagle:default"
    with pytest.raises(ConfigError, match="steer a hybrid's head"):
        DraftSpec.parse("eagle:default,fill=2")
    with pytest.raises(ConfigError, match="fill= takes a whole number >= 1"):
        DraftSpec.parse("suffix+eagle:default,fill=0")


class _Fixed:
    """A copy draft that proposes the same chain every step."""

    name, capabilities = "fixed", Capabilities(replay="exact", cost="host")

    def __init__(self, tokens):
        self.tokens = tokens

    def start(self, *a):
        pass

    def propose(self, context, k):
        return Draft(self.tokens[:k])

    def observe(self, n):
        pass

    def end(self, out):
        pass


class _Head(_Fixed):
    capabilities = Capabilities(reads_features=True, replay="rates", cost="head")

    def __init__(self):
        self.asked = []

    def propose_scored(self, context, k):
        self.asked.append(k)
        return Draft([7] * k, scores=tuple(0.5**i for i in range(1, k + 1)))


def test_the_head_fills_an_empty_copy_draft_and_is_skipped_behind_a_long_one():
    head = _Head()
    empty = HybridDrafter(_Fixed([]), head, fill=3, skip_from=3)
    empty.start([1], SamplingConfig(), torch.Generator())
    assert empty.propose([1, 2], 8).tokens == [7, 7, 7] and head.asked == [3]
    short = HybridDrafter(_Fixed([4, 5]), head, fill=3, skip_from=3)
    assert short.propose([1, 2], 8).tokens == [4, 5, 7] and head.asked == [3, 1]  # one head token beside a copy
    long = HybridDrafter(_Fixed([4, 5, 6]), head, fill=3, skip_from=3)
    assert long.propose([1, 2], 8).tokens == [4, 5, 6] and head.asked == [3, 1] and long.skipped == 1
    assert long.propose([1, 2], 2).tokens == [4, 5, 7][:2] and head.asked == [3, 1, 1]  # k=2 cuts the path to 2


def test_greedy_with_fill_and_skip_from_equals_plain_greedy(target):
    plain = _greedy(target, None, k=1)
    head = EagleDrafter(target, LoadedHead(_head(target, "eagle3"), None, {}))
    drafter = HybridDrafter(SuffixDrafter(nodes=6, depth=4), head, fill=3, skip_from=2)
    assert _greedy(target, drafter, k=6) == plain
    assert drafter.skipped > 0  # the head's cache caught up after skipped steps, and the output stayed plain's
