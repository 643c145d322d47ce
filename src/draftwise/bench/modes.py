"""The runtime's weight formats side by side: float32, bfloat16, q4 and int8, plain and speculative.

Each mode is loaded once (:data:`MODES`: its dtype and ``quant``); then, prompt by prompt, every
mode runs in turn, the order rotating from prompt to prompt so that the noise of a shared machine
hits all alike. Per prompt and mode:

- plain: the first ``N`` tokens of :func:`draftwise.core.decode.plain_tokens` (greedy, EOS not looked
  at), wall time with the prefill, exactly as ``bench-runtime`` times it;
- speculative, per draft: :func:`draftwise.generate` for ``max_new_tokens=N`` on a view of the
  model with no EOS ids, so it too yields exactly ``N`` tokens: every comparison is between runs
  of equal length. (The decode harness of ``draftwise bench`` stops every method at EOS instead,
  which is equal length too, since greedy outputs are equal; here the plain rows must match
  ``bench-runtime``'s, which never stop.) Its output must equal the mode's own plain output;
- fidelity against float32: whether the plain output equals float32's (and where it first
  differs), and ``|logit difference|`` on the prefill logits (outside the timing).

llama.cpp (``llama-cpp-python``, :mod:`.llama_cpp_peer`) joins the rotation as a plain peer on
the same GGUF where it is installed. What a token's time goes to (the matmuls against the rest)
and the memory-bandwidth roofline are diagnostics, not part of this command:
developer scripts outside the package measure them per mode (docs/runtime.md).
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.api import generate
from draftwise.bench.llama_cpp_peer import LlamaCppPeer, llama_cpp_available
from draftwise.bench.methods import AUTO, parse_methods
from draftwise.bench.modes_report import write_report
from draftwise.bench.plain_vs_hf import (
    _first_divergence,
    _stats,
    _time_draftwise,
    _whole,
    machine_info,
)
from draftwise.bench.progress import Progress, quiet_transformers
from draftwise.drafters.factory import make_drafter
from draftwise.drafters.spec import KValue, parse_k
from draftwise.errors import ConfigError
from draftwise.planner.route import policy_for
from draftwise.policy.adaptive import auto_policy
from draftwise.questions import (
    DEFAULT_QUESTIONS,
    Question,
    read_questions,
    spread_questions,
)
from draftwise.runtime.loaders import Model, load_model, resolve_model

#: mode name -> (dtype, quant) for :func:`draftwise.load_model`
MODES: dict[str, tuple[str, str]] = {
    "float32": ("float32", "none"),
    "bfloat16": ("bfloat16", "none"),
    "q4": ("float32", "q4"),
    "int8": ("float32", "int8"),
}
REFERENCE = "float32"
LLAMA_CPP = "llama.cpp"
METHOD = (
    "per prompt, every mode in turn (order rotating by one per prompt): plain = the first N tokens "
    "of decode.plain_tokens (greedy, EOS ignored); speculative = draftwise.generate(max_new_tokens=N) "
    "with EOS ignored, so exactly N tokens too; wall time with the prefill; each mode warmed up once"
)

ProgressFn = Callable[[str, float], None]


class _CallbackProgress:
    """:class:`.progress.Progress`'s interface over a ``(description, fraction done)`` callback."""

    def __init__(self, fn: ProgressFn, total: int) -> None:
        self.fn, self.total, self.done = fn, max(total, 1), 0

    def __enter__(self) -> _CallbackProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, description: str, rate: str = "", advance: int = 0) -> None:
        self.done += advance
        self.fn(f"{description} {rate}".strip(), self.done / self.total)


