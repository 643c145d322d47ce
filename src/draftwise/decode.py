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
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import ConfigError, ContextLengthError
from .loaders import Model, load_model
from .runtime.base import Runtime
from .sampling import SamplingConfig, next_token
from .text import TextAssembler

FinishReason = Literal["eos", "stop", "length"]


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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        extra = out.pop("extra")
        out["new_tokens"] = self.new_tokens
        out["tokens_per_second"] = self.tokens_per_second
        out.update(extra)
        return out


def plain_tokens(
    runtime: Runtime, prompt_ids: Sequence[int], cfg: SamplingConfig, generator: Any
) -> Iterator[int]:
    """Plain autoregressive decoding: one target pass per token, forever (the caller stops)."""
    logits = runtime.prefill(prompt_ids)  # [vocab]
    while True:
        token = next_token(logits, cfg, generator)
        yield token
        logits = runtime.forward([token])[-1]


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
    ) -> None:
        self.model = model
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop = tuple(stop)
        self.result: GenerationResult | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def _run(self) -> Iterator[str]:
        model, rt = self.model, self.model.runtime
        assembler = TextAssembler(model.tokenizer, self.stop)
        generator = self.sampling.generator()
        ids: list[int] = []
        finish: FinishReason = "length"
        start = time.perf_counter()
        prefill_s = 0.0
        tokens = plain_tokens(rt, self.prompt_ids, self.sampling, generator)
        for token in tokens:
            if not ids and not prefill_s:
                prefill_s = time.perf_counter() - start
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
                break
        tokens.close()
        piece = assembler.finish()
        if piece:
            yield piece
        self.result = GenerationResult(
            text=assembler.text,
            token_ids=ids,
            finish_reason=finish,
            prompt_tokens=len(self.prompt_ids),
            seconds=time.perf_counter() - start,
            prefill_seconds=prefill_s,
        )


def stream(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
) -> Stream:
    """Start a generation and return a :class:`Stream` of text pieces.

    ``prompt`` is text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as they are.
    """
    if isinstance(model, str):
        model = load_model(model)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if isinstance(stop, str):
        stop = (stop,)
    if any(not s for s in stop):
        raise ConfigError("stop strings must be non-empty")
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
    )


def generate(
    model: Model | str,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    stop: Sequence[str] = (),
    chat: bool | None = None,
) -> GenerationResult:
    """Generate a completion of ``prompt``; see :func:`stream` for the arguments."""
    s = stream(model, prompt, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, chat=chat)
    for _ in s:
        pass
    assert s.result is not None
    return s.result
