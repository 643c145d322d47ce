"""Response bodies and stream chunks in OpenAI's format, with the per-request statistics.

Every finished response (the last chunk of a stream) carries three views of one generation:

- ``usage`` (OpenAI): prompt, completion and total tokens, and ``prompt_tokens_details.cached_tokens``,
  the prompt tokens whose K/V came from the prefix cache (0 when it is off or missed);
- ``speculative`` (draftwise's own vocabulary, :class:`~draftwise.core.stats.SpecStats`): draft, k,
  who chose them, proposed, accepted, committed, target passes, mean committed per pass,
  acceptance by position, draft and verify seconds; plus SGLang's ``spec_accept_rate`` and
  ``spec_accept_length`` (= mean committed per pass, the bonus token included);
- ``timings`` (llama.cpp's server): cache_n (prompt tokens from the prefix cache), prompt_n (the
  prompt tokens prefilled, as llama.cpp counts them: the cached ones are not), prompt_ms,
  predicted_n, predicted_ms, predicted_per_second, draft_n, draft_n_accepted, so dashboards built
  on it read it as is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from draftwise.core.generation import GenerationResult
from draftwise.core.stats import SpecStats
from draftwise.server.speculation import Choice

Kind = Literal["chat", "text"]


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's reasons: an EOS token or a stop string is ``stop``; the budget is ``length``."""
    return "length" if result.finish_reason == "length" else "stop"


def usage(result: GenerationResult) -> dict[str, Any]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.new_tokens,
            "total_tokens": result.prompt_tokens + result.new_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def speculative(choice: Choice, stats: SpecStats) -> dict[str, Any]:
    return {
        "draft": str(choice.draft),
        "k": choice.k,
        "chosen_by": choice.chosen_by,
        "category": choice.category,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "committed": stats.committed,
        "target_passes": stats.target_passes,
        "mean_committed_per_pass": stats.mean_committed_per_pass,
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_by_position": stats.acceptance_by_position,
        "draft_seconds": stats.draft_seconds,
        "verify_seconds": stats.verify_seconds,
        "spec_accept_rate": stats.acceptance_rate,
        "spec_accept_length": stats.mean_committed_per_pass,
    }


def timings(result: GenerationResult, stats: SpecStats) -> dict[str, Any]:
    prompt_ms = result.prefill_seconds * 1000
    predicted_ms = max(result.seconds - result.prefill_seconds, 0.0) * 1000
    n, prefilled = result.new_tokens, result.prompt_tokens - result.cached_tokens
    return {
        "cache_n": result.cached_tokens,
        "prompt_n": prefilled,
        "prompt_ms": prompt_ms,
        "prompt_per_second": prefilled / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n if n else 0.0,
        "predicted_per_second": n / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
        "draft_n": stats.proposed,
        "draft_n_accepted": stats.accepted,
    }


@dataclass
class Envelope:
    """What every body of one request shares: its id, kind, model name and creation time."""

    request_id: str
    kind: Kind
    model: str
    created: int = 0

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def stats(self, result: GenerationResult, stats: SpecStats, choice: Choice) -> dict[str, Any]:
        return {"usage": usage(result), "speculative": speculative(choice, stats), "timings": timings(result, stats)}

    def full(self, result: GenerationResult, stats: SpecStats, choice: Choice, *, token_ids: bool) -> dict[str, Any]:
        """The non-streamed response."""
        choice_body: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(result), "logprobs": None}
        if self.kind == "chat":
            choice_body["message"] = {"role": "assistant", "content": result.text}
            obj = "chat.completion"
        else:
            choice_body["text"] = result.text
            obj = "text_completion"
        if token_ids:
            choice_body["token_ids"] = list(result.token_ids)
        return {**self._base(obj), "choices": [choice_body], **self.stats(result, stats, choice)}

    def chunk(self, text: str | None, *, role: bool = False, finish: str | None = None,
              token_ids: list[int] | None = None) -> dict[str, Any]:
        """One streamed chunk (``text=None`` with ``role``: the chat stream's opening chunk)."""
        body: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None or role:
                delta["content"] = text or ""
            body["delta"] = delta
            obj = "chat.completion.chunk"
        else:
            body["text"] = text or ""
            obj = "text_completion"
        if token_ids is not None:
            body["token_ids"] = token_ids
        return {**self._base(obj), "choices": [body]}

    def final_chunk(self, result: GenerationResult, stats: SpecStats, choice: Choice, *,
                    token_ids: bool) -> dict[str, Any]:
        """The last content chunk: the finish reason and every statistic."""
        out = self.chunk(None, finish=finish_reason(result), token_ids=list(result.token_ids) if token_ids else None)
        out.update(self.stats(result, stats, choice))
        return out

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        """OpenAI's ``stream_options.include_usage`` chunk: no choices, only usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage(result)}