def parse_modes(modes: str | Sequence[str]) -> tuple[str, ...]:
    """``"float32,q4"`` or ``["float32", "q4"]`` -> ``("float32", "q4")``, validated.

    >>> parse_modes("float32, q4")
    ('float32', 'q4')
    """
    items = modes.split(",") if isinstance(modes, str) else list(modes)
    names = tuple(str(m).strip() for m in items if str(m).strip())
    if not names:
        raise ConfigError(f"modes is empty; pass some of {', '.join(MODES)}")
    bad = [m for m in names if m not in MODES]
    if bad:
        raise ConfigError(f"unknown mode(s) {', '.join(map(repr, bad))}; known modes: {', '.join(MODES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"modes {list(names)} repeats a mode")
    return names


def _validate(num_prompts: int, max_new_tokens: int, modes: str | Sequence[str], drafts: str | Sequence[str],
              k: KValue, threads: int | None) -> tuple[tuple[str, ...], list[tuple[str, str, KValue]]]:
    """Every argument checked before anything is loaded: the mode names and the draft methods."""
    _whole("num_prompts", num_prompts)
    _whole("max_new_tokens", max_new_tokens)
    _whole("threads", threads, allow_none=True)
    names = parse_modes(modes)
    methods = []
    for name, spec, mk in parse_methods(drafts, parse_k(k)):
        if spec == AUTO:
            raise ConfigError("draft 'auto' (the plan's choice) is not a draft here; name drafts such as lookup or self")
        methods.append((name, str(spec), mk))
    return names, methods


@dataclasses.dataclass
class _Mode:
    """One loaded mode: the model, a view of it that never stops at EOS, its drafters."""

    name: str
    model: Model
    fixed: Model
    drafters: list[tuple[str, str, Any, KValue]]  # (method name, spec, drafter, k)
    load_seconds: float

    @property
    def runtime(self) -> Any:
        return self.model.runtime

    def speculative(self, spec: str, drafter: Any, k: KValue, ids: list[int], n: int) -> tuple[float, Any]:
        caps = drafter.capabilities if drafter is not None else None
        policy = policy_for(self.model, spec, k, capabilities=caps)  # a fresh policy per generation
        t0 = time.perf_counter()
        res = generate(self.fixed, ids, draft=drafter, k=policy, max_new_tokens=n)
        return time.perf_counter() - t0, res


def _load(model: str | Path, name: str, methods: list[tuple[str, str, KValue]], bar: Any) -> _Mode:
    dtype, quant = MODES[name]
    bar.update(f"{name}: loading")
    t0 = time.perf_counter()
    with quiet_transformers():
        loaded = load_model(model, dtype=dtype, quant=quant)  # type: ignore[arg-type]
    seconds = time.perf_counter() - t0
    drafters = [(m, spec, make_drafter(spec, loaded), mk) for m, spec, mk in methods]
    for _, spec, _, mk in drafters:
        if mk == "auto":
            bar.update(f"{name}: the machine profile for k=auto ({spec})")
            auto_policy(loaded, spec)  # measured (and cached) now, not inside a timed run
    return _Mode(name, loaded, dataclasses.replace(loaded, eos_token_ids=frozenset()), drafters, seconds)


def logit_difference(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """Max and mean ``|logits - reference|`` (``[vocab]`` each) and whether their argmax agrees.

    >>> d = logit_difference(torch.tensor([1.0, 3.0]), torch.tensor([1.5, 3.0]))
    >>> d["max_abs"], d["mean_abs"], d["same_argmax"]
    (0.5, 0.25, True)
    """
    diff = (logits.float() - reference.float()).abs()
    return {
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "same_argmax": bool(int(logits.argmax()) == int(reference.argmax())),
    }


def plain_margin(runtime: Any, ids: Sequence[int], tokens: Sequence[int], position: int) -> float:
    """The gap between the two largest logits that plain decoding (prefill, then one token per
    forward) sees when it picks ``tokens[position]`` after the prompt ``ids``: how near a tie the
    choice was where a speculative run picked another token. Untimed; reruns ``position`` forwards."""
    logits = runtime.prefill(list(ids))  # [vocab]
    for t in tokens[:position]:
        logits = runtime.forward([int(t)])[0]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def _rotate(items: Sequence[str], i: int) -> list[str]:
    """``items`` started at position ``i`` (mod its length).

    >>> _rotate(["a", "b", "c"], 4)
    ['b', 'c', 'a']
    """
    j = i % len(items)
    return [*items[j:], *items[:j]]


def _run_mode(mode: _Mode, ids: list[int], n: int) -> tuple[dict[str, Any], list[int]]:
    """One prompt on one mode: plain, then each draft. Returns the record and the plain tokens."""
    seconds, plain = _time_draftwise(mode.runtime, ids, n)
    if len(plain) != n:
        raise RuntimeError(f"{mode.name} plain decoding produced {len(plain)} tokens, not {n}")
    rec: dict[str, Any] = {"plain_seconds": seconds, "drafts": {}}
    for method, spec, drafter, k in mode.drafters:
        s, res = mode.speculative(spec, drafter, k, ids, n)
        out = list(res.token_ids)
        if len(out) != n:
            raise RuntimeError(f"{mode.name} {method} produced {len(out)} tokens, not {n}")
        st, at = res.stats, _first_divergence(plain, out)
        rec["drafts"][method] = {
            "seconds": s,
            "speedup_over_plain": seconds / s,
            "equal_to_plain": at is None,
            "first_divergence": at,
            # where it differs: how near a tie plain decoding's own choice was there
            "plain_top2_margin_at_divergence": None if at is None else plain_margin(mode.runtime, ids, plain, at),
            "target_passes": st.target_passes,
            "proposed": st.proposed,
            "accepted": st.accepted,
        }
    return rec, plain


def _time_prompt(modes: dict[str, _Mode], peer: LlamaCppPeer | None, q: Question, ids: list[int], n: int,
                 i: int) -> dict[str, Any]:
    """Every mode (and the peer) on one prompt, in rotated order; fidelity against float32."""
    logits = {name: m.runtime.prefill(ids) for name, m in modes.items()}  # [vocab] each, untimed
    order = _rotate([*modes, *([LLAMA_CPP] if peer else [])], i)
    recs: dict[str, dict[str, Any]] = {}
    plain: dict[str, list[int]] = {}
    for name in order:
        if name == LLAMA_CPP:
            assert peer is not None
            seconds, toks = peer.run(ids, n)
            recs[name], plain[name] = {"plain_seconds": seconds}, toks
        else:
            recs[name], plain[name] = _run_mode(modes[name], ids, n)
    ref = plain.get(REFERENCE)
    for name, rec in recs.items():
        rec["plain_tokens_per_second"] = n / rec["plain_seconds"]
        if ref is not None:
            rec["ratio_to_float32"] = recs[REFERENCE]["plain_seconds"] / rec["plain_seconds"]
            rec["plain_equal_to_float32"] = plain[name] == ref
            rec["first_divergence_from_float32"] = _first_divergence(ref, plain[name])
        if name in logits and REFERENCE in logits:
            rec["prefill_logits_vs_float32"] = logit_difference(logits[name], logits[REFERENCE])
    return {"question_id": q.question_id, "category": q.category, "prompt_tokens": len(ids), "order": order,
            "modes": recs}


def _summary(name: str, records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One mode (or the peer) over all prompts: rates, ratios, equality and fidelity counts."""
    recs = [r["modes"][name] for r in records]
    plain_s = [r["plain_seconds"] for r in recs]
    out: dict[str, Any] = {
        "plain_tokens_per_second": _stats([n / s for s in plain_s]),
        "plain_overall_tokens_per_second": n * len(plain_s) / sum(plain_s),
        "num_prompts": len(recs),
    }
    if all("ratio_to_float32" in r for r in recs):
        out["ratio_to_float32"] = _stats([r["ratio_to_float32"] for r in recs])
        out["plain_equal_to_float32"] = sum(r["plain_equal_to_float32"] for r in recs)
        out["first_divergence_from_float32"] = [r["first_divergence_from_float32"] for r in recs]
    if all("prefill_logits_vs_float32" in r for r in recs):
        diffs = [r["prefill_logits_vs_float32"] for r in recs]
        out["prefill_logits_vs_float32"] = {
            "max_abs": max(d["max_abs"] for d in diffs),
            "mean_abs": statistics.fmean(d["mean_abs"] for d in diffs),
            "same_argmax": sum(d["same_argmax"] for d in diffs),
        }
    drafts: dict[str, Any] = {}
    for method in recs[0].get("drafts", {}):
        rows = [r["drafts"][method] for r in recs]
        seconds = [d["seconds"] for d in rows]
        passes = sum(d["target_passes"] for d in rows)
        drafts[method] = {
            "tokens_per_second": _stats([n / s for s in seconds]),
            "overall_tokens_per_second": n * len(seconds) / sum(seconds),
            "speedup_over_plain": _stats([d["speedup_over_plain"] for d in rows]),
            "greedy_equal": sum(d["equal_to_plain"] for d in rows),
            "first_divergence": [d["first_divergence"] for d in rows],
            "plain_top2_margin_at_divergence": [d["plain_top2_margin_at_divergence"] for d in rows],
            "tokens_per_target_pass": n * len(rows) / passes if passes else None,
            "accepted_of_proposed": sum(d["accepted"] for d in rows) / max(1, sum(d["proposed"] for d in rows)),
        }
        if "ratio_to_float32" in out:
            ref = [r["modes"][REFERENCE]["plain_seconds"] for r in records]
            drafts[method]["ratio_to_float32_plain"] = _stats([f / s for f, s in zip(ref, seconds)])
    if drafts:
        out["drafts"] = drafts
    return out


def _loaded(mode: _Mode) -> dict[str, Any]:
    """Where the mode's weights came from (per matmul tensor) and how long it took to load."""
    sources = getattr(mode.runtime, "weight_sources", {})
    return {"weight_sources": dict(Counter(sources.values())), "load_seconds": mode.load_seconds}


def _peer(model: str | Path, longest: int, n: int, bar: Any) -> tuple[LlamaCppPeer | None, Any]:
    """llama.cpp on the model's GGUF, or None and why not (recorded as the report's ``llama_cpp``)."""
    if not llama_cpp_available():
        return None, "not installed"
    _, source = resolve_model(model)
    if not (source.is_file() and source.suffix.lower() == ".gguf"):
        return None, "no GGUF file for this model"
    bar.update("llama.cpp: loading")
    try:
        return LlamaCppPeer(source, longest + n + 8, torch.get_num_threads()), None
    except Exception as exc:  # an optional peer: its failure must not cost the run
        return None, f"could not load: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def run_modes_benchmark(
    *,
    model: str | Path = "default",
    questions: str | Path = DEFAULT_QUESTIONS,
    num_prompts: int = 10,
    max_new_tokens: int = 64,
    modes: str | Sequence[str] = ("float32", "bfloat16", "q4", "int8"),
    drafts: str | Sequence[str] = ("lookup",),
    k: KValue = "auto",
    out_dir: str | Path | None = None,
    progress: bool | ProgressFn = True,
    threads: int | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Plain and speculative decoding in each weight format of the native runtime.

    ``modes`` are names of :data:`MODES`; ``drafts`` are draft specs (``lookup``, ``self``,
    ``model:PATH``, ``SPEC@k=K``) run on top of every mode with ``k`` (a number or ``"auto"``).
    ``num_prompts`` first turns are taken round-robin over the categories of ``questions``.
    ``progress`` is True (a bar on stderr), False, or a ``(description, fraction)`` callback.
    Returns a JSON-ready dict; with ``out_dir``, also writes ``runtime_modes.json``, ``.md`` and
    ``.png`` there (:func:`.modes_report.write_report`).
    """
    names, methods = _validate(num_prompts, max_new_tokens, modes, drafts, k, threads)
    prompts = spread_questions(read_questions(questions), num_prompts)
    command = command if command is not None else " ".join(shlex.quote(a) for a in sys.argv)
    n, started, old_threads = max_new_tokens, time.time(), torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    total = len(prompts) + len(names)
    bar_cm: Any = _CallbackProgress(progress, total) if callable(progress) else Progress(bool(progress), total)
    try:
        with bar_cm as bar:
            loaded = {name: _load(model, name, methods, bar) for name in names}
            first = next(iter(loaded.values()))
            encoded = [first.model.encode_prompt(q.prompt) for q in prompts]
            longest = max(len(ids) for ids in encoded)
            if longest + n > first.runtime.max_context:
                raise ConfigError(
                    f"the longest prompt has {longest} tokens: {longest} + max_new_tokens {n} > the context of "
                    f"{first.runtime.max_context}; lower --max-new-tokens or --num-prompts"
                )
            peer, peer_status = _peer(model, longest, n, bar)
            bar.update("warming up")
            _time_prompt(loaded, peer, prompts[0], encoded[0], min(n, 8), 0)
            records = []
            for i, (q, ids) in enumerate(zip(prompts, encoded)):
                bar.update(f"prompt {i + 1}/{len(prompts)}")
                records.append(_time_prompt(loaded, peer, q, ids, n, i))
                rates = " | ".join(f"{m} {n / r['plain_seconds']:.1f}" for m, r in records[-1]["modes"].items())
                bar.update(f"prompt {i + 1}/{len(prompts)}", rate=f"plain tok/s: {rates}", advance=1)
            results = {}
            for name, mode in loaded.items():
                bar.update(f"{name}: summary", advance=1)
                results[name] = _summary(name, records, n) | _loaded(mode)
            if peer is not None:
                peer_status = {"gguf": peer.path.name, "version": peer.version(), "threads": peer.threads,
                               **_summary(LLAMA_CPP, records, n)}
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    report: dict[str, Any] = {
        "benchmark": "runtime modes: float32, bfloat16, q4 and int8, plain and speculative",
        "command": command,
        "config": {
            "model": str(model),
            "questions": str(Path(questions).expanduser()),
            "num_prompts": len(prompts),
            "max_new_tokens": n,
            "modes": {name: {"dtype": MODES[name][0], "quant": MODES[name][1]} for name in names},
            "drafts": [{"name": m, "spec": spec, "k": mk} for m, spec, mk in methods],
            "threads": threads_used,
            "prompts": [{"question_id": q.question_id, "category": q.category, "text": q.prompt[:80]} for q in prompts],
            "method": METHOD,
        },
        "machine": machine_info(),
        "results": results,
        "llama_cpp": peer_status,
        "prompts": records,
        "wall_seconds": time.time() - started,
    }
    if out_dir is not None:
        write_report(report, Path(out_dir))
    return report
