"""The FastAPI app: OpenAI's endpoints in front of one :class:`~draftwise.server.worker.Worker`.

``/v1/chat/completions`` and ``/v1/completions`` (streamed as server-sent events in OpenAI's
chunk format, ending ``data: [DONE]``, or not), ``/v1/models``, ``/health`` and ``/metrics``.

Everything that can be refused is refused before the request queues: the body's schema
(:mod:`~draftwise.server.protocol`, HTTP 400 naming the parameter), the model name (404), the
prompt over the context or ``max_tokens`` over the cap (400), a draft the server was not
started with or ``k: "auto"`` on a server that read no profile (400), a full queue (429). So a
streamed request is refused with its status too, never with a 200 and an error event. A body
sent as anything but JSON (``Content-Type: text/plain``, a form, none) gets 415 saying so. Error
bodies are ASCII JSON, since they may quote what a client sent. The gate in front of the app
checks the API key (401, every path but ``/health``, constant-time compare) and the body size
(413) before a body is parsed.

A client that hangs up is cancelled, streamed or not: its job ends at its next step, frees its
place (a batch slot) and counts as ``finished_reason="abort"`` in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftwise.core.decode import check_token_ids
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.spec import clip
from draftwise.errors import ConfigError
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.prefix_cache import PrefixCache
from draftwise.server.metrics import ServerMetrics
from draftwise.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    validation_error_body,
)
from draftwise.server.responses import Envelope
from draftwise.server.speculation import Speculation
from draftwise.server.worker import (
    Event,
    Job,
    JobHandle,
    ModelThread,
    QueueFull,
    Worker,
)

_ERROR_STATUS = {"timeout": 504, "internal": 500, "invalid": 400, "cancelled": 503}
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
_ERROR_TYPE = {504: "timeout_error", 500: "server_error", 503: "server_error", 400: "invalid_request_error"}
#: how often a non-streamed request checks that its client is still there
DISCONNECT_POLL_S = 0.25


@dataclass(frozen=True)
class ServerSettings:
    """What ``draftwise serve`` fixes at start-up besides the model and its speculation."""

    model_name: str
    api_key: str | None = None
    max_queue: int = 128
    max_tokens_cap: int = 1024
    request_timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    max_batch: int = 1  # requests decoded together (the batched engine when > 1)
    prefill_chunk: int = 16  # prompt tokens a request feeds per step while more decode (engine.step_chunk)
    context: int | None = None  # positions per request, prompt and answer (None: the model's); at most the model's
    #: the prefix cache's bound in MiB (0: off; ``serve`` turns it on: --prefix-cache-mb); off where the runtime
    #: does not reuse prefixes (the Hugging Face adapter, a compiled runtime)
    prefix_cache_mb: int = 0

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty, which would turn authentication off; give a key, or None "
                              "to serve without one")
        least = {"max_queue": 1, "max_tokens_cap": 1, "max_body_bytes": 1, "max_batch": 1, "prefill_chunk": 1,
                 "context": 1, "prefix_cache_mb": 0}
        for name, low in least.items():  # one error per field, naming it alone
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{name}={value!r} must be a whole number >= {low}")
        if not (isinstance(self.request_timeout_s, (int, float)) and 0 < self.request_timeout_s < float("inf")):
            raise ConfigError(f"request_timeout_s={self.request_timeout_s!r} must be a number of seconds > 0")


class Gate:
    """ASGI middleware: the API key (401) and the body size limit (413), before any parsing."""

    def __init__(self, app: Any, *, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics
        self._key = settings.api_key.encode() if settings.api_key else None

    async def _refuse(self, send: Any, status: int, message: str, code: str, extra: list[Any] = ()) -> None:
        self.metrics.reject(status)
        body = json.dumps(error_body(message, type="authentication_error" if status == 401 else
                                     "invalid_request_error", code=code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *extra]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self._key is not None and scope.get("path") != "/health":
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
                return await self._refuse(send, 401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                          "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        limit = self.settings.max_body_bytes
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, 413, f"the body is over {limit} bytes", "body_too_large")
        seen = 0

        async def counting_receive() -> Any:  # a chunked body has no content-length: count it
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # FastAPI passes an HTTPException from the body read through
                    raise HTTPException(413, f"the body is over {limit} bytes")
            return message

        await self.app(scope, counting_receive, send)


def create_app(model: Any, speculation: Speculation, settings: ServerSettings, *,
               model_thread: ModelThread | None = None) -> FastAPI:
    """The ASGI app serving ``model`` (loaded) with ``speculation``; the worker starts with it,
    after the allowed drafters are built (``Speculation.warm_up``, a no-op if it already ran).
    Pass the :class:`~draftwise.server.worker.ModelThread` that loaded the model, so the jobs run
    on that thread too (a fresh one is made otherwise). ``settings.context`` over the model's
    context is refused (the default, None, is the model's)."""
    limit = model.runtime.max_context
    if settings.context is not None and settings.context > limit:
        raise ConfigError(f"--context {settings.context} is over this model's maximum of {limit} positions; "
                          f"pass --context {limit} or less")
    metrics = ServerMetrics(settings.model_name)
    prefix_cache = PrefixCache.of_megabytes(settings.prefix_cache_mb) \
        if getattr(model.runtime, "reuses_prefixes", False) else None  # declared by the native runtime
    worker = Worker(model, speculation, metrics, max_queue=settings.max_queue, thread=model_thread,
                    max_batch=settings.max_batch, prefill_chunk=settings.prefill_chunk, context=settings.context,
                    prefix_cache=prefix_cache)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(worker.warm_up)  # before the first request is accepted
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="draftwise", version="1", lifespan=lifespan,
                  description="OpenAI-compatible server with lossless speculative decoding.")
    app.state.worker, app.state.metrics, app.state.settings = worker, metrics, settings
    _add_error_handlers(app, metrics)
    _add_info_routes(app, model, worker, metrics, settings)
    _add_completion_routes(app, Intake(model, speculation, settings, worker))
    app.add_middleware(Gate, settings=settings, metrics=metrics)
    return app


