"""The decode loop: prompt -> tokens -> text, with streaming, EOS, stop strings and a budget.

This is the core: ``k`` is a number or a :class:`~draftwise.core.kpolicy.KPolicy` object. Everything
above the core (the bench, the server, the CLI) calls the public :func:`draftwise.generate` /
:func:`draftwise.stream` (:mod:`draftwise.api`), which are these plus ``k="auto"`` (the
adaptive policy from a measured profile).

A library call changes nothing in the process: the entry points (the CLI, the server) opt in to
sharing the cores with other draftwise processes through :func:`add_step_hook`, which
:func:`draftwise.api.share_cores_while_decoding` calls.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch

from draftwise.core.draft import Draft, Drafter
from draftwise.core.generation import Generation, GenerationResult
from draftwise.core.kpolicy import FixedK, KPolicy
from draftwise.core.passes import Step, verify_pass  # noqa: F401  (Step is part of this module's API)
from draftwise.core.sampling import SamplingConfig, next_token
from draftwise.core.stats import SpecStats
from draftwise.core.text import TextAssembler
from draftwise.core.verify import Verdict
from draftwise.errors import ConfigError, ContextLengthError
from draftwise.runtime.base import Runtime
from draftwise.runtime.loaders import Model, load_model
from draftwise.runtime.prefix_cache import PrefixCache, PrefixRuntime

_STEP_HOOKS: list[Callable[[], object]] = []


def add_step_hook(hook: Callable[[], object]) -> None:
    """Call ``hook()`` before every target pass of every generation in this process (an entry
    point's opt-in, such as sharing the cores; it must be cheap). Adding one twice adds it once."""
    if hook not in _STEP_HOOKS:
        _STEP_HOOKS.append(hook)


def remove_step_hook(hook: Callable[[], object]) -> None:
    if hook in _STEP_HOOKS:
        _STEP_HOOKS.remove(hook)


def _run_step_hooks() -> None:
    for hook in _STEP_HOOKS:
        hook()


def propose_step(
    drafter: Drafter | None, policy: KPolicy, context: list[int], budget: int, left: int
) -> tuple[Draft, list[int] | None]:
    """This step's draft (trimmed by the policy) and, when it proposes nothing, a *shadow*
    proposal whose first token the policy compares with the plain step's (see cost.adaptive).
    The planner's replay (:func:`draftwise.planner.replay.replay_lookup`) calls it too, so a
    replayed step is the step decoding would take."""
    if drafter is None:
        return Draft([]), None
    if budget > 0:
        full = drafter.propose(context, budget)
        draft = policy.trim(full, len(context))  # a scored tree under --k auto: its best prefix
        return draft, (full.tokens[:1] if full.tokens and not draft.tokens else None)
    if policy.shadow and left > 0:
        return Draft([]), drafter.propose(context, 1).tokens  # costs ~nothing
    return Draft([]), None


def decode_steps(
    runtime: Runtime,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig,
    generator: torch.Generator,
    *,
    drafter: Drafter | None = None,
    k: int | KPolicy = 4,
    max_new_tokens: int | None = None,
    stats: SpecStats | None = None,
    generation: Generation | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[Step]:
    """The loop: propose -> verify -> commit / roll back -> observe. Runs until the caller stops.

    The last committed token is never in the target's cache: each pass feeds it together with
    the proposal, ``[last, x_1..x_m]``, and gets m + 1 rows of logits back. Without a drafter
    (or when it proposes nothing) a pass is a plain decode step. ``max_new_tokens`` only caps
    how many tokens are proposed, so no pass does work the budget will throw away. ``k`` is a
    number or a policy that picks it each step (:class:`draftwise.policy.adaptive.AdaptiveK`).
    ``generation`` (:class:`~draftwise.core.generation.Generation`) owns the drafter's lifecycle:
    the loop starts it there, before the prefill, and whoever runs the loop ends it. Given only
    a ``drafter``, the loop starts it through a generation of its own (``generation`` wins).
    ``prefix_cache`` (on a runtime that ``reuses_prefixes``): the prefill reuses the longest
    cached prefix of the prompt (``generation.cached_tokens`` says how many tokens), and the
    cache gets the prompt's blocks after the prefill and the answer's when the loop ends.
    """
    stats = stats if stats is not None else SpecStats()
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    clock = getattr(runtime, "clock", time.perf_counter)  # a batched slot's own (draftwise.core.engine)
    _run_step_hooks()
    t0 = clock()
    generation = generation or Generation(eos_token_ids=(), max_new_tokens=max_new_tokens or 1, drafter=drafter)
    drafter = generation.drafter
    if drafter is not None:  # before the prefill: an EAGLE head sets which layers it records
        generation.start(prompt_ids, cfg, generator)
        stats.draft_seconds += clock() - t0
        t0 = clock()
    cache = prefix_cache if prefix_cache is not None and getattr(runtime, "reuses_prefixes", False) else None
    logits, generation.cached_tokens, ticket = prefill_prompt(runtime, prompt_ids, cache)  # [vocab]
    first = next_token(logits, cfg, generator)
    stats.verify_seconds += clock() - t0
    context = list(prompt_ids) + [first]
    sound = True  # whether the slot's positions may be kept: not after a pass that failed midway
    try:
        yield Step(0, Verdict(accepted=0, tokens=[first], bonus=False))
        if ticket is not None:  # once the first token is out
            _save_prompt(runtime, cast(PrefixCache, cache), ticket)
            ticket = None
        yield from _steps(runtime, context, cfg, generator, drafter, policy, max_new_tokens, stats, clock)
    except GeneratorExit:  # the caller stopped (finished, cancelled): every recorded position is exact
        raise
    except BaseException:
        sound = False
        raise
    finally:
        if cache is not None and sound:
            cast(PrefixRuntime, runtime).save_prefix(cache)
        if ticket is not None:
            cast(PrefixCache, cache).done(ticket)


def _save_prompt(runtime: Runtime, cache: PrefixCache, ticket: int) -> None:
    """Put the prompt's blocks in ``cache`` and end its ``ticket`` (:func:`prefill_prompt`): prompts
    that start the same way and wait for them go on."""
    cast(PrefixRuntime, runtime).save_prefix(cache)
    cache.done(ticket)


#: the most steps a prompt waits for another request's prefill of its start (a safety net: a
#: prefill ends far sooner, and one abandoned leaves the cache at once)
MAX_PREFIX_WAIT = 4096


def prefill_prompt(runtime: Runtime, prompt_ids: Sequence[int],
                   cache: PrefixCache | None) -> tuple[torch.Tensor, int, int | None]:
    """The prompt's last logits (``[vocab]``), how many of its tokens came from ``cache`` (None: a
    plain prefill) and the prompt's ticket there (``PrefixCache.prefilling``; None without a
    cache): the caller saves the prompt's blocks (``save_prefix``), then ends the ticket
    (``PrefixCache.done``), which lets prompts that wait for them go on. :func:`decode_steps`
    does that once the first token is out: the copy is not part of the time to first token."""
    if cache is None:
        return runtime.prefill(prompt_ids), 0, None
    rt = cast(PrefixRuntime, runtime)
    wait = getattr(runtime, "wait_step", None)  # a batched engine's slot: others prefill meanwhile
    for _ in range(MAX_PREFIX_WAIT if wait is not None else 0):
        if not cache.in_flight(prompt_ids):
            break
        wait()  # another request is prefilling this prompt's start: reuse it once it is cached
    reused = rt.reuse_prefix(prompt_ids, cache)
    ticket = cache.prefilling(prompt_ids)
    try:
        logits = rt.prefill(prompt_ids, start=reused)
    except BaseException:
        cache.done(ticket)
        raise
    return logits, reused, ticket


def _steps(runtime: Runtime, context: list[int], cfg: SamplingConfig, generator: torch.Generator,
           drafter: Drafter | None, policy: KPolicy, max_new_tokens: int | None, stats: SpecStats,
           clock: Callable[[], float]) -> Iterator[Step]:
    """The loop after the prompt's first token (:func:`decode_steps`)."""
    produced = 1
    while True:
        _run_step_hooks()
        left = max_new_tokens - produced - 1 if max_new_tokens is not None else policy.k_max
        budget = min(policy.choose(len(context)), left) if drafter is not None else 0
        t0 = clock()
        draft, shadow = propose_step(drafter, policy, context, budget, left)
        t1 = clock()
        verdict, ranks, verified = verify_pass(runtime, context[-1], draft, cfg, generator)
        depth = verified.depth  # what was verified: a tree, or its first chain on some runtimes
        if drafter is not None and draft.tokens:
            drafter.observe(verdict.accepted)
            policy.observe(depth, verdict.accepted)
        elif shadow is not None:
            policy.observe_shadow(shadow, verdict.tokens)
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += clock() - t1
        context.extend(verdict.tokens)
        produced += len(verdict.tokens)
        yield Step(len(verified), verdict, ranks, depth)


def plain_tokens(
    runtime: Runtime, prompt_ids: Sequence[int], cfg: SamplingConfig, generator: torch.Generator
) -> Iterator[int]:
    """Plain autoregressive decoding, one token at a time, forever (the caller stops)."""
    for step in decode_steps(runtime, prompt_ids, cfg, generator):
        yield from step.verdict.tokens


class Stream:
    """Iterate to get text pieces as they are decoded; ``result`` is set when it ends.

    Pieces concatenate to ``result.text``; a multi-byte character is never split between pieces.
    """

    def __init__(
        self,
        model: Model,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop: Sequence[str],
        drafter: Drafter | None = None,
        k: int | KPolicy = 4,
        learn: bool = True,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.learn = learn
        self.prefix_cache = prefix_cache
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop = tuple(stop)
        self.drafter = drafter
        self.k = k
        self.stats = SpecStats()
        self.result: GenerationResult | None = None
        self._steps = self._run()
        self._iter = (piece for pieces in self._steps for piece in pieces)

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def by_step(self) -> Iterator[str]:
        """The text of each target pass, one piece per pass (a pass may commit several tokens),
        for consumers with a cost per piece, such as a server sending one chunk per piece.
        Iterate this *or* the stream itself, not both."""
        return ("".join(pieces) for pieces in self._steps if pieces)

    def close(self) -> None:
        """Stop the generation now (the decode loop ends at this step); ``result`` stays None and
        ``stats`` holds what was done so far."""
        self._steps.close()

    def _run(self) -> Iterator[list[str]]:
        model, stats = self.model, self.stats
        generation = Generation(eos_token_ids=model.eos_token_ids, max_new_tokens=self.max_new_tokens,
                                drafter=self.drafter, text=TextAssembler(model.tokenizer, self.stop), learn=self.learn)
        start = time.perf_counter()
        prefill_s = 0.0
        steps = decode_steps(
            model.runtime,
            self.prompt_ids,
            self.sampling,
            self.sampling.generator(),
            k=self.k,
            max_new_tokens=self.max_new_tokens,
            stats=stats,
            generation=generation,
            prefix_cache=self.prefix_cache,
        )
        pieces: list[str] = []
        try:
            for step in steps:
                if not prefill_s:
                    prefill_s = time.perf_counter() - start
                kept, pieces = generation.take(step.verdict.tokens)
                stats.record(step.num_proposed, step.verdict, kept, ranks=step.ranks, depth=step.positions)
                if generation.finish is not None:
                    break
                yield pieces
        finally:
            steps.close()
            generation.end()  # a cancelled generation (finish None) teaches nothing
        assert generation.finish is not None and generation.text is not None
        piece = generation.text.finish()
        if piece:
            pieces.append(piece)
        self.result = GenerationResult(
            text=generation.text.text,
            token_ids=generation.tokens,
            finish_reason=generation.finish,
            prompt_tokens=len(self.prompt_ids),
            seconds=time.perf_counter() - start,
            prefill_seconds=prefill_s,
            stats=stats,
            draft=getattr(self.drafter, "name", "none"),
            k=(self.k if isinstance(self.k, int) else "auto") if self.drafter is not None else 0,
            eos_token=generation.eos_token,
            cached_tokens=generation.cached_tokens,
        )
        yield pieces


def stream(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
    draft: Drafter | None = None,
    k: int | KPolicy = 4,
    learn: bool = True,
    prefix_cache: PrefixCache | None = None,
) -> Stream:
    """Start a generation and return a :class:`Stream` of text pieces.

    ``prompt`` is text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as they are. ``draft`` is a drafter object or None
    (plain decoding; :func:`draftwise.stream` builds one from a spec such as ``"lookup"``); ``k`` is how many tokens it proposes per step, or a
    :class:`~draftwise.core.kpolicy.KPolicy` that chooses it every step. ``learn=False``: a draft
    that learns across generations (suffix decoding's cache) does not learn from this one (a
    warm-up, a repeat of a question it must not find its own answer to). ``prefix_cache``: the
    prompt reuses the K/V of the longest prefix the cache holds and leaves its own there
    (:mod:`draftwise.runtime.prefix_cache`; ignored on a runtime that does not reuse prefixes),
    the same bits either way; ``result.cached_tokens`` says how many tokens it reused.
    """
    if isinstance(model, str):
        model = load_model(model)
    stop = _check_options(max_new_tokens, k, stop, draft, prefix_cache)
    drafter = draft
    if isinstance(prompt, str):
        prompt_ids = model.encode_prompt(prompt, chat=chat)
    else:
        prompt_ids = check_token_ids(prompt, model.runtime.vocab_size)
    if not prompt_ids:
        raise ConfigError("the prompt is empty; pass some text or at least one token id")
    limit = model.runtime.max_context
    if len(prompt_ids) + max_new_tokens > limit:
        raise ContextLengthError(
            f"the prompt has {len(prompt_ids)} tokens and max_new_tokens is {max_new_tokens}: "
            f"{len(prompt_ids) + max_new_tokens} > the context of {limit} tokens; shorten the "
            "prompt or lower --max-new-tokens"
        )
    return Stream(
        model,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        sampling=sampling or SamplingConfig(),
        stop=stop,
        drafter=drafter,
        k=k,
        learn=learn,
        prefix_cache=prefix_cache,
    )


def _check_options(max_new_tokens: int, k: int | KPolicy, stop: Sequence[str] | str, draft: Drafter | None,
                   prefix_cache: PrefixCache | None) -> Sequence[str]:
    """:func:`stream`'s options, each refused in one line naming it; the stop strings as a sequence."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if not isinstance(k, KPolicy) and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(
            f"k={k!r} must be an integer >= 1 (the number of tokens a draft proposes) or 'auto'"
        )
    if isinstance(stop, str):
        stop = (stop,)
    if any(not isinstance(s, str) or not s for s in stop):
        raise ConfigError("stop strings must be non-empty strings")
    if draft is not None and not isinstance(draft, Drafter):
        raise ConfigError(f"draft={draft!r}: the core loop takes a drafter object; draftwise.stream and "
                          "draftwise.generate take a spec such as 'lookup'")
    if prefix_cache is not None and not isinstance(prefix_cache, PrefixCache):
        raise ConfigError(f"prefix_cache={prefix_cache!r} must be a draftwise.PrefixCache or None")
    return stop


def check_token_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """``ids`` as a list of ints, each a token of a vocabulary of ``vocab_size``.

    >>> check_token_ids([1, 2], 10)
    [1, 2]
    """
    out: list[int] = []
    for i in ids:
        try:
            if isinstance(i, bool):
                raise TypeError
            i = operator.index(i)
        except TypeError:
            raise ConfigError(f"token ids must be integers, got {i!r}") from None
        if not 0 <= i < vocab_size:
            raise ConfigError(f"token id {i} is out of range: this model's vocabulary has ids 0..{vocab_size - 1}")
        out.append(i)
    return out


def generate(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
    draft: Drafter | None = None,
    k: int | KPolicy = 4,
    learn: bool = True,
    prefix_cache: PrefixCache | None = None,
) -> GenerationResult:
    """Generate a completion of ``prompt``; see :func:`stream` for the arguments.

    The output is exactly what plain decoding of the target gives (greedy: token for token;
    sampling: in distribution), whatever the draft; the draft only changes the speed.
    """
    s = stream(
        model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, chat=chat,
        draft=draft, k=k, learn=learn, prefix_cache=prefix_cache,
    )
    for _ in s:
        pass
    assert s.result is not None
    return s.result
