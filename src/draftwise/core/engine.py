"""The batched engine: many generations at once, one target pass per step over all of them.

Each running generation is the ordinary decode loop (:mod:`draftwise.core.decode`: its drafter, its
k or policy, its sampling generator, stop strings and budget), run in a greenlet on a *slot* of
the native runtime's KV cache. Its runtime is a :class:`SlotRuntime`: ``length``, ``keep`` and
``rollback`` act on the slot at once, while ``forward`` and ``prefill`` hand their rows to the
engine and wait. When every running generation waits, :meth:`Engine.step` runs one
:meth:`~draftwise.runtime.native.NativeRuntime.forward_batch` over all their rows (a plain step's
one row, a chain's k + 1, a tree's nodes, a chunk of a prompt) and hands each its logits.

Why greenlets and not threads: every pass and every drafter runs on the one thread that owns the
model, so OpenMP keeps one thread team (see :mod:`draftwise.server.worker`), and no lock guards
the runtime. Why the plain loop and not a second, batched one: one code path, so a generation's
tokens are those it gets alone, as long as the pass is row-invariant (it is:
:mod:`draftwise.runtime.attention`, ``tests/test_row_invariance.py``).

Continuous batching: :meth:`Engine.run` is the one admission loop (``generate_all`` and the
server's worker both use it): between steps it puts new generations in free slots; while
more generations decode than prefill, a prompt enters ``prefill_chunk`` tokens a step or, where
more, the decoders' rows of the last pass, otherwise :data:`BURST_CHUNK` (:func:`step_chunk`).

The scheduler: a generation whose k policy defers to the batch (``--k auto`` at batch,
:class:`draftwise.policy.batch.BatchSlotPolicy`) waits in :meth:`Engine.wait_for_schedule`
when it needs its k. Once every generation waits (on a pass, or on the schedule), the engine
asks its :class:`Scheduler` once for the k of every sequence that waits on it, with the rows the
others bring to the pass (:class:`PassRows`), then resumes them: they draft and join the pass.

Prefix caching (:mod:`draftwise.runtime.prefix_cache`): a generation starts in the free slot
that holds most of its prompt (a slot keeps its last generation's K/V: :meth:`Engine.start`),
keeps that, copies the longest cached prefix beyond it (:meth:`SlotRuntime.reuse_prefix`, no pass),
feeds only the rest in chunks, and leaves its prompt's blocks in the cache once its first token is
out (the copy is not part of the time to first token) and its answer's when it ends
(:func:`draftwise.core.decode.decode_steps`), so a request admitted later reuses what a running or
finished one computed. A copy is bit for bit the prefill it replaces (the passes are row-invariant),
so a result does not depend on the cache.

Batched drafting: a drafter on a slot may hand a piece of its work to :meth:`SlotRuntime.gather`
(an EAGLE head's step, :mod:`draftwise.eagle.drafter`). Like a pass, the engine runs it once
every generation waits, in one call for all that asked with the same key (their head and the
target's parts), so sixteen sequences' head steps read the head's weights once, not sixteen
times. ``batch_drafts = False`` runs each on its own (as alone; tests compare the two).

Timing: each slot has its own clock (:meth:`SlotRuntime.clock`): wall time less the time it
was parked while other generations ran, plus its share of each pass it was in (its rows over
the pass's rows). A generation's draft and verify seconds are its own, batched or not.

Example::

    engine = Engine(model, max_batch=8)
    results = engine.generate_all([ids_a, ids_b, ids_c], max_new_tokens=64)
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from draftwise.core.decode import Stream
from draftwise.core.draft import Drafter
from draftwise.core.generation import GenerationResult
from draftwise.core.kpolicy import KPolicy
from draftwise.core.sampling import SamplingConfig
from draftwise.errors import ConfigError, DraftwiseError
from draftwise.runtime.base import Rows
from draftwise.runtime.loaders import Model
from draftwise.runtime.prefix_cache import PrefixCache

DEFAULT_PREFILL_CHUNK = 16  # prompt tokens a generation feeds per step (docs/serving.md: how chosen)
#: prompt tokens a generation feeds per step while no more generations decode than prefill
BURST_CHUNK = 512
DEFAULT_MAX_BATCH = 16  # `serve --max-batch`: how chosen, with the measured T(n): docs/serving.md
DEFAULT_SERVE_CONTEXT = 4096  # `serve --context`: positions per request; 16 x 4096 float32 = 2.8 GiB of cache


@dataclass(frozen=True)
class PassRows:
    """The rows of the coming pass that the scheduler does not choose: decoding sequences that
    chose alone (a plain step's row, a fixed k's k + 1) and prompt chunks, and how many
    sequences bring them."""

    decode_rows: int = 0
    prompt_rows: int = 0
    sequences: int = 0


class Scheduler(Protocol):
    """The batch policy the engine asks once before each pass (module docstring)."""

    def schedule(self, members: list[Any], others: PassRows) -> None:
        """Choose for every ``member`` (what each waiting sequence passed to
        :meth:`Engine.wait_for_schedule`, in slot order) before any of them drafts."""
        ...


#: what an admission gives :meth:`Engine.run`: the function to run on a slot's model, alone or with
#: the prompt ids it will prefill (the engine then picks the free slot that holds most of them)
Job = Callable[[Model], Any] | tuple[Callable[[Model], Any], Sequence[int]]


def _greenlet() -> Any:
    try:
        import greenlet
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ConfigError("the batched engine needs the greenlet package: pip install greenlet") from exc
    return greenlet


def step_chunk(chunk: int, prefilling: int, decoding: int, decode_rows: int = 0) -> int:
    """Prompt tokens each prefilling generation feeds the coming step.

    The small ``chunk`` is there for the generations that decode: a step that carries prompt
    rows is a longer gap between their tokens. While they outnumber the generations still in
    their prompts, the prompts enter ``chunk`` tokens each a step, or together as many rows as
    the decoders had in the last pass (``decode_rows``) where that is more: speculating decoders
    bring k + 1 rows each, and a prompt that crawls in beside them leaves its slot idle longer
    (the gap grows by the share of the pass it does in a plain batch). Otherwise (a burst of
    arrivals, a lone request) up to ``max(chunk, BURST_CHUNK)``: the decoders' one long gap buys
    every waiting prompt its start. The engine counts as a step starts: a generation whose
    prompt's last chunk ran in the previous pass still counts as prefilling, so the short
    prompts of a burst, which end together, do not at once turn the longer ones back to small
    chunks. The chunking changes no bit of any result (the pass is row-invariant), only time.

    >>> step_chunk(16, prefilling=1, decoding=8), step_chunk(16, 15, 1), step_chunk(16, 2, 15, decode_rows=90)
    (16, 512, 45)
    """
    burst = max(chunk, BURST_CHUNK)
    return burst if decoding <= prefilling else min(burst, max(chunk, decode_rows // max(prefilling, 1)))


def memory_available() -> int | None:
    """Bytes of memory this machine has available now (None where it cannot tell)."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


