"""``draftwise serve``: the OpenAI-compatible server (needs the ``serve`` extra)."""

from __future__ import annotations

import gc
import ipaddress
import logging
import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from draftwise.cli.common import (
    CompileOpt,
    DeviceOpt,
    DType,
    DTypeOpt,
    ModelOpt,
    Quant,
    QuantOpt,
    RuntimeChoice,
    RuntimeOpt,
    ThreadsOpt,
    err,
    load_with_status,
    user_errors,
    warn,
)
from draftwise.core.engine import (
    DEFAULT_MAX_BATCH,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_SERVE_CONTEXT,
)
from draftwise.drafters.spec import (
    DEFAULT_MAX_K,
    SPEC_HELP,
    DraftSpec,
    parse_k,
    split_draft_list,
)
from draftwise.errors import ConfigError
from draftwise.planner.plan import load_plan
from draftwise.policy.batch_limit import read_capacity
from draftwise.runtime.prefix_cache import DEFAULT_PREFIX_CACHE_MB

SERVE_EXTRA = "draftwise serve needs FastAPI and uvicorn: pip install 'draftwise[serve]'"
API_KEY_ENV = "DRAFTWISE_API_KEY"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    model: ModelOpt = "default",
    dtype: DTypeOpt = DType.float32,
    runtime: RuntimeOpt = RuntimeChoice.auto,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    quant: QuantOpt = Quant.none,
    compile_: CompileOpt = False,
    draft: Annotated[str, typer.Option("--draft", "-d", help=f"The default draft: {SPEC_HELP} (none: plain), or "
                                       "'auto' (the plan's choice for each request's category).")] = "suffix",
    k: Annotated[str, typer.Option("--k", help="Default tokens proposed per step, or 'auto' (costs measured once).")] = "auto",
    max_k: Annotated[int, typer.Option("--max-k", min=1, help="The largest k a request may ask (more gets 400); "
                                       "k auto and the plan's k stay under it too.")] = DEFAULT_MAX_K,
    plan: Annotated[Path | None, typer.Option("--plan", help="A plan from `draftwise plan --out` for --draft "
                                              "auto (default: one made at start-up on the dev questions).")] = None,
    allow_draft: Annotated[str, typer.Option("--allow-draft", help="More drafts a request may name (comma-"
                                             "separated specs); --draft, the plan's drafts and none always "
                                             "may. Any other draft gets 400.")] = "",
    host: Annotated[str, typer.Option("--host", help="Address to bind; keep 127.0.0.1 unless behind a proxy.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar=API_KEY_ENV,
                                                help="Require 'Authorization: Bearer KEY' (all but /health).")] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", min=1, help="Requests that may wait; more get 429.")] = 128,
    max_batch: Annotated[int | None, typer.Option("--max-batch", min=1, help="Requests decoded together (continuous "
                                                  f"batching, every draft; 1: one at a time). Default: "
                                                  f"{DEFAULT_MAX_BATCH} on the native runtime, 1 on another.")] = None,
    context: Annotated[int | None, typer.Option(
        "--context", min=1, show_default=False, help="Positions per request (prompt + answer), at every --max-batch; "
        f"batched, the KV cache takes --max-batch x --context. Default: {DEFAULT_SERVE_CONTEXT}, or the model's "
        "maximum if smaller; more than the model's maximum is refused.")] = None,
    prefill_chunk: Annotated[int, typer.Option(
        "--prefill-chunk", min=1, help="Prompt tokens a request feeds per step while more requests decode than "
        "prefill (otherwise up to 512).")] = DEFAULT_PREFILL_CHUNK,
    prefix_cache_mb: Annotated[int, typer.Option("--prefix-cache-mb", min=0, help="MiB of K/V kept from earlier "
        "prompts and answers for prompts that start the same way (the same answers, bit for bit); 0: off. Native "
        "runtime only.")] = DEFAULT_PREFIX_CACHE_MB,
    max_tokens_cap: Annotated[int, typer.Option("--max-tokens-cap", min=1, help="Largest max_tokens accepted.")] = 1024,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="Seconds from arrival (queue "
                                                   "included) before a request is ended.")] = 600.0,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1024, help="Largest request body.")] = 1 << 20,
    served_model_name: Annotated[str | None, typer.Option("--served-model-name", help="The name clients send "
                                                          "as 'model' (default: the model's name).")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API, with lossless speculative decoding."""
    with user_errors():  # every option is checked before the model loads
        try:  # the server's packages are an optional extra: import them only when serving
            import uvicorn

            from draftwise.server.app import ServerSettings, create_app
            from draftwise.server.speculation import AUTO, Speculation, startup_plan
            from draftwise.server.worker import ModelThread
        except ImportError as exc:
            raise ConfigError(f"{SERVE_EXTRA} ({exc})") from None
        spec = AUTO if draft.strip() == "auto" else DraftSpec.parse(draft)
        k_value = parse_k(k)
        allowed = _allowed_drafts(allow_draft)
        api_key = _api_key(api_key)
        loaded_plan = load_plan(plan) if plan is not None else None
        if loaded_plan is not None and spec != AUTO:
            warn("--plan is used only with --draft auto; requests may still ask for it with draft 'auto'")
        if isinstance(k_value, int) and k_value > max_k:
            raise ConfigError(f"--k {k_value} is over --max-k {max_k}; lower --k or raise --max-k")
        if not (math.isfinite(request_timeout) and request_timeout > 0):
            raise ConfigError(f"--request-timeout {request_timeout} must be a number of seconds > 0")
        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level {log_level!r} is not one of debug, info, warning, error")
        if not _is_loopback(host) and not api_key:
            warn(f"--host {host} is reachable from other machines and no --api-key is set: anyone who can "
                 "reach it can use the model")
        _setup_logging(log_level.lower())
        # the model is loaded, planned with, warmed up and served on one thread (see ModelThread)
        model_thread = ModelThread()
        loaded = model_thread.call(
            load_with_status, model, dtype.value, runtime.value, threads=threads, device=device, quant=quant.value,
            compile=compile_,
        )
        context = _context(context, loaded)
        if spec == AUTO and loaded_plan is None:
            err.print("making a plan on the dev questions (pass --plan to skip this) ...")
            loaded_plan = model_thread.call(startup_plan, loaded, max_k=max_k)
        if loaded_plan is not None and loaded_plan.model != loaded.name:
            warn(f"the plan was made for {loaded_plan.model!r}, not {loaded.name!r}; its choices may not pay")
        capacity = read_capacity(plan) if plan is not None else None  # plan --concurrency's, beside the plan
        speculation = Speculation(loaded, draft=spec, k=k_value, plan=loaded_plan, allow=allowed, capacity=capacity,
                                  max_k=max_k)
        max_batch, why = _max_batch(max_batch, loaded)
        settings = ServerSettings(
            model_name=served_model_name or loaded.name, api_key=api_key, max_queue=max_queue,
            max_tokens_cap=max_tokens_cap, request_timeout_s=request_timeout, max_body_bytes=max_body_bytes,
            max_batch=max_batch, prefill_chunk=prefill_chunk, context=context, prefix_cache_mb=prefix_cache_mb,
        )
        app = create_app(loaded, speculation, settings, model_thread=model_thread)
        # the engine and every allowed drafter are built now: what cannot run fails here, in one line
        app.state.worker.warm_up()
    _freeze_start_up()
    err.print(f"serving {settings.model_name} on http://{host}:{port}/v1 (draft {spec}, k={k_value}, max k {max_k}, "
              f"context {app.state.worker.context}, max batch {max_batch}{why}{_caches(app.state.worker, max_batch)}; "
              f"requests may name: {', '.join(speculation.allowed)})", highlight=False, markup=False)
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=5)


def _freeze_start_up() -> None:
    """What start-up built (torch, the model, the engine, the drafters: ~330,000 objects the
    collector tracks) lives as long as the server: frozen, no full collection walks it again.
    After loading the default model one took 154 ms, a pause for every request running (0 ms
    frozen; 3.8 ms with a full suffix cache of 64 answers); start-up ran three of 80-150 ms."""
    gc.freeze()


def _caches(worker: Any, max_batch: int) -> str:
    """The start-up line's memory: the batched KV cache (when batched) and the prefix cache's bound."""
    engine, prefixes = worker.engine, worker.prefix_cache
    out = f", KV cache {engine.runtime.cache_bytes(max_batch, engine.runtime.slot_context) / 2**30:.1f} GiB" \
        if engine is not None else ""
    return out + (f", prefix cache {prefixes.max_bytes >> 20} MiB" if prefixes is not None else ", prefix cache off")


def _context(given: int | None, model: Any) -> int:
    """``--context``: as given (refused over the model's maximum), else
    :data:`DEFAULT_SERVE_CONTEXT` or the model's maximum if that is smaller."""
    limit = model.runtime.max_context
    if given is None:
        return min(DEFAULT_SERVE_CONTEXT, limit)
    if given > limit:
        raise ConfigError(f"--context {given} is over this model's maximum of {limit} positions; "
                          f"pass --context {limit} or less")
    return given


def _max_batch(given: int | None, model: Any) -> tuple[int, str]:
    """``--max-batch`` and why it is 1 when it was not given (``""`` otherwise): as given, else
    :data:`DEFAULT_MAX_BATCH` on the native runtime (every draft batches, EAGLE heads and hybrids
    too: each slot records its own features), 1 where the runtime cannot batch."""
    if given is not None:
        return given, ""
    if not hasattr(model.runtime, "forward_batch"):
        name = type(model.runtime).__name__
        return 1, f": this runtime ({name}) decodes one sequence at a time; --runtime native batches"
    return DEFAULT_MAX_BATCH, ""


def _allowed_drafts(text: str) -> list[DraftSpec]:
    """``--allow-draft lookup:max=4,min=2,suffix`` -> the specs (``auto`` is not a draft)."""
    specs = split_draft_list(text)
    if "auto" in (s.strip() for s in specs):
        raise ConfigError("--allow-draft takes draft specs; 'auto' is --draft auto (the plan's drafts are allowed)")
    return [DraftSpec.parse(s) for s in specs]


def _api_key(given: str | None) -> str | None:
    """The key, stripped; an empty one is refused, since it would serve with no authentication.
    (click reads an empty environment variable as unset, so it is looked up here too.)"""
    if given is None and API_KEY_ENV in os.environ:
        given = os.environ[API_KEY_ENV]
    if given is not None and not given.strip():
        raise ConfigError(f"the API key (--api-key or {API_KEY_ENV}) is empty, which would turn authentication "
                          "off; give a key, or unset both to serve without one")
    return None if given is None else given.strip()


def _setup_logging(level: str) -> None:
    """One line per request on stderr from the ``draftwise.server`` logger."""
    logger = logging.getLogger("draftwise.server")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s draftwise: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
