"""Speculative greedy decoding == plain greedy decoding, and the cache stays exact after rejections.

Part 1 runs ``decode_steps`` on both runtimes with drafts that are often wrong (a scripted draft
that corrupts the target's own continuation at chosen positions, an unrelated random model,
self-speculation) and checks (a) the committed tokens equal plain greedy decoding and (b) the
runtime's cache afterwards gives the logits of a fresh, cache-free forward of the whole sequence.
Part 2 goes through ``generate`` on a tiny model with a real chat tokenizer, for every draft spec,
and checks the tokens and the ``SpecStats`` invariants.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest
import torch

from draftwise import SamplingConfig, generate
from draftwise.core.decode import decode_steps
from draftwise.drafters import Capabilities, Draft, ModelDrafter, SelfSpecDrafter, make_drafter
from draftwise.runtime.hf import HFRuntime
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config

V = 96
TOL = 1e-4  # float32
GREEDY = SamplingConfig()
PROMPT = [1, 17, 42, 5, 17, 42, 9, 63]
NEW = 40


class ScriptedDraft:
    """Proposes the target's true greedy continuation, corrupted at a random position (or not at
    all), so that every acceptance length 0..k occurs: full acceptances, first-token and
    middle rejections."""

    name = "scripted"
    capabilities = Capabilities()

    def __init__(self, truth: Sequence[int], prompt_len: int, seed: int) -> None:
        self.truth = list(truth)
        self.prompt_len = prompt_len
        self.rng = random.Random(seed)
        self.accepted: list[int] = []
        self.proposed: list[int] = []

    def start(self, prompt, sampling, generator) -> None:
        assert len(prompt) == self.prompt_len

    def propose(self, context: Sequence[int], k: int) -> Draft:
        done = len(context) - self.prompt_len  # committed tokens so far
        tokens = self.truth[done : done + k]
        bad = self.rng.randrange(len(tokens) + 1) if tokens else 0
        if bad < len(tokens):
            tokens[bad] = (tokens[bad] + 1 + self.rng.randrange(V - 1)) % V  # surely wrong
        self.proposed.append(len(tokens))
        return Draft(tokens)

    def observe(self, num_accepted: int) -> None:
        self.accepted.append(num_accepted)

    def end(self, output) -> None:
        pass


def run(runtime, prompt, drafter=None, *, k: int = 4, new: int = NEW) -> tuple[list[int], list]:
    """Greedy decode_steps until at least ``new`` tokens are committed; tokens and steps."""
    tokens, steps = [], []
    it = decode_steps(runtime, prompt, GREEDY, torch.Generator(), drafter=drafter, k=k)
    for step in it:
        tokens += step.verdict.tokens
        steps.append(step)
        if len(tokens) >= new:
            break
    it.close()
    return tokens, steps


def fresh_logits(hf_model, ids: Sequence[int], keep: int) -> torch.Tensor:
    """The last ``keep`` rows of logits of one cache-free transformers forward: [keep, vocab]."""
    with torch.inference_mode():
        out = hf_model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0, -keep:].float()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Tiny models: run them on one intra-op thread (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def target_hf():
    return random_hf_model(tiny_llama_config(), seed=5)


@pytest.fixture(scope="module")
def wrong_hf():
    """An unrelated random model: as a draft, it is almost always wrong."""
    return random_hf_model(tiny_llama_config(num_hidden_layers=1), seed=6)


RUNTIMES = ("native", "hf")


def make_runtime(kind: str, hf_model):
    if kind == "native":
        return NativeRuntime(hf_model.config, hf_model.state_dict())
    return HFRuntime.from_model(hf_model)


@pytest.fixture(scope="module")
def plain_greedy(target_hf):
    """Plain greedy tokens (no draft) on each runtime; also a sanity check that they agree."""
    out = {kind: run(make_runtime(kind, target_hf), PROMPT, new=NEW + 8)[0] for kind in RUNTIMES}
    assert out["native"] == out["hf"]
    assert len(set(out["native"])) >= 5  # not one token repeated: a scripted draft has work to do
    return out["native"]


DRAFTS = [
    ("native", "scripted"),
    ("native", "wrong-model"),
    ("native", "self"),
    ("hf", "scripted"),
    ("hf", "wrong-model"),
]


@pytest.mark.parametrize(("kind", "draft"), DRAFTS)
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_greedy_equals_plain_and_the_cache_stays_exact(
    target_hf, wrong_hf, plain_greedy, kind, draft, k
):
    rt = make_runtime(kind, target_hf)
    if draft == "scripted":
        drafter = ScriptedDraft(plain_greedy, len(PROMPT), seed=k)
    elif draft == "wrong-model":
        drafter = ModelDrafter(make_runtime(kind, wrong_hf), vocab_size=V)
    else:
        drafter = SelfSpecDrafter(rt, [0])
    tokens, steps = run(rt, PROMPT, drafter, k=k)

    # (a) the same tokens as plain greedy decoding
    assert tokens == plain_greedy[: len(tokens)]
    # the draft was exercised: proposals and rejections; the scripted one also full acceptances
    proposing = [s for s in steps if s.num_proposed]
    rejected = [s for s in proposing if not s.verdict.bonus]
    assert len(proposing) >= 5 and len(rejected) >= 3
    if draft == "scripted":
        assert any(s.verdict.bonus for s in proposing)
        if k > 1:  # some rejections happened after accepted tokens (a middle rejection)
            assert any(0 < s.verdict.accepted < s.num_proposed for s in proposing)

    # (b) the cache holds exactly prompt + committed[:-1] and gives a fresh forward's logits
    seq = PROMPT + tokens
    assert rt.length == len(seq) - 1
    extra = [7, 30]  # the last committed token, then two more, in one pass
    rows = rt.forward([seq[-1], *extra])  # [3, vocab]
    ref = fresh_logits(target_hf, seq + extra, keep=3)
    assert (rows - ref).abs().max() <= TOL
    # and a rollback into the committed region is exact too
    rt.rollback(len(PROMPT) + 3)
    rows = rt.forward(seq[len(PROMPT) + 3 : len(PROMPT) + 6])
    assert (rows - fresh_logits(target_hf, seq[: len(PROMPT) + 6], keep=3)).abs().max() <= TOL




@pytest.mark.parametrize("kind", ["native", "hf"])
def test_model_draft_cache_holds_a_prefix_of_the_committed_tokens(target_hf, wrong_hf, kind):
    """After speculative decoding with rejections, the draft's own runtime holds K/V for a prefix
    of prompt + committed tokens only (no rejected draft tokens): feeding it the rest gives the
    logits of a fresh forward of the draft model."""
    draft_rt = make_runtime(kind, wrong_hf)
    drafter = ModelDrafter(draft_rt, vocab_size=V)
    tokens, steps = run(make_runtime(kind, target_hf), PROMPT, drafter, k=4)
    assert any(s.num_proposed and not s.verdict.bonus for s in steps)
    seq = PROMPT + tokens
    held = draft_rt.length
    assert len(PROMPT) <= held <= len(seq)
    rows = draft_rt.forward(seq[held:] + [7, 30])
    assert (rows - fresh_logits(wrong_hf, seq + [7, 30], keep=len(rows))).abs().max() <= TOL


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_rollback_is_exact_when_the_runtime_was_never_prefilled(target_hf, kind):
    """The protocol allows forward() on a fresh runtime (ModelDrafter relies on it); a rollback
    after that must forget positions exactly, as after a prefill."""
    rt = make_runtime(kind, target_hf)
    rt.forward([1, 2, 3])
    rt.rollback(1)
    row = rt.forward([4])
    assert (row - fresh_logits(target_hf, [1, 4], keep=1)).abs().max() <= TOL


# -- through generate(), on a tiny model with a real chat tokenizer ---------------------------


class CountingDrafter:
    """Wraps a drafter; counts its non-empty proposals and the tokens they hold."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.nonempty = 0
        self.tokens = 0

    def start(self, prompt, sampling, generator) -> None:
        self.inner.start(prompt, sampling, generator)

    def propose(self, context, k):
        draft = self.inner.propose(context, k)
        self.nonempty += bool(draft.tokens)
        self.tokens += len(draft.tokens)
        return draft

    def observe(self, num_accepted: int) -> None:
        self.inner.observe(num_accepted)

    def end(self, output) -> None:
        self.inner.end(output)

    @property
    def capabilities(self):
        return self.inner.capabilities


