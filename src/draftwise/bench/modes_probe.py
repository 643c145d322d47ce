"""Measurements the runtime-modes benchmark (:mod:`draftwise.bench.modes`) takes besides timing
whole generations: the per-token split between the matmuls and everything else, the prefill
logit difference between two modes, and llama.cpp as an optional peer on the same GGUF.

The split (:func:`matmul_split`): a 1-token forward is timed as it is and with every matmul
(fused q/k/v, o, fused gate/up, down, head) replaced by a stub that returns a preallocated zero
tensor of the matmul's output shape. The stubbed forward is "the rest" (norms, rope, attention,
reshapes, dispatch); the difference is "the matmuls". The two are timed alternately, so the
noise of a shared machine hits both alike, and the medians are reported.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

#: the runtime attributes holding its matmuls: four per-layer lists and the head
MATMUL_LISTS = ("_qkv", "_o", "_gate_up", "_down")
HEAD = "_head"


class _ZeroStub:
    """Stands in for a matmul: returns the same preallocated zeros of the real output's shape
    (made on the first call, from one real call; the shape depends on the rows of ``x``)."""

    __slots__ = ("real", "zeros")

    def __init__(self, real: Any) -> None:
        self.real = real
        self.zeros: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.zeros is None or self.zeros.shape[0] != x.shape[0]:
            self.zeros = torch.zeros_like(self.real(x))  # [n, out]
        return self.zeros


def can_split(runtime: Any) -> bool:
    """Whether ``runtime`` keeps its matmuls where :func:`matmul_split` can stub them (the native runtime)."""
    return all(isinstance(getattr(runtime, name, None), list) for name in MATMUL_LISTS) and callable(
        getattr(runtime, HEAD, None)
    )


def matmul_split(runtime: Any, context_ids: Sequence[int], *, repeats: int = 15) -> dict[str, float] | None:
    """Milliseconds of a 1-token forward after ``context_ids``: whole, without the matmuls, and
    their difference (medians of ``repeats`` alternating runs). None for a runtime whose matmuls
    cannot be stubbed. The runtime's matmuls are restored afterwards, whatever happens."""
    if not can_split(runtime):
        return None
    real = {name: getattr(runtime, name) for name in (*MATMUL_LISTS, HEAD)}
    stubs: dict[str, Any] = {name: [_ZeroStub(m) for m in real[name]] for name in MATMUL_LISTS}
    stubs[HEAD] = _ZeroStub(real[HEAD])
    runtime.prefill(list(context_ids))
    base, token = runtime.length, int(context_ids[-1])

    def timed(matmuls: dict[str, Any]) -> float:
        for name, value in matmuls.items():
            setattr(runtime, name, value)
        runtime.rollback(base)
        t0 = time.perf_counter()
        runtime.forward([token])
        return time.perf_counter() - t0

    whole: list[float] = []
    rest: list[float] = []
    try:
        for _ in range(2):  # warm up both (and make the stubs' zeros)
            timed(real)
            timed(stubs)
        for r in range(repeats):
            pair = (real, stubs) if r % 2 == 0 else (stubs, real)
            for which in pair:
                (whole if which is real else rest).append(timed(which))
    finally:
        for name, value in real.items():
            setattr(runtime, name, value)
        runtime.rollback(base)
    whole_ms, rest_ms = 1e3 * statistics.median(whole), 1e3 * statistics.median(rest)
    return {"forward_ms": whole_ms, "rest_ms": rest_ms, "matmul_ms": whole_ms - rest_ms, "context": base}


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


# -- llama.cpp -------------------------------------------------------------------------------


def llama_cpp_available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python) imports. It is an optional extra, never built here."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCppPeer:
    """llama-cpp-python on a GGUF file: greedy, exactly ``n`` tokens (EOS not looked at), as
    :func:`draftwise.core.decode.plain_tokens` decodes."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int) -> None:
        from llama_cpp import Llama

        self.path = gguf
        self.threads = threads
        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, verbose=False)

    def version(self) -> str:
        import llama_cpp

        return str(getattr(llama_cpp, "__version__", "unknown"))

    def run(self, ids: list[int], n: int) -> tuple[float, list[int]]:
        self.llm.reset()  # no prefix reuse from an earlier prompt: every run pays its prefill
        t0 = time.perf_counter()
        tokens = self.llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True)
        out = [int(t) for t in itertools.islice(tokens, n)]
        return time.perf_counter() - t0, out