def check_batch(model: Model, max_batch: Any, context: int | None = None) -> int:
    """``max_batch`` checked against the runtime and this machine's memory (one clear line)."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ConfigError(f"max_batch={max_batch!r} must be an integer >= 1")
    rt = model.runtime
    if not hasattr(rt, "forward_batch"):
        raise ConfigError(f"the {type(rt).__name__} runtime runs one sequence at a time; use max_batch 1 "
                          "(batching needs the native runtime: Llama-family models)")
    if max_batch > 1:
        ctx = rt.max_context if context is None else context
        need, have = rt.cache_bytes(max_batch, ctx), memory_available()
        if have is not None and need > have * 0.8:
            per = rt.cache_bytes(1, ctx)
            raise ConfigError(
                f"max_batch={max_batch} needs {need / 2**30:.1f} GiB of KV cache ({per / 2**20:.0f} MiB per "
                f"sequence of {ctx} tokens) and {have / 2**30:.1f} GiB is available; use max_batch "
                f"{max(1, int(have * 0.8 // per))} or less, or a shorter context"
            )
    return max_batch


class SlotRuntime:
    """The runtime protocol on one slot of a batched native runtime (see the module docstring)."""

    def __init__(self, engine: Engine, slot: int) -> None:
        self._engine, self._rt, self.slot = engine, engine.runtime, slot

    # what does not change per slot
    vocab_size = property(lambda self: self._rt.vocab_size)
    num_layers = property(lambda self: self._rt.num_layers)
    dtype = property(lambda self: self._rt.dtype)
    supports_trees = property(lambda self: True)
    runs_layer_subsets = True  # forward(layers=...) runs a self-speculation draft pass on the slot
    device = property(lambda self: self._rt.device)
    quant = property(lambda self: self._rt.quant)

    @property
    def max_context(self) -> int:
        return self._rt.slot_context

    @property
    def length(self) -> int:
        return self._rt.slot_length(self.slot)

    def rollback(self, length: int) -> None:
        self._rt.rollback_slot(self.slot, length)

    def keep(self, base: int, rows: Sequence[int]) -> None:
        self._rt.keep_slot(self.slot, base, rows)

    def clock(self) -> float:
        """This slot's generation's clock (seconds): wall time less the time it was parked while
        others ran, plus its share of the passes it was in (the module docstring)."""
        return time.perf_counter() - self._engine.parked[self.slot]

    @property
    def reuses_prefixes(self) -> bool:
        return bool(self._rt.reuses_prefixes)

    def reuse_prefix(self, ids: Sequence[int], cache: PrefixCache) -> int:
        """Copy the longest cached prefix of ``ids`` into the slot (no pass: nothing waits)."""
        return int(self._rt.reuse_prefix(ids, cache, self.slot))

    def save_prefix(self, cache: PrefixCache) -> int:
        return int(self._rt.save_prefix(cache, self.slot))

    def prefill(self, ids: Sequence[int], *, start: int = 0) -> torch.Tensor:
        """The prompt in chunks, one per step; ``start`` as :meth:`NativeRuntime.prefill` takes it."""
        ids = list(ids)
        if not ids:
            raise ConfigError("prefill needs at least one token")
        self._rt.resume_prompt(self.slot, ids, start)
        self._engine._current().prefilling = True
        out, lo = None, start
        while lo < len(ids):  # the chunk is the engine's for this step (step_chunk)
            chunk = self._engine.chunk
            last = lo + chunk >= len(ids)
            out = self._engine._wait(Rows(self.slot, ids[lo : lo + chunk], last_only=last, logits=last))
            lo += chunk
        self._engine._current().prefilling = False
        assert out is not None
        return out[0]

    def forward(
        self, ids: Sequence[int], *, layers: Sequence[int] | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        if layers is not None:  # a self-speculation draft pass: its own, unbatched pass
            return self._engine._wait_layers(self.slot, list(ids), tuple(layers))
        tree = None if parents is None else [int(p) for p in parents]
        return self._engine._wait(Rows(self.slot, list(ids), tree))

    # features for an EAGLE head: this slot's own buffer, recorded by the batched passes
    def capture_features(self, layers: Sequence[int] | None = None, *, enabled: bool = True) -> None:
        self._rt.capture_slot_features(self.slot, layers, enabled=enabled)

    def wait_step(self) -> None:
        """Wait for the next step (:meth:`Engine.wait_step`)."""
        self._engine.wait_step()

    def gather(self, key: Any, item: Any, run: Callable[[list[Any]], list[Any]]) -> Any:
        """``run([item, ...])[i]`` for this slot's ``item``, run once for every generation that
        asks with the same ``key`` before the next pass (see the module docstring)."""
        return self._engine.gather(key, item, run)

    def features(self, start: int, end: int) -> torch.Tensor:
        return self._rt.slot_features(self.slot, start, end)

    @property
    def feature_width(self) -> int:
        return int(self._rt.slot_feature_width(self.slot))

    @property
    def feature_start(self) -> int:
        return int(self._rt.slot_feature_start(self.slot))

    @property
    def shared_runtime(self) -> Any:
        """The batched runtime under every slot: what a draft head borrows the target's weights
        from (its embedding, final norm and LM head), one copy for all slots."""
        return self._rt

    config = property(lambda self: self._rt.config)


@dataclass
class Sequence_:
    """One generation in the engine: its slot, its greenlet, what it waits on, and what ended it
    if it raised (``error``; :meth:`Engine.start` returns this object)."""

    slot: int
    glet: Any = None
    waiting: Rows | None = None  # the rows it waits on (None: runnable, or done)
    layers: tuple[int, ...] | None = None  # a layers= pass (self-speculation) it waits on
    member: Any = None  # what it waits to be scheduled as (its k policy), or None
    side: tuple[Any, Any, Callable[[list[Any]], list[Any]]] | None = None  # a gathered call (key, item, run)
    sleeping: bool = False  # waits for the next step (:meth:`Engine.wait_step`)
    answer: Any = None  # the logits of its last pass, handed back when it resumes
    share: float = 0.0  # its share of the seconds of the pass it waited on
    error: BaseException | None = None
    prefilling: bool = True  # until it resumes after its prompt's last chunk (new: not started yet)

    @property
    def runnable(self) -> bool:
        return self.waiting is None and self.member is None and self.side is None and not self.sleeping


@dataclass
class PassStats:
    """What the engine's passes did (for /metrics and benchmarks)."""

    passes: int = 0
    rows: int = 0
    last_rows: int = 0
    last_seconds: float = 0.0
    last_speculating: int = 0  # the last pass's sequences verifying a proposal (rows > 1, every row's logits)
    seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)  # sequences per pass, the last 4096
    #: when a list: each pass's sequences, those feeding a prompt, their rows, the other rows,
    #: the positions already in its sequences' caches (summed), and its seconds
    trace: list[tuple[int, int, int, int, int, float]] | None = None

    def record(self, sequences: int, rows: int, seconds: float) -> None:
        self.passes += 1
        self.rows += rows
        self.last_rows = rows
        self.last_seconds = seconds
        self.seconds += seconds
        self.batch_sizes.append(sequences)
        if len(self.batch_sizes) > 4096:
            del self.batch_sizes[:2048]