# (prompt, chat): the random model's greedy output varies for these (many prompts make it repeat
# one token forever, which would make every check trivial)
PROMPTS = {
    "plain-text": ("one two three, one two three, one two three, one two", False),
    "chat": ("Write a poem about the sea.", True),
}
MAX_NEW = 48


@pytest.fixture(scope="module")
def plain(tiny):
    out = {
        name: generate(tiny, text, max_new_tokens=MAX_NEW, chat=chat, draft="none")
        for name, (text, chat) in PROMPTS.items()
    }
    for name, result in out.items():
        assert len(set(result.token_ids)) >= 5, (name, result.token_ids)
    return out


def check_stats(result, counter: CountingDrafter) -> None:
    s = result.stats
    assert s.committed == result.new_tokens + (1 if result.finish_reason == "eos" else 0)
    assert 0 <= s.accepted <= s.proposed
    assert s.proposed == counter.tokens
    assert s.recovered + s.bonus == counter.nonempty
    assert s.target_passes == len(s.accept_lengths)
    assert sum(s.accept_lengths) == s.committed
    assert all(n >= 1 for n in s.accept_lengths)


def draft_spec(spec: str, folder) -> str:
    return "model:" + str(folder) if spec == "model" else spec  # model: the target itself


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("spec", ["model", "lookup", "self:exit=1"])
@pytest.mark.parametrize("k", [1, 3])
def test_generate_greedy_equals_plain_for_every_draft(tiny, tiny_chat_folder, plain, prompt, spec, k):
    text, chat = PROMPTS[prompt]
    counter = CountingDrafter(make_drafter(draft_spec(spec, tiny_chat_folder), tiny))
    result = generate(tiny, text, max_new_tokens=MAX_NEW, chat=chat, draft=counter, k=k)
    expected = plain[prompt]
    assert result.token_ids == expected.token_ids
    assert result.finish_reason == expected.finish_reason
    assert result.text == expected.text
    check_stats(result, counter)
    assert counter.nonempty > 0  # the draft proposed something
    if spec == "model":  # the same model: every proposal is right
        assert result.stats.mean_committed_per_pass > 1
        assert result.stats.accepted == result.stats.proposed


