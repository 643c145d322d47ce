"""One generation: its finish rules (EOS, stop strings, the token budget), its drafter's
lifecycle (``start`` once, before the prompt's prefill; ``end`` once, with the answer if the
generation finished, else None), and what it produced (:class:`GenerationResult`).

Every path that runs a generation, or plays one back to a drafter, goes through this object:
the decode loop (:func:`draftwise.core.decode.decode_steps` starts the drafter through it),
:class:`draftwise.core.decode.Stream` (and so the server, the bench and ``generate``), the
planner's trace and replay (:mod:`draftwise.planner.replay`), profile measurement
(:mod:`draftwise.cost.measure`) and the bench's teaching of a learning draft. So a learning
draft (suffix decoding's cache) learns exactly the finished answers, without the EOS token that
ended them, and nothing from a cancelled generation or a measurement.

Example: EOS is id 2, a budget of 3 tokens::

    >>> g = Generation(eos_token_ids={2}, max_new_tokens=3)
    >>> g.take([5, 6]), g.finish
    ((2, []), None)
    >>> g.take([7, 8]), g.finish, g.tokens
    ((1, []), 'length', [5, 6, 7])
    >>> e = Generation(eos_token_ids={2}, max_new_tokens=8)
    >>> e.take([5, 2, 9]), e.finish, e.eos_token, e.tokens
    ((2, []), 'eos', 2, [5])
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

from draftwise.core.draft import Drafter
from draftwise.core.sampling import SamplingConfig
from draftwise.core.stats import SpecStats
from draftwise.core.text import TextAssembler

FinishReason = Literal["eos", "stop", "length"]


class Generation:
    """The finish rules and the drafter's lifecycle of one generation (module docstring).

    ``text``: a :class:`~draftwise.core.text.TextAssembler` when the generation produces text
    (its stop strings end it); ``learn=False``: a learning draft does not learn this answer (a
    warm-up, a measurement, a repeat of a question it must not find its own answer to)."""

    def __init__(self, *, eos_token_ids: Collection[int], max_new_tokens: int, drafter: Drafter | None = None,
                 text: TextAssembler | None = None, learn: bool = True) -> None:
        self.eos_token_ids = eos_token_ids
        self.max_new_tokens = max_new_tokens
        self.drafter = drafter
        self.text = text
        self.learn = learn
        self.tokens: list[int] = []  # what it kept: the EOS token that ended it is not among them
        self.finish: FinishReason | None = None
        self.eos_token: int | None = None
        self.cached_tokens = 0  # prompt tokens whose K/V a prefix cache gave (the decode loop sets it)
        self._started = self._ended = False

    def start(self, prompt_ids: Sequence[int], cfg: SamplingConfig, generator: torch.Generator) -> None:
        """Start the drafter on ``prompt_ids`` (once; before the prefill: an EAGLE head sets which
        of the target's layers it records)."""
        if self.drafter is not None and not self._started:
            self.drafter.start(list(prompt_ids), cfg, generator)
        self._started = True

    def take(self, tokens: Sequence[int]) -> tuple[int, list[str]]:
        """Take one step's committed tokens until EOS, a stop string or the budget: how many of
        them count (the EOS token included) and the text pieces they made. ``finish`` says why
        the generation ends, or stays None."""
        pieces: list[str] = []
        kept = 0
        for token in tokens:  # a step may commit several tokens
            if self.finish is not None:
                break
            kept += 1
            if token in self.eos_token_ids:
                self.finish, self.eos_token = "eos", int(token)
                break
            self.tokens.append(int(token))
            if self.text is not None:
                piece = self.text.push([token])
                if piece:
                    pieces.append(piece)
                if self.text.stopped:
                    self.finish = "stop"
                    break
            if len(self.tokens) >= self.max_new_tokens:
                self.finish = "length"
        return kept, pieces

    def play(self, tokens: Sequence[int]) -> None:
        """Take a whole answer that has already finished (a replay of a traced generation, or an
        answer another drafter decoded): the rules apply, and it counts as finished wherever it
        stops."""
        self.take(tokens)
        if self.finish is None:
            self.finish = "stop"  # it ended where it was cut (a stop string, or the caller's end)

    def end(self) -> None:
        """End the drafter's generation (once): a finished one hands it the answer to learn from
        (when ``learn``), a cancelled one None."""
        if self._ended:
            return
        self._ended = True
        if self.drafter is not None and self._started:
            self.drafter.end(list(self.tokens) if self.finish is not None and self.learn else None)


@dataclass
class GenerationResult:
    """What one generation produced.

    ``token_ids`` are the new tokens (the EOS token that ended a generation is not included:
    it is ``eos_token``); ``seconds`` is wall time with prefill included.
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
    eos_token: int | None = None  # the end-of-sequence token that ended it (finish_reason "eos")
    cached_tokens: int = 0  # of prompt_tokens, those a prefix cache gave (not prefilled)

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
