"""The decode loop: prompt -> tokens -> text, with streaming, EOS, stop strings and a budget.

Example (loads the embedded default model)::

    from draftwise import SamplingConfig, generate, load_model, stream
    model = load_model("default")
    print(generate(model, "Name a colour.", max_new_tokens=8).text)
    for piece in stream(model, "Tell me a story.", sampling=SamplingConfig(temperature=0.7, seed=0)):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from .drafters.base import Draft, Drafter
from .errors import ConfigError, ContextLengthError
from .loaders import Model, load_model
from .cost.adaptive import AdaptiveK, FixedK
from .metrics import SpecStats
from .runtime.base import Runtime
from .sampling import SamplingConfig, logits_to_probs, next_token
from .text import TextAssembler
from .verify import Verdict, verify_greedy, verify_sampled

FinishReason = Literal["eos", "stop", "length"]
KPolicy = FixedK | AdaptiveK


@dataclass
class GenerationResult:
    """What one generation produced.

    ``token_ids`` are the new tokens (the EOS token that ended a generation is not included);
    ``seconds`` is wall time with prefill included.
    """

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    seconds: float
    prefill_seconds: float
    stats: SpecStats = field(default_factory=SpecStats)
    draft: str = "none"
    k: int | str = 0

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stats"] = self.stats.to_dict()
        out["new_tokens"] = self.new_tokens
        out["tokens_per_second"] = self.tokens_per_second
        return out


@dataclass(frozen=True)
class Step:
    """One target pass: how many tokens were proposed and what verification committed."""

    num_proposed: int
    verdict: Verdict


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
) -> Iterator[Step]:
    """The loop: propose -> verify -> commit / roll back -> observe. Runs until the caller stops.

    The last committed token is never in the target's cache: each pass feeds it together with
    the proposal, ``[last, x_1..x_m]``, and gets m + 1 rows of logits back. Without a drafter
    (or when it proposes nothing) a pass is a plain decode step. ``max_new_tokens`` only caps
    how many tokens are proposed, so no pass does work the budget will throw away. ``k`` is a
    number or a policy that picks it each step (:class:`draftwise.cost.adaptive.AdaptiveK`).
    """
    stats = stats if stats is not None else SpecStats()
    clock = time.perf_counter
    t0 = clock()
    logits = runtime.prefill(prompt_ids)  # [vocab]
    first = next_token(logits, cfg, generator)
    stats.verify_seconds += clock() - t0
    context = list(prompt_ids) + [first]
    if drafter is not None:
        drafter.start(prompt_ids, cfg, generator)
    yield Step(0, Verdict(accepted=0, tokens=[first], bonus=False))
    produced = 1
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    while True:
        left = max_new_tokens - produced - 1 if max_new_tokens is not None else policy.k_max
        budget = min(policy.choose(len(context)), left) if drafter is not None else 0
        shadow: list[int] | None = None
        t0 = clock()
        if drafter is not None and budget > 0:
            draft = drafter.propose(context, budget)
        else:
            draft = Draft([])
            if drafter is not None and policy.shadow and left > 0:
                shadow = drafter.propose(context, 1).tokens  # costs ~nothing; see cost.adaptive
        t1 = clock()
        base = runtime.length
        rows = runtime.forward([context[-1], *draft.tokens])  # [m + 1, vocab]
        if cfg.greedy:
            verdict = verify_greedy(draft.tokens, rows)
        else:
            verdict = verify_sampled(draft.tokens, draft.probs, logits_to_probs(rows, cfg), generator)
        runtime.rollback(base + 1 + verdict.accepted)  # keep `last` and the accepted tokens
        if drafter is not None and draft.tokens:
            drafter.observe(verdict.accepted)
            policy.observe(len(draft.tokens), verdict.accepted)
        elif shadow is not None:
            policy.observe_shadow(shadow, verdict.tokens)
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += clock() - t1
        context.extend(verdict.tokens)
        produced += len(verdict.tokens)
        yield Step(len(draft.tokens), verdict)


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
    ) -> None:
        self.model = model
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop = tuple(stop)
        self.drafter = drafter
        self.k = k
        self.stats = SpecStats()
        self.result: GenerationResult | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def _run(self) -> Iterator[str]:
        model, stats = self.model, self.stats
        assembler = TextAssembler(model.tokenizer, self.stop)
        ids: list[int] = []
        finish: FinishReason | None = None
        start = time.perf_counter()
        prefill_s = 0.0
        steps = decode_steps(
            model.runtime,
            self.prompt_ids,
            self.sampling,
            self.sampling.generator(),
            drafter=self.drafter,
            k=self.k,
            max_new_tokens=self.max_new_tokens,
            stats=stats,
        )
        for step in steps:
            if not prefill_s:
                prefill_s = time.perf_counter() - start
            kept = 0
            for token in step.verdict.tokens:  # a step may commit several tokens
                kept += 1
                if token in model.eos_token_ids:
                    finish = "eos"
                    break
                ids.append(token)
                piece = assembler.push([token])
                if piece:
                    yield piece
                if assembler.stopped:
                    finish = "stop"
                    break
                if len(ids) >= self.max_new_tokens:
                    finish = "length"
                    break
            stats.record(step.num_proposed, step.verdict, kept)
            if finish is not None:
                break
        steps.close()
        piece = assembler.finish()
        if piece:
            yield piece
        assert finish is not None
        self.result = GenerationResult(
            text=assembler.text,
            token_ids=ids,
            finish_reason=finish,
            prompt_tokens=len(self.prompt_ids),
            seconds=time.perf_counter() - start,
            prefill_seconds=prefill_s,
            stats=stats,
            draft=getattr(self.drafter, "name", "none"),
            k=(self.k if isinstance(self.k, int) else "auto") if self.drafter is not None else 0,
        )


def stream(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
    draft: Drafter | str | None = None,
    k: int | Literal["auto"] | AdaptiveK = 4,
) -> Stream:
    """Start a generation and return a :class:`Stream` of text pieces.

    ``prompt`` is text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as they are. ``draft`` is a drafter object or a
    spec string: ``"none"``, ``"lookup"``, ``"self"``, ``"model:PATH"`` (see
    :func:`draftwise.drafters.make_drafter`); ``k`` is how many tokens it proposes per step, or
    ``"auto"`` to choose k (or no speculation) every step from the machine profile and the
    acceptance seen so far (:mod:`draftwise.cost.adaptive`).
    """
    from .drafters import make_drafter

    if isinstance(model, str):
        model = load_model(model)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if k != "auto" and not isinstance(k, AdaptiveK) and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(
            f"k={k!r} must be an integer >= 1 (the number of tokens a draft proposes) or 'auto'"
        )
    if isinstance(stop, str):
        stop = (stop,)
    if any(not s for s in stop):
        raise ConfigError("stop strings must be non-empty")
    drafter = make_drafter(draft, model)
    if k == "auto":
        from .cost.adaptive import resolve_profile

        key = draft.strip() if isinstance(draft, str) else getattr(drafter, "name", "draft")
        k = AdaptiveK(resolve_profile(model, key), key) if drafter is not None else 1
    prompt_ids = model.encode_prompt(prompt, chat=chat) if isinstance(prompt, str) else list(prompt)
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
    )


def generate(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
    draft: Drafter | str | None = None,
    k: int | Literal["auto"] | AdaptiveK = 4,
) -> GenerationResult:
    """Generate a completion of ``prompt``; see :func:`stream` for the arguments.

    The output is exactly what plain decoding of the target gives (greedy: token for token;
    sampling: in distribution), whatever the draft; the draft only changes the speed.
    """
    s = stream(
        model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, chat=chat,
        draft=draft, k=k,
    )
    for _ in s:
        pass
    assert s.result is not None
    return s.result
