"""The request bodies of the OpenAI-compatible API, as pydantic models that refuse what they
cannot honour.

Every parameter is honoured or refused, never silently ignored: an unknown field, ``n > 1``,
``logprobs``, a non-empty ``logit_bias`` or a non-zero penalty is a validation error that names
the parameter, and the app turns it into HTTP 400 in OpenAI's error schema
(:func:`validation_error_body`). As in vLLM's ``entrypoints/openai/protocol.py``, the models
are the one place a request is checked; handlers never re-validate by hand.

Two refusals hold for every field of every body: a lone surrogate (``"\\ud800"``, valid JSON
but not Unicode, which the tokenizer cannot encode) anywhere in a string, and ``true``/``false``
where a number is expected (``"max_tokens": true`` is not 1).

Extensions beyond OpenAI's API: ``top_k`` (as in vLLM), ``return_token_ids`` (vLLM's name:
the generated ids come back in each choice) and ``speculative`` (how this request speculates).
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from draftwise.core.sampling import MAX_SEED
from draftwise.drafters.spec import DraftSpec, parse_k
from draftwise.errors import ConfigError

#: OpenAI allows at most four stop sequences
MAX_STOP = 4


class APIError(Exception):
    """An error answered in OpenAI's schema: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _param_path(loc: tuple[Any, ...]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


#: pydantic refuses a lone surrogate in a constrained string itself (``string_unicode``); the
#: other strings are checked by :class:`_Strict`. Both answer with this.
SURROGATE = "holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode; send UTF-8 text"


def _message(error: dict[str, Any]) -> str:
    if error.get("type") == "string_unicode":
        return SURROGATE
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def validation_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The first pydantic/FastAPI validation error as one OpenAI error naming its parameter."""
    e = errors[0] if errors else {"type": "invalid", "loc": (), "msg": "invalid request"}
    kind, param, msg = e.get("type", ""), _param_path(tuple(e.get("loc", ()))), _message(e)
    if kind == "json_invalid":
        return error_body("the request body is not valid JSON", code="invalid_json")
    if kind == "missing" and param is None:
        return error_body("the request has no body; send a JSON object", code="missing_body")
    if kind == "extra_forbidden":
        return error_body(f"unsupported parameter: '{param}' is not implemented by this server; remove it",
                          param=param, code="unsupported_parameter")
    if kind == "missing":
        return error_body(f"'{param}' is required", param=param, code="missing_required_parameter")
    if kind == "string_unicode" and param is None:  # in a field's name: pydantic gives no location
        return error_body(f"the body {msg}", code="invalid_value")
    code = "unsupported_parameter" if "not supported" in msg else "invalid_value"
    return error_body(f"invalid '{param}': {msg}" if param else msg, param=param, code=code)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string, or a string in a list or dict (keys included), holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else ()
    return any(map(_has_lone_surrogate, items))


def _takes(annotation: Any, kind: type) -> bool:
    """Whether a field's annotation accepts ``kind`` (``int | None`` takes int; a model is its own)."""
    if annotation is kind:
        return True
    if get_origin(annotation) in (Union, UnionType, Annotated):
        return any(_takes(a, kind) for a in get_args(annotation))
    return False