@pytest.mark.parametrize("spec", ["model", "lookup", "self:exit=1"])
def test_generate_stats_when_the_generation_ends_at_eos(tiny, tiny_chat_folder, plain, spec):
    """A token of the plain output is made the EOS: the speculative run stops there as well, the
    EOS counts as committed, and tokens a pass committed after it do not count. With the
    same-model draft and k = 3 every pass commits 4 tokens (positions 1-4, 5-8, ...), and the
    EOS is chosen to land inside a pass, not at its end."""
    text, chat = PROMPTS["plain-text"]
    ids = plain["plain-text"].token_ids
    at = next(i for i in range(5, len(ids)) if ids[i] not in ids[:i] and (i - 1) % 4 != 3)
    stopper = dataclasses.replace(tiny, eos_token_ids=frozenset({ids[at]}))
    expected = generate(stopper, text, max_new_tokens=MAX_NEW, chat=chat, draft="none")
    assert expected.finish_reason == "eos" and expected.token_ids == ids[:at]
    counter = CountingDrafter(make_drafter(draft_spec(spec, tiny_chat_folder), stopper))
    result = generate(stopper, text, max_new_tokens=MAX_NEW, chat=chat, draft=counter, k=3)
    assert result.token_ids == expected.token_ids and result.finish_reason == "eos"
    check_stats(result, counter)
    if spec == "model":
        assert result.stats.accept_lengths[-1] < 4  # the last pass committed 4, kept fewer