class ErrorResponse(JSONResponse):
    """An error body as ASCII JSON: it may quote what a client sent, a lone surrogate included,
    which UTF-8 (Starlette's JSONResponse) cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every refusal in OpenAI's error schema, counted by status."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        metrics.reject(exc.status)
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return ErrorResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        sent = request.headers.get("content-type")
        errors = list(exc.errors())
        if not _is_json(sent or "") and errors and errors[0].get("type") != "missing":
            # FastAPI parses a body as JSON only when it says so: its errors would be about bytes
            metrics.reject(415)
            what = f"this request's is {clip(sent)}" if sent else "this request has none"
            return ErrorResponse(error_body(f"the body must be JSON sent with 'Content-Type: application/json'; "
                                            f"{what}", code="unsupported_media_type"), status_code=415)
        metrics.reject(400)
        return ErrorResponse(validation_error_body(errors), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        metrics.reject(exc.status_code)
        code = _HTTP_CODES.get(exc.status_code, str(exc.status_code))
        return ErrorResponse(error_body(str(exc.detail), code=code), status_code=exc.status_code)


def _is_json(content_type: str) -> bool:
    """Whether FastAPI parses a body of this type as JSON: ``application/json`` or ``application/*+json``.

    >>> _is_json("application/json; charset=utf-8"), _is_json("text/plain")
    (True, False)
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _add_info_routes(app: FastAPI, model: Any, worker: Worker, metrics: ServerMetrics,
                     settings: ServerSettings) -> None:
    """``/health``, ``/metrics`` and ``/v1/models``."""

    @app.get("/health")
    async def health() -> Response:
        if not worker.alive:
            return JSONResponse({"status": "worker stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": settings.model_name, "object": "model", "created": 0, "owned_by": "draftwise",
            "max_model_len": worker.context,  # --context: a prompt and its answer together
        }]}


def _add_completion_routes(app: FastAPI, intake: Intake) -> None:
    """``/v1/chat/completions`` and ``/v1/completions``."""

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await intake.respond(body, intake.prompt_ids_chat(body), "chat", request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await intake.respond(body, intake.prompt_ids_text(body), "text", request)


class Intake:
    """Turns a validated body into a queued job and the job's events into a response: the
    prompt's ids, the token budget, the speculation (all refused here, before queueing)."""

    def __init__(self, model: Any, speculation: Speculation, settings: ServerSettings, worker: Worker) -> None:
        self.model, self.speculation, self.settings, self.worker = model, speculation, settings, worker

    def prompt_ids_chat(self, body: ChatCompletionRequest) -> list[int]:
        tok = self.model.tokenizer
        if not getattr(tok, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
        roles = [m.role for m in body.messages]
        texts = [m.text for m in body.messages]
        if roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2]) \
                and roles[-1] == "user":  # what `draftwise generate` builds: the same ids, token for token
            return encode_conversation(tok, texts[::2], texts[1::2], chat=True)
        ids = tok.apply_chat_template(body.openai_messages(), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def prompt_ids_text(self, body: CompletionRequest) -> list[int]:
        if isinstance(body.prompt, str):
            return encode_conversation(self.model.tokenizer, [body.prompt], chat=False)
        try:
            return check_token_ids(body.prompt, self.model.runtime.vocab_size)
        except ConfigError as exc:
            raise APIError(400, str(exc), param="prompt", code="invalid_value") from None

    def token_budget(self, body: ChatCompletionRequest | CompletionRequest, ids: list[int]) -> int:
        """The most new tokens this request may generate: its limit, else the server's cap, and
        never past the context (HTTP 400 when the prompt or the limit does not fit)."""
        where = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        if not ids:
            raise APIError(400, "the prompt is empty; send some text", param=where)
        context, cap = self.worker.context, self.settings.max_tokens_cap
        name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
        limit = body.token_limit
        if limit is not None and limit > cap:
            raise APIError(400, f"{name}={limit} is over this server's cap of {cap} tokens (--max-tokens-cap)",
                           param=name, code="invalid_value")
        room = context - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt has {len(ids)} tokens, which leaves no room for an answer in the "
                           f"context of {context} tokens; shorten the prompt to at most {context - 1} tokens",
                           param=where, code="context_length_exceeded")
        if limit is not None and limit > room:
            raise APIError(400, f"the prompt has {len(ids)} tokens and {name} is {limit}: more than the context "
                           f"of {context} tokens; shorten the prompt or lower {name} to at most {room}",
                           param=name, code="context_length_exceeded")
        return min(limit or cap, room)

    def job(self, body: ChatCompletionRequest | CompletionRequest, ids: list[int], request_id: str) -> Job:
        settings = self.settings
        if body.model is not None and body.model != settings.model_name:
            raise APIError(404, f"the model '{body.model}' does not exist; this server serves "
                           f"'{settings.model_name}' (see /v1/models)", param="model", code="model_not_found")
        max_tokens = self.token_budget(body, ids)
        try:
            sampling = SamplingConfig(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                      seed=body.seed)
        except ConfigError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        # a seeded sample must not depend on what other requests did (docs/contract.md)
        choice = self.speculation.choose(body.speculative, isolated=sampling.seed is not None and not sampling.greedy)
        return Job(request_id=request_id, prompt_ids=ids, max_tokens=max_tokens, sampling=sampling,
                   stop=body.stop_list, choice=choice, timeout_s=settings.request_timeout_s)

    def submit(self, job: Job) -> JobHandle:
        try:
            return self.worker.submit(job)
        except QueueFull as exc:
            raise APIError(429, str(exc), type="rate_limit_error", code="queue_full") from None

    async def respond(self, body: Any, ids: list[int], kind: str, request: Request) -> Any:
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        handle = self.submit(self.job(body, ids, request_id))
        env = Envelope(request_id, kind, self.settings.model_name)  # type: ignore[arg-type]
        if body.stream:
            return EventSourceResponse(_stream(handle, env, body), ping=15, sep="\n")
        return await _collect(handle, env, body, request)


def _failure(ev: Event) -> APIError:
    """A job's error event as the HTTP error it answers with."""
    status = _ERROR_STATUS.get(ev.code, 500)
    return APIError(status, ev.error, type=_ERROR_TYPE.get(status, "server_error"), code=ev.code)


async def _stream(handle: JobHandle, env: Envelope, body: Any) -> AsyncIterator[str]:
    """The SSE events of one request; leaving early (a client hung up) cancels its generation."""
    try:
        if env.kind == "chat":
            yield json.dumps(env.chunk(None, role=True))
        async for ev in handle:
            if ev.kind == "text":
                yield json.dumps(env.chunk(ev.text), ensure_ascii=False)
            elif ev.kind == "done":
                assert ev.result is not None and ev.stats is not None
                yield json.dumps(env.final_chunk(ev.result, ev.stats, handle.job.choice,
                                                 token_ids=body.return_token_ids), ensure_ascii=False)
                if body.include_usage:
                    yield json.dumps(env.usage_chunk(ev.result))
            elif ev.kind == "error":
                yield json.dumps(_failure(ev).body())
        yield "[DONE]"
    finally:
        handle.cancel()  # no effect once the job is done


async def _last_event(handle: JobHandle) -> Event:
    """The job's ``done`` or ``error`` event (its ``text`` events are skipped)."""
    async for ev in handle:
        if ev.kind in ("done", "error"):
            return ev
    raise AssertionError("a job's events end with done or error")  # pragma: no cover


async def _collect(handle: JobHandle, env: Envelope, body: Any, request: Request) -> Any:
    """Wait for the whole answer, cancelling the generation (as a hung-up stream is) if the client
    hangs up meanwhile: checked every :data:`DISCONNECT_POLL_S` whatever events arrive, since a
    decoding job posts one every pass."""
    last = asyncio.ensure_future(_last_event(handle))
    try:
        while not last.done():
            await asyncio.wait({last}, timeout=DISCONNECT_POLL_S)
            if not last.done() and await request.is_disconnected():
                return Response(status_code=499)  # nobody reads it: the client is gone
        ev = last.result()
        if ev.kind == "error":
            raise _failure(ev)
        assert ev.result is not None and ev.stats is not None
        return JSONResponse(env.full(ev.result, ev.stats, handle.job.choice, token_ids=body.return_token_ids))
    finally:
        last.cancel()
        handle.cancel()  # no effect once the job is done
