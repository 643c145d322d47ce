"""llama.cpp as an optional plain-decoding peer of ``draftwise bench-modes``: llama-cpp-python
on the model's own GGUF, in the same rotation as the native runtime's weight formats.

``llama-cpp-python`` is an optional extra, never built here: where it does not import, the
benchmark records why and runs without the peer.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path


def llama_cpp_available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python) imports."""
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
