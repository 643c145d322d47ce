"""One model worker: a thread that owns the model and runs queued jobs one at a time.

The event loop never touches the model. A handler submits a :class:`Job` and gets a
:class:`JobHandle`, an async iterator of :class:`Event` s (``start``, ``text``, then ``done``
or ``error``) that the worker posts into the handle's asyncio queue from its thread.

- The queue is a bounded FIFO: :meth:`Worker.submit` raises :class:`QueueFull` (HTTP 429)
  when ``max_queue`` jobs already wait.
- :meth:`JobHandle.cancel` (a client hung up) and the job's deadline (the per-request timeout)
  are checked after every decode step that produced text; the generation is then closed, so
  the worker moves on to the next job within one step. A job cancelled while queued is skipped.
- Whatever a job raises is its own ``error`` event; the worker thread never dies of a request.

One thread for the model, from loading to serving: :class:`~draftwise.server.model_thread.ModelThread`.

Continuous batching (``max_batch`` > 1): the worker runs up to ``max_batch`` jobs at once on
the batched engine (:mod:`draftwise.core.engine`): between two steps it admits queued jobs into free
slots, each job is the same :meth:`Worker._run` as alone (its own drafter, k, sampling, stop
strings, cancellation and deadline), and one target pass per step serves them all. A job that
ends (done, cancelled, timed out, failed) frees its slot at once. With ``max_batch`` 1 jobs run
one at a time on the model itself. The admission loop is the engine's (:meth:`Engine.run`);
under ``--k auto`` the engine's scheduler chooses the batch's k's together each step
(:meth:`Speculation.follow_batch`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from draftwise.api import stream
from draftwise.core.engine import DEFAULT_PREFILL_CHUNK, Engine, Job
from draftwise.core.generation import GenerationResult
from draftwise.core.sampling import SamplingConfig
from draftwise.core.stats import SpecStats
from draftwise.cost.served import StepSample
from draftwise.errors import DraftwiseError
from draftwise.runtime.prefix_cache import PrefixCache
from draftwise.server import pass_trace
from draftwise.server.metrics import ServerMetrics
from draftwise.server.model_thread import ModelThread
from draftwise.server.speculation import Choice, Speculation

log = logging.getLogger("draftwise.server")
EventKind = Literal["start", "text", "done", "error"]


class QueueFull(Exception):
    """The worker's queue holds ``max_queue`` jobs already."""


