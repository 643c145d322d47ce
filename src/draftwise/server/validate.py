"""``draftwise plan --concurrency --validate``: measure what the concurrency prediction predicts, on
the server's own worker, in this process.

For each N of the grid, one at a time, a server is set up as ``draftwise serve --draft auto
--plan PLAN --max-batch N`` sets it up (:func:`draftwise.server.app.create_app`: the same
:class:`~draftwise.server.speculation.Speculation` with the plan and the ``concurrency.json``
beside it, the same :class:`~draftwise.server.worker.Worker` with its batched engine, queue and
admission), and N closed-loop clients send it chat requests through the handler's own intake
(:class:`~draftwise.server.app.Intake`: the body validated, the prompt tokenized, the budget and
the speculation chosen, the job queued), greedy: after one warm-up request, phase ``none``
(plain batching, ``"speculative": {"draft": "none"}``) then phase ``auto`` (``{"category":
CATEGORY}``: the plan's draft and k for it; with ``k="auto"`` the adaptive k as well). Each
phase's aggregate tokens/s is all its new tokens over its wall time; its per-request tokens/s,
the mean of each request's tokens over its end-to-end seconds as its client saw them.

**In process, without HTTP.** The requests go from an asyncio loop on a second thread straight
into the intake and the worker, where the HTTP handler would put them, and every answer is read
from the worker's events as the handler reads them (the final statistics through the same
:class:`~draftwise.server.responses.Envelope`). What is left out is the socket and the
server-sent events' JSON, work the served process does on its event loop's thread, beside the
model's, and small next to a decode step; what is gained: no port, no second process and no
HTTP client (the package needs none), and the model loaded once. The worker runs on the thread
that loaded the model (:class:`CallingThread`), as ``serve`` runs it on its model thread, so
OpenMP keeps one thread team; and no second draftwise process shares the cores with it.

**The workload** is the plan's own, because its acceptance describes nothing else: a *unit* is
one question with all its turns, each turn one request whose history holds the earlier answers
(as the planner, bench and Spec-Bench run it), each answer up to the plan's ``max_new_tokens``.
The units are dev questions the plan did *not* trace, spread over the categories, none
repeated; every N sends the same ``units`` of them (default: the largest N x
``requests_per_client``), client i the units i, i + N, i + 2N, ... (``units=0``: client i sends
units i R + j, j < R, so each N sends other questions). Every answer is compared with the same
prompt decoded alone (greedy), so ``equal`` checks that batching and speculation change no
token; a later turn's history is the reference answer, which is the server's own whenever that
turn came out equal.

Writes ``measured.json``: ``{"measured": {N: {"plain": tok/s, "auto": tok/s}}, "per_request":
{N: {"plain": tok/s, "auto": tok/s}}, "workload": [[{"question_id", "category", "turn",
"prompt_tokens", "new_tokens"}, ...], ...], "requests_per_client": R, "units_per_phase": U or
null, "max_tokens": M, "equal": [x, y], "errors": e, "config": {...}}`` (what
:func:`draftwise.capacity.plan.score_load` scores), and in ``out_dir`` ``run.json`` (every
prompt with its reference, every request's record) and ``server-b<N>.log`` (the server's log
lines at each N).

Example::

    model = load_model("default")
    raw = measure_concurrency(model, "out/plan.json", [1, 2, 4], out_dir="out/load")
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from draftwise.api import generate
from draftwise.capacity.plan import check_fits, parse_concurrency
from draftwise.capacity.simulate import client_units
from draftwise.core.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SERVE_CONTEXT
from draftwise.errors import ConfigError
from draftwise.fsutil import write_json_atomic
from draftwise.planner.plan_file import Plan, load_plan
from draftwise.planner.replay import answer, answer_text
from draftwise.policy.batch_limit import read_capacity
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    read_questions,
    spread_questions,
)
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from draftwise.server.app import Intake, ServerSettings, create_app
from draftwise.server.model_thread import ModelThread
from draftwise.server.protocol import APIError, ChatCompletionRequest
from draftwise.server.responses import Envelope
from draftwise.server.speculation import AUTO, Speculation
from draftwise.server.worker import Worker

MODES = ("none", "auto")
WARM_UP = "Name three primary colours."
#: ``draftwise serve``'s default ``--k``: what a request the plan routes runs when the plan's k is a number
SERVE_K = 4
#: seconds a client waits for its next event before it checks that the worker still runs
_POLL_S = 1.0


# -- the options, checked before any work -------------------------------------------------------
def phase_units(concurrency: Sequence[int], requests_per_client: int, units: int | None) -> int:
    """The units every N sends: ``units``, by default the largest N x ``requests_per_client``;
    0 keeps the older sharing (N x R at each N). One clear line for a count no client can split.

    >>> phase_units([1, 2, 4], 2, None), phase_units([1, 2], 2, 0)
    (8, 0)
    """
    top = max(concurrency)
    if isinstance(requests_per_client, bool) or not isinstance(requests_per_client, int) or requests_per_client < 1:
        raise ConfigError(f"requests a client ({requests_per_client!r}) must be an integer >= 1")
    if units is None:
        return top * requests_per_client
    if isinstance(units, bool) or not isinstance(units, int) or units < 0 or 0 < units < top:
        raise ConfigError(f"units a phase ({units!r}): every client needs a question, so at least the largest N "
                          f"({top}), or 0 for N x {requests_per_client} at each N")
    return units


def budget(traced: int, asked: int | None) -> int:
    """The tokens a turn may answer with: the plan's ``max_new_tokens`` (``traced``); another is refused.

    >>> budget(128, None), budget(128, 128)
    (128, 128)
    """
    if asked is not None and asked != traced:
        raise ConfigError(f"--max-tokens {asked}: the plan measured acceptance on answers of up to {traced} tokens "
                          f"a turn, and acceptance changes along an answer; leave it out, or make the plan with "
                          f"-n {asked}")
    return traced


def conversations(questions: Sequence[Question], count: int) -> list[list[dict[str, Any]]]:
    """``count`` questions spread over the categories, each a unit of all its turns in order
    (a later turn's earlier answers are filled in by :func:`references`)."""
    return [[{"question_id": q.question_id, "category": q.category, "turn": t + 1, "users": list(q.turns[: t + 1])}
             for t in range(len(q.turns))] for q in spread_questions(questions, count)]


def unseen_units(seen: Iterable[Any], count: int,
                 questions: Sequence[Question] | None = None) -> list[list[dict[str, Any]]]:
    """``count`` units (:func:`conversations`) of ``questions`` (default: the dev questions)
    whose ids are not among ``seen`` (the questions the plan traced)."""
    pool = list(questions) if questions is not None else read_questions(DEFAULT_QUESTIONS)
    ids = {str(q) for q in seen}
    fresh = [q for q in pool if str(q.question_id) not in ids]
    if len(fresh) < count:
        raise ConfigError(f"--validate sends {count} questions the plan did not trace (the largest N x the questions "
                          f"a client sends), but only {len(fresh)} of the {len(pool)} dev questions are not in the "
                          "plan; plan on fewer (--per-category) or lower the largest N")
    return conversations(fresh, count)


def check_options(concurrency: str | Sequence[int], *, seen: Iterable[Any], requests_per_client: int = 4,
                  units: int | None = None,
                  questions: Sequence[Question] | None = None) -> None:
    """Everything :func:`measure_concurrency` would refuse that is known before the plan is made:
    the grid, the units and enough dev questions outside ``seen`` (the ids the plan will trace).
    ``draftwise plan`` runs it before any work."""
    grid = parse_concurrency(concurrency)
    per_phase = phase_units(grid, requests_per_client, units)
    unseen_units(seen, per_phase or max(grid) * requests_per_client, questions)


# -- the references: each prompt decoded alone -----------------------------------------------------
def references(model: Any, prompts: list[dict[str, Any]], max_tokens: int) -> float:
    """Each prompt's greedy answer (``reference``, token ids) and its prompt's length in tokens
    (``prompt_tokens``), decoded alone with :func:`draftwise.api.generate`; a later turn gets the
    earlier turns' answers as the conversation's assistant messages (``answers``), in the text
    :func:`draftwise.core.decode.generate` gives (what bench and the planner put in the history).
    Returns the seconds it took."""
    said: dict[Any, list[str]] = {}
    t0 = time.perf_counter()
    for p in sorted(prompts, key=lambda p: p["turn"]):  # earlier turns before the later turns that need them
        p["answers"] = said.get(p["question_id"], [])[: p["turn"] - 1]
        ids = encode_conversation(model.tokenizer, p["users"], p["answers"], chat=True)
        p["prompt_tokens"] = len(ids)
        p["reference"] = generate(model, ids, max_new_tokens=max_tokens, draft=None).token_ids
        if len(said.setdefault(p["question_id"], [])) == p["turn"] - 1:  # this turn's answer, for the next
            said[p["question_id"]].append(answer_text(model.tokenizer, answer(p["reference"], model.eos_token_ids)))
    return time.perf_counter() - t0


def workload(units: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """What the clients send, unit by unit (after :func:`references`)."""
    return [[{"question_id": p["question_id"], "category": p["category"], "turn": p["turn"],
              "prompt_tokens": p["prompt_tokens"], "new_tokens": len(p["reference"])} for p in unit] for unit in units]


def messages(prompt: dict[str, Any]) -> list[dict[str, str]]:
    """A prompt's conversation as chat messages: its users' turns, the earlier answers between them."""
    out = []
    for i, user in enumerate(prompt["users"]):
        out.append({"role": "user", "content": user})
        if i < len(prompt["answers"]):
            out.append({"role": "assistant", "content": prompt["answers"][i]})
    return out


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank; q in [0, 100]) of ``values``; NaN if empty.

    >>> pct([3.0, 1.0, 2.0], 50), pct([], 50)
    (2.0, nan)
    """
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def summarize(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One phase: requests, errors, tokens, aggregate and per-request tokens/s, latencies."""
    ok = [r for r in records if r["error"] is None and not r["lost"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(records), "ok": len(ok), "errors": sum(r["error"] is not None for r in records),
        "lost": sum(r["lost"] for r in records), "equal": sum(bool(r.get("equal")) for r in ok),
        "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
        # one request's tokens over its latency as its client saw it (queue included), averaged
        "per_request_tps": statistics.mean(r["tokens"] / r["e2e"] for r in ok) if ok else float("nan"),
        "ttft_p50_s": pct([r["ttft"] for r in ok], 50), "ttft_p99_s": pct([r["ttft"] for r in ok], 99),
        "e2e_p50_s": pct([r["e2e"] for r in ok], 50), "e2e_p99_s": pct([r["e2e"] for r in ok], 99),
        "prefill_p50_s": pct([r["prefill_s"] for r in ok], 50),
        "mean_committed_per_pass": statistics.mean(r["mat"] for r in ok) if ok else float("nan"),
        "drafts": {d: sum(r.get("draft") == d for r in ok) for d in sorted({r.get("draft") for r in ok} - {None})},
    }


# -- the server, in this process ------------------------------------------------------------------
class CallingThread(ModelThread):
    """A :class:`~draftwise.server.model_thread.ModelThread` whose jobs run on the thread that made
    it, inside :meth:`run`: the thread that loaded the model keeps it (one OpenMP team). ``call``
    from that thread runs at once; from another it waits for :meth:`run` to take it."""

    def __init__(self) -> None:  # no executor: the jobs run on this thread
        self._owner = threading.get_ident()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        #: what the jobs raised (the worker's loop never should)
        self.errors: list[Exception] = []

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == self._owner:
            return fn(*args, **kwargs)
        return self.submit(functools.partial(fn, *args, **kwargs)).result()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future

    def shutdown(self) -> None:
        """:meth:`run` returns after the jobs submitted before this."""
        self._jobs.put(None)

    def run(self) -> None:
        """Run the submitted jobs, one after the other, until :meth:`shutdown`."""
        while (item := self._jobs.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # kept for the caller, as an executor keeps it
                self.errors.append(exc)
                future.set_exception(exc)


class Served:
    """One server as ``draftwise serve --draft auto --plan PLAN --max-batch N`` starts it, on
    ``model`` (loaded), and its intake; the worker runs on the calling thread inside :meth:`run`."""

    def __init__(self, model: Any, plan: Plan | None, n: int, *, k: str, max_tokens: int,
                 capacity: dict[str, Any] | None, speculation: Speculation | None = None) -> None:
        self.model = model
        self.thread = CallingThread()
        if speculation is None:
            speculation = Speculation(model, draft=AUTO, k=AUTO if k == "auto" else SERVE_K, plan=plan,
                                      capacity=capacity)
        # `serve`'s defaults, as load_test starts it: the prefix cache on, as users run it
        self.settings = ServerSettings(
            model_name=model.name, max_queue=max(128, 2 * n), max_tokens_cap=max_tokens, request_timeout_s=3600.0,
            max_batch=n, prefill_chunk=DEFAULT_PREFILL_CHUNK,
            context=min(DEFAULT_SERVE_CONTEXT, model.runtime.max_context), prefix_cache_mb=DEFAULT_PREFIX_CACHE_MB)
        app = create_app(model, speculation, self.settings, model_thread=self.thread)
        self.worker: Worker = app.state.worker
        self.worker.warm_up()  # on this thread: the engine, the drafters, the profile and batch profile
        self.intake = Intake(model, speculation, self.settings, self.worker)

    def run(self, clients: Callable[[], Any]) -> Any:
        """Serve until ``clients()`` (run on a thread of its own) returns; its result. The worker
        is stopped when the clients end, however they end."""
        result: list[Any] = []
        failed: list[BaseException] = []

        def drive() -> None:
            try:
                result.append(clients())
            except BaseException as exc:  # handed to the serving thread, which raises it
                failed.append(exc)
            finally:
                self.worker.stop(timeout=30.0)
                self.thread.shutdown()

        self.worker.start()
        driver = threading.Thread(target=drive, name="draftwise-validate-clients", daemon=True)
        driver.start()
        self.thread.run()
        driver.join()
        if self.thread.errors:
            raise self.thread.errors[0]
        if failed:
            raise failed[0]
        return result[0]


async def _events(handle: Any, worker: Worker) -> Any:
    """A job's events, as the HTTP handler reads them; ends early if the worker stopped."""
    while True:
        pending = asyncio.ensure_future(handle.next())
        while not (await asyncio.wait({pending}, timeout=_POLL_S))[0]:
            if not worker.alive:
                pending.cancel()
                return
        event = pending.result()
        yield event
        if event.kind in ("done", "error"):
            return


async def one_request(served: Served, prompt: dict[str, Any], mode: str, max_tokens: int, client_id: int,
                      k_auto: bool, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chat request through the server's intake, as load_test's HTTP client sends
    it; its record (time to first token, end-to-end, the server's timings, equality). ``spec``:
    the request's ``speculative`` object (default: by ``mode``, the plan's for its category)."""
    if spec is None:
        spec = {"draft": "none"} if mode == "none" else {"category": prompt["category"]}
        if mode != "none" and k_auto:
            spec["k"] = "auto"
    rec: dict[str, Any] = {"mode": mode, "phase": mode, "client": client_id, "question_id": prompt["question_id"],
                           "turn": prompt["turn"], "category": prompt["category"], "error": None, "lost": False}
    t0 = time.perf_counter()
    final = None
    try:
        body = ChatCompletionRequest.model_validate(
            {"messages": messages(prompt), "max_tokens": max_tokens, "temperature": 0, "stream": True,
             "return_token_ids": True, "speculative": spec})
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        handle = served.intake.submit(served.intake.job(body, served.intake.prompt_ids_chat(body), request_id))
    except APIError as exc:
        rec.update(error=f"HTTP {exc.status}: {exc.message[:200]}", e2e=time.perf_counter() - t0)
        return rec
    env = Envelope(request_id, "chat", served.settings.model_name)
    try:
        async for ev in _events(handle, served.worker):
            if ev.kind == "text" and ev.text and "ttft" not in rec:
                rec["ttft"] = time.perf_counter() - t0
            elif ev.kind == "done":
                final = env.final_chunk(ev.result, ev.stats, handle.job.choice, token_ids=True)
            elif ev.kind == "error":
                rec["error"] = ev.error
    finally:
        handle.cancel()  # no effect once the job is done
    rec["e2e"] = time.perf_counter() - t0
    if final is None and rec["error"] is None:
        rec["lost"] = True
    if final is not None:
        spec_stats = final["speculative"]
        rec.update(tokens=final["usage"]["completion_tokens"],
                   equal=final["choices"][0]["token_ids"] == prompt.get("reference"),
                   prefill_s=final["timings"]["prompt_ms"] / 1000, decode_s=final["timings"]["predicted_ms"] / 1000,
                   draft=spec_stats["draft"], k=spec_stats["k"], mat=spec_stats["mean_committed_per_pass"])
        rec.setdefault("ttft", rec["e2e"])  # an empty answer: its first token is its end
    return rec


async def phase(served: Served, units: list[list[dict[str, Any]]], mode: str, assignment: list[list[int]],
                max_tokens: int, k_auto: bool, spec: dict[str, Any] | None = None
                ) -> tuple[list[dict[str, Any]], float]:
    """Client i sends the units ``assignment[i]`` one after the other, a unit's turns one after
    the other, all clients at once; every record and the phase's wall time (from the first
    request to the last answer). ``spec``: every request's ``speculative`` (:func:`one_request`)."""

    async def run_client(i: int) -> list[dict[str, Any]]:
        out = []
        for u in assignment[i]:  # bounded: its units, one after the other
            for prompt in units[u]:  # bounded: its turns
                out.append(await one_request(served, prompt, mode, max_tokens, i, k_auto, spec))
        return out

    t0 = time.perf_counter()
    results = await asyncio.gather(*(run_client(i) for i in range(len(assignment))))
    return [r for rs in results for r in rs], time.perf_counter() - t0


async def _both_phases(served: Served, units: list[list[dict[str, Any]]], assignment: list[list[int]],
                       max_tokens: int, k_auto: bool) -> list[tuple[str, list[dict[str, Any]], float]]:
    """A warm-up request (not counted, on a prompt outside the units: a measured one would put its
    answer in the suffix draft's cache before the auto phase asks it), then plain, then auto."""
    warm = {"question_id": "warm-up", "category": "overall", "turn": 1, "users": [WARM_UP], "answers": [],
            "reference": []}
    await phase(served, [[warm]], "auto", [[0]], 8, k_auto)
    return [(mode, *await phase(served, units, mode, assignment, max_tokens, k_auto)) for mode in MODES]


def _server_log(out_dir: Path, n: int) -> Callable[[], None]:
    """The server's log lines at N in ``out_dir/server-b<N>.log``; returns the undo."""
    logger = logging.getLogger("draftwise.server")
    handler = logging.FileHandler(out_dir / f"server-b{n}.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s draftwise: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()

    return undo


def measure_at(model: Any, plan: Plan, n: int, units: list[list[dict[str, Any]]], assignment: list[list[int]], *,
               max_tokens: int, k: str = "plan", capacity: dict[str, Any] | None = None, out_dir: Path,
               status: Callable[[str], None] | None = None) -> list[tuple[str, list[dict[str, Any]], float]]:
    """One server at ``n`` (:class:`Served`), the warm-up and both phases: ``(mode, records,
    wall seconds)`` of ``none`` and ``auto``."""
    undo = _server_log(out_dir, n)
    try:
        served = Served(model, plan, n, k=k, max_tokens=max_tokens, capacity=capacity)
        phases = served.run(lambda: asyncio.run(_both_phases(served, units, assignment, max_tokens, k == "auto")))
    finally:
        undo()
    for mode, recs, wall in phases:
        for r in recs:
            r["n"] = n
        if status is not None:
            s = summarize(recs, wall)
            status(f"N={n} {mode}: {s['tokens_per_s']:.1f} tok/s ({s['per_request_tps']:.1f} a request), "
                   f"{s['requests']} requests, {s['equal']}/{s['ok']} equal, {s['errors']} errors, {s['lost']} lost")
    return phases


def measure_concurrency(
    model: Any, plan_path: str | Path, concurrency: str | Sequence[int], *, out_dir: str | Path,
    measured_path: str | Path | None = None, requests_per_client: int = 4, units: int | None = None,
    max_tokens: int | None = None, k: str = "plan", questions: Sequence[Question] | None = None,
    status: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure each N of ``concurrency`` with the plan at ``plan_path`` (module docstring) and
    return what ``measured_path`` (default ``out_dir/measured.json``) gets. ``model``: the loaded
    target the plan was made for, used from this thread; ``units``: see :func:`phase_units`;
    ``max_tokens``: the plan's own or None; ``k``: ``"plan"`` (the server's default k) or
    ``"auto"`` (``serve --k auto``); ``questions``: where the unseen units come from (the dev
    questions by default). Every option is checked before anything is decoded. Call it on the
    thread that loaded ``model``: the servers' worker runs on it (:class:`CallingThread`)."""
    grid = parse_concurrency(concurrency)
    if k not in ("plan", "auto"):
        raise ConfigError(f"k={k!r}: use 'plan' (the plan's k) or 'auto' (the adaptive k, serve --k auto)")
    plan = load_plan(plan_path)
    per_phase = phase_units(grid, requests_per_client, units)
    max_tokens = budget(int(plan.config.get("max_new_tokens", 128)), max_tokens)
    check_fits(model, grid, DEFAULT_SERVE_CONTEXT)
    count = per_phase or max(grid) * requests_per_client
    unit_list = unseen_units([p.get("question_id") for p in plan.prompts], count, questions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [p for unit in unit_list for p in unit]
    if status is not None:
        status(f"references: {len(unit_list)} questions the plan did not see, {len(prompts)} turns, greedy, up to "
               f"{max_tokens} tokens a turn")
    references(model, prompts, max_tokens)
    capacity = read_capacity(plan_path)  # the concurrency.json beside the plan, as serve reads it
    measured: dict[str, dict[str, float]] = {}
    per_request: dict[str, dict[str, float]] = {}
    records: list[dict[str, Any]] = []
    try:
        for n in grid:
            mine = client_units(n, len(unit_list), requests_per_client=requests_per_client, per_phase=per_phase or None)
            phases = measure_at(model, plan, n, unit_list, mine, max_tokens=max_tokens, k=k, capacity=capacity,
                                out_dir=out, status=status)
            measured[str(n)], per_request[str(n)] = {}, {}
            for mode, recs, wall in phases:
                s = summarize(recs, wall)
                key = "plain" if mode == "none" else "auto"
                measured[str(n)][key], per_request[str(n)][key] = s["tokens_per_s"], s["per_request_tps"]
                records += recs
    finally:
        if hasattr(model.runtime, "allocate_slots"):
            model.runtime.allocate_slots(1)  # the engines split the cache in slots: one again for what comes next
    ok = [r for r in records if r["error"] is None and not r["lost"]]
    raw = {
        "measured": measured, "per_request": per_request, "workload": workload(unit_list),
        "requests_per_client": requests_per_client, "units_per_phase": per_phase or None, "max_tokens": max_tokens,
        "equal": [sum(bool(r.get("equal")) for r in ok), len(records)],
        "errors": sum(r["error"] is not None or r["lost"] for r in records),
        "config": {"model": model.name, "mode": getattr(model, "mode", None), "plan": str(plan_path),
                   "concurrency": grid, "requests": requests_per_client, "units": per_phase, "max_tokens": max_tokens,
                   "k": k, "served": "in process: the server's worker and intake, no HTTP", "out": str(out),
                   "date": time.strftime("%Y-%m-%d %H:%M")},
    }
    write_json_atomic(Path(measured_path) if measured_path is not None else out / "measured.json", raw)
    write_json_atomic(out / "run.json", {"prompts": prompts, "records": records})
    return raw