class Engine:
    """Up to ``max_batch`` generations decoding together on one native runtime (module docstring).

    ``start(fn)`` runs ``fn(slot_model)`` in a free slot, where ``slot_model`` is the model with
    a :class:`SlotRuntime`: anything that decodes with it (:func:`draftwise.core.decode.stream`, a
    server job) joins the batch. ``step()`` advances every generation to its next pass and runs
    that pass; ``run(admit)`` admits and steps until no more work comes. ``scheduler``: the batch
    policy asked before each pass (None: no generation may wait on one). Everything runs on the
    calling thread."""

    def __init__(self, model: Model, *, max_batch: int, context: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        self.max_batch = check_batch(model, max_batch, context)
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk={prefill_chunk!r} must be an integer >= 1")
        self.model = model
        self.runtime: Any = model.runtime
        self.runtime.allocate_slots(self.max_batch, context)
        self.prefill_chunk = prefill_chunk
        self.chunk = prefill_chunk  # this step's prompt tokens per prefilling generation (step_chunk)
        self.scheduler: Scheduler | None = None
        self.batch_drafts = True  # gathered draft work runs in one call per key (False: one each)
        self.gathered: list[int] = []  # the sizes of the gathered calls, the last 4096
        self.stats = PassStats()
        #: per slot, the seconds its generation was parked, less its share of the passes it was in
        self.parked = [0.0] * self.max_batch
        self._decode_rows = 0  # the last pass's rows that were not prompt chunks
        self._free = deque(range(self.max_batch))
        self._live: list[Sequence_] = []
        self._slot_models = [dataclasses.replace(model, runtime=SlotRuntime(self, s)) for s in range(self.max_batch)]
        self._main: Any = None

    @property
    def slot_models(self) -> list[Model]:
        """The model as each slot's generation sees it (its runtime is that slot's)."""
        return list(self._slot_models)

    @property
    def running(self) -> int:
        """Generations in the batch now."""
        return len(self._live)

    @property
    def free(self) -> int:
        return len(self._free)

    def start(self, fn: Callable[[Model], Any], prompt: Sequence[int] | None = None) -> Sequence_:
        """Run ``fn(slot_model)`` in a free slot from the next step on; ConfigError when full.
        ``prompt``: the ids ``fn`` will prefill, to start it in the free slot that holds most of
        them already (its prefix cache copies the rest: :meth:`SlotRuntime.reuse_prefix`); else,
        and on a tie, the slot free the longest."""
        if not self._free:
            raise ConfigError(f"all {self.max_batch} slots are busy; wait for a step to free one")
        slot = self._free[0]
        if prompt is not None and len(self._free) > 1 and getattr(self.runtime, "reuses_prefixes", False):
            prompt = list(prompt)
            held = [self.runtime.held_prefix(s, prompt) for s in self._free]
            slot = self._free[held.index(max(held))]
        self._free.remove(slot)
        seq = Sequence_(slot)
        seq.glet = _greenlet().greenlet(lambda: fn(self._slot_models[slot]))
        self.parked[slot] = 0.0
        self._live.append(seq)
        return seq

    def run(self, admit: Callable[[int, bool], Sequence[Job] | None],
            after_step: Callable[[int, float], None] | None = None) -> None:
        """The admission loop: between steps, ``admit(free, idle)`` gives the jobs to start (at most
        ``free``; ``idle``: nothing runs, so it may block until work comes), each a function of
        the slot's model or ``(fn, prompt ids)`` (:meth:`start`), or None once no more will come;
        then one step while any generation runs, and ``after_step(served, seconds)`` (what
        :meth:`step` returned, 0 when no pass ran, and the step's wall seconds)."""
        closing = False
        while not (closing and not self._live):
            if not closing and self._free:
                jobs = admit(len(self._free), not self._live)
                if jobs is None:
                    closing = True
                else:
                    for job in jobs:  # fn, or (fn, the prompt it will prefill)
                        fn, prompt = job if isinstance(job, tuple) else (job, None)
                        self.start(fn, prompt)
            if self._live:
                t0 = time.perf_counter()
                served = self.step()
                if after_step is not None:
                    after_step(served, time.perf_counter() - t0)

    def step(self) -> int:
        """Advance every generation to its next pass (scheduling those that wait on the batch
        policy), run the pass, and return how many generations it served (0: nothing runs)."""
        self._main = _greenlet().getcurrent()
        for seq in self._live:  # those that waited for a step resume in this one
            seq.sleeping = False
        prefilling = sum(s.prefilling for s in self._live)
        self.chunk = step_chunk(self.prefill_chunk, prefilling, len(self._live) - prefilling, self._decode_rows)
        self._advance([s for s in self._live if s.runnable])
        members = [s for s in self._live if s.member is not None]
        if members:
            self._schedule(members)
            self._advance(members)
        batch = [s for s in self._live if s.waiting is not None]
        if not batch:
            return 0
        return self._pass(batch)

    def _schedule(self, members: list[Sequence_]) -> None:
        """Ask the scheduler for every waiting sequence at once; if it fails, each of them fails
        with its error (as a pass that cannot run fails only its sequences), and the engine goes on."""
        try:
            if self.scheduler is None:
                raise ConfigError("a generation waits on the batch's schedule and the engine has no scheduler")
            self.scheduler.schedule([s.member for s in members], self._others())
        except Exception as exc:
            for seq in members:
                seq.answer = exc
        for seq in members:
            seq.member = None

    def _advance(self, seqs: list[Sequence_]) -> None:
        """Resume ``seqs`` until each waits on the pass or the schedule, or ends; self-speculation
        draft passes (a subset of layers) run on their own meanwhile, and gathered draft work
        once everything that runs waits (:meth:`gather`)."""
        for seq in seqs:
            self._resume(seq)
        while True:
            solo = [s for s in self._live if s.layers is not None]
            for seq in solo:
                assert seq.waiting is not None
                t0 = time.perf_counter()
                seq.answer = self.runtime.forward_batch([seq.waiting], layers=seq.layers)[0]
                seq.share = time.perf_counter() - t0
                seq.waiting, seq.layers = None, None
                self._resume(seq)
            if solo:
                continue
            side = [s for s in self._live if s.side is not None]
            if not side:
                return
            groups: dict[Any, list[Sequence_]] = {}
            for seq in side:
                groups.setdefault(seq.side[0], []).append(seq)  # type: ignore[index]
            for group in groups.values():
                self._gathered(group)
            for seq in side:
                self._resume(seq)

    def _gathered(self, group: list[Sequence_]) -> None:
        """Run one key's gathered calls: one ``run`` over all items (or each alone when
        ``batch_drafts`` is off); each sequence gets its answer (or the error) and its share."""
        run = group[0].side[2]  # type: ignore[index]
        batches = [group] if self.batch_drafts else [[seq] for seq in group]
        for batch in batches:
            t0 = time.perf_counter()
            try:
                answers: list[Any] = list(run([seq.side[1] for seq in batch]))  # type: ignore[index]
                if len(answers) != len(batch):
                    raise ConfigError(f"a gathered call gave {len(answers)} answers for {len(batch)} items")
            except Exception as exc:  # the draft failed: each of its sequences fails with it
                answers = [exc] * len(batch)
            seconds = time.perf_counter() - t0
            self.gathered.append(len(batch))
            if len(self.gathered) > 4096:
                del self.gathered[:2048]
            for seq, answer in zip(batch, answers):
                seq.answer, seq.share, seq.side = answer, seconds / len(batch), None

    def _others(self) -> PassRows:
        """The rows already waiting for the coming pass (:class:`PassRows`)."""
        rows = [s.waiting for s in self._live if s.waiting is not None and s.layers is None]
        prompt = sum(len(r.ids) for r in rows if _is_prompt(r))
        return PassRows(sum(len(r.ids) for r in rows) - prompt, prompt, len(rows))

    def _pass(self, batch: list[Sequence_]) -> int:
        """One target pass over ``batch``'s rows; each gets its logits and its share of the time."""
        context = sum(self.runtime.slot_length(s.waiting.slot) for s in batch) if self.stats.trace is not None else 0
        t0 = time.perf_counter()
        try:
            answers = self.runtime.forward_batch([s.waiting for s in batch])
        except DraftwiseError:  # one sequence's rows cannot run (its context is full...)
            answers = self._one_by_one(batch)
        seconds, rows = time.perf_counter() - t0, sum(len(s.waiting.ids) for s in batch)
        self.stats.record(len(batch), rows, seconds)  # a prompt's rows: only its last row's logits, or none
        self.stats.last_speculating = sum(len(s.waiting.ids) > 1 and not _is_prompt(s.waiting) for s in batch)
        prompts = [len(s.waiting.ids) for s in batch if _is_prompt(s.waiting)]
        self._decode_rows = rows - sum(prompts)
        if self.stats.trace is not None:
            self.stats.trace.append((len(batch), len(prompts), sum(prompts), rows - sum(prompts), context, seconds))
        for seq, answer in zip(batch, answers):
            seq.share = seconds * len(seq.waiting.ids) / rows
            seq.answer, seq.waiting = answer, None
        return len(batch)

    def _one_by_one(self, batch: list[Sequence_]) -> list[Any]:
        """A batch that failed: run each sequence's rows alone, so only the bad one fails."""
        answers: list[Any] = []
        for seq in batch:
            try:
                answers.append(self.runtime.forward_batch([seq.waiting])[0])
            except DraftwiseError as exc:
                answers.append(exc)
        return answers

    def _resume(self, seq: Sequence_) -> None:
        """Run ``seq`` until it waits on a pass or the schedule, or ends; an ended one frees its slot."""
        answer, seq.answer = seq.answer, None
        try:
            seq.glet.switch(answer) if seq.glet else seq.glet.switch()  # a greenlet not started is falsy: start it
        except BaseException as exc:  # its own failure ends only it
            seq.error = exc
        if seq.glet.dead:
            self._live.remove(seq)
            self._free.append(seq.slot)
            if seq.error is not None:  # what a failed pass left is not known to be sound: forget it
                self.runtime.rollback_slot(seq.slot, 0)
            # else the slot keeps its positions until the next generation in it starts: one whose
            # prompt starts the same way keeps them (start, NativeRuntime.reuse_prefix)
            # the next generation in the slot turns capture on again if its draft reads features
            self.runtime.capture_slot_features(seq.slot, enabled=False)

    def _park(self, seq: Sequence_) -> Any:
        """Switch to the engine until ``seq`` is resumed; count the time parked, less its share."""
        t0 = time.perf_counter()
        answer = self._main.switch()
        self.parked[seq.slot] += time.perf_counter() - t0 - seq.share
        seq.share = 0.0
        return answer

    def _wait(self, rows: Rows) -> torch.Tensor:
        """Called from a generation's greenlet: wait for ``rows``' logits from the next pass."""
        seq = self._current()
        seq.waiting = rows
        answer = self._park(seq)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _wait_layers(self, slot: int, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
        seq = self._current()
        seq.waiting, seq.layers = Rows(slot, ids), layers
        return self._park(seq)

    def gather(self, key: Any, item: Any, run: Callable[[list[Any]], list[Any]]) -> Any:
        """Called from a generation's greenlet: wait for ``run``'s answer to ``item``, run with
        every other item gathered under ``key`` (:meth:`SlotRuntime.gather`)."""
        seq = self._current()
        seq.side = (key, item, run)
        answer = self._park(seq)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def wait_step(self) -> None:
        """Called from a generation's greenlet: let the others run this step's pass, and resume
        in the next step (a prompt waiting for another's prefill of its start: the prefix cache)."""
        seq = self._current()
        seq.sleeping = True
        answer = self._park(seq)
        if isinstance(answer, BaseException):
            raise answer

    def wait_for_schedule(self, member: Any) -> None:
        """Called from a generation's greenlet (its k policy): wait until the scheduler has
        chosen for ``member`` together with every other sequence that waits this step."""
        seq = self._current()
        seq.member = member
        answer = self._park(seq)
        if isinstance(answer, BaseException):
            raise answer

    def _current(self) -> Sequence_:
        me = _greenlet().getcurrent()
        for seq in self._live:
            if seq.glet is me:
                return seq
        raise ConfigError("a slot's runtime was used outside the engine's step()")

    def run_until_done(self) -> None:
        """Step until nothing runs."""
        while self._live:
            self.step()

    def generate_all(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int] = 128,
        sampling: SamplingConfig | Sequence[SamplingConfig] | None = None,
        stop: Sequence[str] = (),
        drafters: Sequence[Drafter | None] | None = None,
        k: int | Callable[[], KPolicy] = 4,
        progress: Callable[[int], None] | None = None,
        on_result: Callable[[int, GenerationResult], None] | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> list[GenerationResult]:
        """Generate a completion of every prompt (token ids), ``max_batch`` at a time, each as
        :func:`draftwise.core.decode.generate` would alone; results in prompt order. ``max_new_tokens``
        and ``sampling``: one for all or one each; ``drafters`` (one per slot, or None) are reused
        slot by slot; ``k`` a number or a policy factory. ``progress(done)`` after every step;
        ``on_result(i, result)`` as soon as prompt ``i``'s generation ends (to save it early);
        ``prefix_cache``: prompts reuse the K/V of the prefixes it holds and leave theirs in it."""
        n = len(prompts)
        configs = list(sampling) if isinstance(sampling, Sequence) else [sampling or SamplingConfig()] * n
        budgets = list(max_new_tokens) if isinstance(max_new_tokens, Sequence) else [max_new_tokens] * n
        if len(budgets) != n or len(configs) != n:
            raise ConfigError(f"{len(budgets)} max_new_tokens and {len(configs)} sampling configs for {n} prompts: "
                              "pass one for all, or one for each")
        results: list[Any] = [None] * n
        todo = deque(range(n))

        def job(i: int) -> Callable[[Model], None]:
            def run(model: Model) -> None:
                drafter = drafters[model.runtime.slot] if drafters is not None else None
                s = Stream(model, list(prompts[i]), max_new_tokens=budgets[i], sampling=configs[i], stop=tuple(stop),
                           drafter=drafter, k=k if isinstance(k, int) else k(), prefix_cache=prefix_cache)
                try:
                    for _ in s.by_step():
                        pass
                    results[i] = s.result
                except BaseException as exc:  # reported by generate_all
                    results[i] = exc
                    return
                if on_result is not None:
                    on_result(i, s.result)

            return run

        def admit(free: int, idle: bool) -> list[Job] | None:
            if not todo:
                return None
            starts = [todo.popleft() for _ in range(min(free, len(todo)))]
            return [(job(i), prompts[i]) for i in starts]

        after = None if progress is None else (lambda served, seconds: progress(sum(r is not None for r in results)))
        self.run(admit, after)
        for seq_error in (r for r in results if isinstance(r, BaseException)):
            raise seq_error
        return [r for r in results if r is not None]


def _is_prompt(rows: Rows) -> bool:
    """A prompt's chunk: no logits, or its last row's only."""
    return rows.last_only or not rows.logits