@dataclass
class Job:
    """One generation request, validated and tokenized (nothing here can be refused later)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...]
    choice: Choice
    timeout_s: float
    arrived: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.arrived + self.timeout_s


@dataclass
class Event:
    kind: EventKind
    text: str = ""
    result: GenerationResult | None = None
    stats: SpecStats | None = None
    error: str = ""
    code: str = ""  # error events: "timeout", "cancelled" or "internal"


class JobHandle:
    """The handler's side of a job: iterate for events; :meth:`cancel` when the client is gone."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def post(self, event: Event) -> None:
        """Called from the worker thread; a closed loop (server shutting down) drops it."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            pass

    async def next(self) -> Event:
        return await self._events.get()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if event.kind in ("done", "error"):
                return


class Worker:
    """The model's only user. ``start()`` it once; ``submit`` from the event loop."""

    def __init__(self, model: Any, speculation: Speculation, metrics: ServerMetrics, *, max_queue: int,
                 thread: ModelThread | None = None, max_batch: int = 1, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 context: int | None = None, prefix_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.prefix_cache = prefix_cache  # every request's, at every max_batch (None: off)
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.engine: Engine | None = None
        self._context = context
        self._handles: list[JobHandle] = []  # the jobs in the engine's batch
        self.speculation = speculation
        self.metrics = metrics
        self.max_queue = max_queue
        self._queue: queue.Queue[JobHandle | None] = queue.Queue(maxsize=max_queue)
        self._own_thread = thread is None
        self._thread = thread or ModelThread()
        self._running: Future[None] | None = None
        self.running = 0
        self._stepping, self._logged_passes = 0.0, 0  # seconds in engine.step(); passes at the last log
        self._last_pass: tuple[int, int] | None = None  # the last pass's (plain, speculating) sequences
        #: when a list, each batched step that ran a pass is appended as a StepSample
        #: (:mod:`draftwise.server.served_profile` measures the served step with it)
        self.step_samples: list[StepSample] | None = None
        self._last_step_end: float | None = None  # when the last step's after_step ran (its wall clock)
        self._current: JobHandle | None = None
        metrics.track_queue(lambda: self._queue.qsize(), lambda: self.running)
        if prefix_cache is not None:
            metrics.track_prefix_cache(prefix_cache)

    @property
    def context(self) -> int:
        """Positions one request may take: the engine's slot, else ``context`` (at any batch size) or the model's."""
        if self.engine is not None:
            return self.engine.runtime.slot_context
        limit = self.model.runtime.max_context
        return limit if self._context is None else min(self._context, limit)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def alive(self) -> bool:
        return self._running is not None and not self._running.done()

    def warm_up(self) -> None:
        """Build the batched engine (``max_batch`` > 1), the allowed drafters (one set per slot)
        and the profile (for k auto), on the model thread."""
        self._thread.call(self._warm_up)

    def _warm_up(self) -> None:
        if self.max_batch > 1 and self.engine is None:
            limit = self.model.runtime.max_context
            context = limit if self._context is None else min(self._context, limit)
            self.engine = Engine(self.model, max_batch=self.max_batch, prefill_chunk=self.prefill_chunk,
                                 context=context)
        self.speculation.warm_up(self.engine.slot_models if self.engine is not None else ())
        if self.engine is not None:  # k auto: each step's k's from the batch (when profiled)
            pass_trace.attach(self.engine)
            self.speculation.follow_batch(self.engine, on_k=self.metrics.observe_k)

    def start(self) -> None:
        """Run the job loop on the model thread (the thread that loaded the model, see above)."""
        self._running = self._thread.submit(self._loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what waits, let the running job end at its next step, and join the thread."""
        while True:
            try:
                handle = self._queue.get_nowait()
            except queue.Empty:
                break
            if handle is not None:
                handle.cancel()
                handle.post(Event("error", error="the server is shutting down", code="cancelled"))
        for current in [self._current, *self._handles]:
            if current is not None:
                current.cancel()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:  # pragma: no cover - filled again while stopping; the loop ends at its next job
            return
        if self._running is not None:
            try:
                self._running.result(timeout)
            except Exception:  # pragma: no cover - a timeout: the running step ends on its own
                log.warning("the worker did not stop within %g s", timeout)
        if self._own_thread:
            self._thread.shutdown()

    def submit(self, job: Job) -> JobHandle:
        handle = JobHandle(job, asyncio.get_running_loop())
        try:
            self._queue.put_nowait(handle)
        except queue.Full:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting); retry later") from None
        return handle

    # -- the thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        if self.engine is not None:
            return self._loop_batched(self.engine)
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_batch(batch)

    def _loop_batched(self, engine: Engine) -> None:
        """The engine's admission loop (:meth:`Engine.run`) over this worker's queue."""
        stopping = False

        def admit(free: int, idle: bool) -> list[Job] | None:
            nonlocal stopping
            if stopping:
                return None
            jobs: list[Job] = []
            while len(jobs) < free:
                try:  # wait for work only when nothing runs
                    handle = self._queue.get(block=idle and not jobs)
                except queue.Empty:
                    break
                if handle is None:
                    stopping = True
                    break
                self._handles.append(handle)
                jobs.append((self._batched_job(handle), handle.job.prompt_ids))
            return None if stopping and not jobs else jobs

        def after_step(served: int, took: float) -> None:
            self._stepping += took
            if served:  # a pass ran: what the step cost beside it
                self.metrics.observe_pass(engine.stats.batch_sizes[-1], engine.stats.last_rows)
                if self.step_samples is not None:
                    self._sample(engine, took)
                self._observe_outside(engine, took - engine.stats.last_seconds)
            pass_trace.flush(engine, idle=not engine.running)
            if not engine.running:
                self._log_idle(engine)
                self._last_pass = None
                self._last_step_end = None  # idle time is no step's

        engine.run(admit, after_step)

    def _sample(self, engine: Engine, took: float) -> None:
        """Record the step (its pass, from the engine's trace) and its seconds outside the pass,
        admission included: the work of the last pass's sequences, resumed."""
        now = time.perf_counter()
        trace = engine.stats.trace
        if trace is None:  # the pass's shape comes from the engine's trace
            engine.stats.trace = trace = []
        wall = took if self._last_step_end is None else now - self._last_step_end
        self._last_step_end = now
        if trace and self._last_pass is not None:
            sequences, _, prompt_rows, rows, context, seconds = trace[-1]
            assert self.step_samples is not None
            self.step_samples.append(StepSample(sequences, rows, prompt_rows, context, seconds,
                                                max(wall - seconds, 0.0), *self._last_pass))
        if not pass_trace.enabled():
            trace.clear()  # only the last pass is read here

    def _observe_outside(self, engine: Engine, seconds: float) -> None:
        """Tell the goodput policy what this step cost outside its pass: the work of the last
        pass's sequences, resumed (verifying, observing, streaming, drafting the next)."""
        coordinator = self.speculation.coordinator
        if coordinator is not None and self._last_pass is not None:
            coordinator.observe_step(seconds, plain=self._last_pass[0], speculating=self._last_pass[1])
        speculating = engine.stats.last_speculating
        self._last_pass = (engine.stats.batch_sizes[-1] - speculating, speculating)

    def _log_idle(self, engine: Engine) -> None:
        """The batch emptied: the engine's seconds in passes against its seconds stepping (the rest
        is drafting, verifying, streaming), in one line (if it ran a pass since the last)."""
        if engine.stats.passes != self._logged_passes:
            self._logged_passes = engine.stats.passes
            coordinator = self.speculation.coordinator
            outside = coordinator.goodput.outside if coordinator is not None else None
            measured = ("" if outside is None else "; outside the pass a sequence costs %.2f ms plain, %.2f ms "
                        "speculating (fitted over %d steps)" % (*(1e3 * x for x in outside.estimate()), outside.steps))
            if coordinator is not None and coordinator.goodput.factors():
                measured += "; accepted / expected draft tokens at batch: " + ", ".join(
                    f"{d} {f:.2f}" for d, f in coordinator.goodput.factors().items())
            log.info("engine: %d passes, %.3f s in passes of %.3f s stepping%s", engine.stats.passes,
                     engine.stats.seconds, self._stepping, measured)

    def _batched_job(self, handle: JobHandle) -> Callable[[Any], None]:
        def run(slot_model: Any) -> None:
            try:
                self._run_batch([handle], slot_model)
            finally:
                self._handles.remove(handle)

        return run

    def _next_batch(self) -> list[JobHandle] | None:
        handle = self._queue.get()
        return None if handle is None else [handle]

    def _run_batch(self, batch: list[JobHandle], model: Any = None) -> None:
        for handle in batch:
            self.running += 1
            if model is None:
                self._current = handle
            try:
                self._run(handle, model if model is not None else self.model)
            except Exception:  # a bug, not a user error: log it, answer 500, keep serving
                log.exception("request %s failed", handle.job.request_id)
                handle.post(Event("error", error="internal error while generating; see the server log",
                                  code="internal"))
                now = time.monotonic()
                self._end(handle, "error", now, None, None, SpecStats(), None)
            finally:
                self.running -= 1
                if model is None:
                    self._current = None

    def _run(self, handle: JobHandle, model: Any) -> None:
        job, m = handle.job, self.metrics
        started = time.monotonic()
        if handle.cancelled:
            return self._end(handle, "abort", started, started, None, SpecStats(), None)
        if started > job.deadline:
            handle.post(Event("error", error=f"timed out after {job.timeout_s:g} s in the queue", code="timeout"))
            return self._end(handle, "timeout", started, started, None, SpecStats(), None)
        m.observe_start(started - job.arrived)
        handle.post(Event("start"))
        try:
            slot = getattr(model.runtime, "slot", None)  # a batched engine's slot, or None
            drafter, k = self.speculation.build(job.choice, slot)
            s = stream(model, job.prompt_ids, max_new_tokens=job.max_tokens, sampling=job.sampling,
                       stop=job.stop, draft=drafter, k=k, prefix_cache=self.prefix_cache)
        except DraftwiseError as exc:
            handle.post(Event("error", error=str(exc), code="invalid"))
            return self._end(handle, "error", started, started, None, SpecStats(), None)
        self._decode(handle, s, started)

    def _decode(self, handle: JobHandle, s: Any, started: float) -> None:
        """Stream ``s``'s pieces to ``handle``, one per target pass."""
        job, m = handle.job, self.metrics
        first = last = None
        reason = None
        committed = 0
        for piece in s.by_step():  # one chunk per target pass: a pass may commit several tokens
            now = time.monotonic()
            if first is None:
                first = now
                m.observe_first(now - job.arrived)
            else:
                gap, tokens = now - last, max(s.stats.committed - committed, 1)  # type: ignore[operator]
                for _ in range(tokens):  # inter-token latency: the pass's time shared by its tokens
                    m.observe_gap(gap / tokens)
            committed, last = s.stats.committed, now
            handle.post(Event("text", text=piece))
            if handle.cancelled:
                reason = "abort"
            elif now > job.deadline:
                reason = "timeout"
                handle.post(Event("error", error=f"timed out after {job.timeout_s:g} s", code="timeout"))
            if reason:
                s.close()  # stops the decode loop at this step
                return self._end(handle, reason, started, first, None, s.stats, s)
        result = s.result
        assert result is not None
        handle.post(Event("done", result=result, stats=s.stats))
        self._end(handle, "stop" if result.finish_reason != "length" else "length", started,
                  first or time.monotonic(), result, s.stats, s)

    def _end(self, handle: JobHandle, reason: str, started: float, first: float | None,
             result: GenerationResult | None, stats: SpecStats, s: Any) -> None:
        """Metrics and the one log line of a request that reached the worker."""
        job, now = handle.job, time.monotonic()
        new = result.new_tokens if result else max(stats.committed, 0)
        gen_s = result.seconds if result else now - started
        self.metrics.observe_end(reason=reason, draft=str(job.choice.draft), prompt_tokens=len(job.prompt_ids),
                                 new_tokens=new, e2e_s=now - job.arrived, generation_s=gen_s, stats=stats)
        log.info(
            "%s draft=%s by=%s prompt=%d tokens=%d tok/s=%.1f acceptance=%s finish=%s queue=%.2fs e2e=%.2fs",
            job.request_id, job.choice.label, job.choice.chosen_by, len(job.prompt_ids), new,
            new / gen_s if gen_s > 0 else 0.0,
            f"{stats.acceptance_rate:.2f}" if stats.proposed else "-", reason, started - job.arrived,
            now - job.arrived,
        )