class _Strict(BaseModel):
    """Unknown fields, lone surrogates and booleans for numbers are refused in every body."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, v: Any, info: Any) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(v, bool) and not _takes(annotation, bool):
            what = "a whole number" if _takes(annotation, int) else "a number" if _takes(annotation, float) else None
            raise ValueError(f"must be {what or 'a value'}, not a boolean ({str(v).lower()})")
        return v

    @field_validator("*")
    @classmethod
    def _no_lone_surrogates(cls, v: Any) -> Any:
        if _has_lone_surrogate(v):
            raise ValueError(SURROGATE)
        return v


class StreamOptions(_Strict):
    include_usage: bool = False


class Speculative(_Strict):
    """Per-request speculation: ``{"draft": "lookup", "k": 4}``, ``{"draft": "none"}``,
    ``{"k": "auto"}``; ``draft: "auto"`` (or ``category`` alone) asks the server's plan."""

    draft: str | None = Field(None, description="A draft spec (none, lookup, self, model:...) or 'auto'.")
    k: int | str | None = Field(None, description="Tokens proposed per step (>= 1) or 'auto'.")
    category: str | None = Field(
        None, max_length=64, description="Workload category the plan routes by (default: 'overall')."
    )

    @field_validator("draft")
    @classmethod
    def _draft(cls, v: str | None) -> str | None:
        if v is None or v.strip() == "auto":
            return None if v is None else "auto"
        try:
            return str(DraftSpec.parse(v))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("k", mode="wrap")
    @classmethod
    def _k(cls, v: Any, handler: Any) -> int | str | None:
        if v is None:
            return None
        try:
            return parse_k(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def _no_union_noise(what: str):  # type: ignore[no-untyped-def]
    """A wrap validator that reports a union's mismatch as one line instead of one per branch."""

    def check(cls: Any, v: Any, handler: Any) -> Any:
        try:
            return handler(v)
        except ValidationError as exc:
            ours = next((e for e in exc.errors() if e.get("type") in ("value_error", "string_unicode")), None)
            if ours is not None:  # our own message (or pydantic's surrogate), from whichever branch: keep it
                raise ValueError(_message(ours)) from None
            raise ValueError(f"must be {what}") from None

    return classmethod(check)


StopList = Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)]


class _Sampling(_Strict):
    """What completions and chat completions share."""

    model: str | None = Field(None, max_length=256, description="The served model's name (optional).")
    max_tokens: int | None = Field(None, ge=1, description="New tokens at most (default: the server's cap).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1, description="Extension: keep the k most likely tokens (0 or -1 = off).")
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Annotated[str, Field(min_length=1)] | StopList | None = Field(None, description="Up to 4 stop strings.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description="Only 1 is supported.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported (only empty).")
    presence_penalty: float = Field(0.0, description="Not supported (only 0).")
    frequency_penalty: float = Field(0.0, description="Not supported (only 0).")
    user: str | None = Field(None, max_length=256, description="An end-user id, logged.")
    speculative: Speculative | None = None
    return_token_ids: bool = Field(False, description="Extension: return the generated token ids.")

    _stop = field_validator("stop", mode="wrap")(_no_union_noise("a non-empty string or a list of up to 4"))

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"n={v} is not supported: this server returns one choice; send n=1 or omit it")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> None:
        if v:
            raise ValueError("logit_bias is not supported by this server; omit it")
        return None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float) -> float:
        if v != 0:
            raise ValueError("penalties are not supported by this server (they would change the output); omit it")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        return 0 if v == -1 else v  # vLLM's "off"

    @property
    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    _content = field_validator("content", mode="wrap")(_no_union_noise("a string or a list of text parts"))

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens.")
    logprobs: bool = Field(False, description="Not supported (only false).")
    top_logprobs: int | None = Field(None, description="Not supported.")

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool) -> bool:
        if v:
            raise ValueError("logprobs are not supported by this server; omit it")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None) -> None:
        if v:
            raise ValueError("top_logprobs is not supported by this server; omit it")
        return None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def openai_messages(self) -> list[dict[str, str]]:
        """The messages for a chat template (``developer`` is OpenAI's new name for ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] = Field(
        ..., description="Text, token ids, or a list holding one text (batches are not supported)."
    )
    logprobs: int | None = Field(None, description="Not supported.")
    echo: bool = Field(False, description="Not supported (only false).")
    suffix: str | None = Field(None, description="Not supported.")
    best_of: int | None = Field(None, description="Not supported (only 1).")

    _prompt = field_validator("prompt", mode="wrap")(
        _no_union_noise("a string, a list of token ids, or a list with one string")
    )

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty; send text or at least one token id")
        if isinstance(v, list) and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError(f"{len(v)} prompts in one request: batches are not supported; send one")
            return v[0]
        return v

    @field_validator("logprobs", "suffix")
    @classmethod
    def _unsupported(cls, v: Any, info: Any) -> None:
        if v:
            raise ValueError(f"{info.field_name} is not supported by this server; omit it")
        return None

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by this server; omit it")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> None:
        if v not in (None, 1):
            raise ValueError(f"best_of={v} is not supported: send 1 or omit it")
        return None
