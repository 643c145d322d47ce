"""The shared part of ``chunk_price.py`` and ``interaction.py``: 16 slots of the default model
filled to ragged contexts around 300, and one timed ``forward_batch`` of 16 sequences' rows,
where the last slot may instead take a new request's 224-token prompt chunk; every pass is
rolled back (the chunk's slot refilled) so each sees the same cache."""
import statistics
import time
from collections.abc import Callable

from draftwise import load_model
from draftwise.cost.batch_measure import _fill, _tokens, spread_contexts
from draftwise.runtime.base import Rows

B, C, CHUNK, ROUNDS = 16, 300, 224, 8


class Passes:
    def __init__(self) -> None:
        self.model = load_model("default")
        self.rt = self.model.runtime
        self.lengths = spread_contexts(C, B, 0.5)
        self.rt.allocate_slots(B, max(self.lengths) + CHUNK + 8)
        _fill(self.rt, self.lengths, 256)
        self.vocab = self.rt.vocab_size

    def timed(self, rows_each: int, chunk: str | None = None, tree: list[int] | None = None) -> float:
        """One pass: ``rows_each`` rows for every sequence (a chain, or the ``tree`` of those
        parents), or with ``chunk`` ("last" or "every": which rows' logits) the last sequence's
        rows replaced by a prompt chunk."""
        rt, V = self.rt, self.vocab
        decoding = B - 1 if chunk else B
        passes = [Rows(s, _tokens(rows_each, 100 + s, V), tree) for s in range(decoding)]
        if chunk:
            rt.rollback_slot(B - 1, 0)  # the last slot becomes a new request's prompt
            passes.append(Rows(B - 1, _tokens(CHUNK, 7, V), last_only=chunk == "last", logits=True))
        t0 = time.perf_counter()
        rt.forward_batch(passes)
        dt = time.perf_counter() - t0
        for s, n in enumerate(self.lengths):
            if chunk and s == B - 1:
                ids = _tokens(n, s + 1, V)
                rt.rollback_slot(s, 0)
                for lo in range(0, n, 256):
                    rt.forward_batch([Rows(s, ids[lo:lo + 256], last_only=True, logits=lo + 256 >= n)])
            else:
                rt.rollback_slot(s, n)
        return dt

    def medians(self, kinds: dict[str, Callable[[], float]]) -> dict[str, float]:
        """Each kind's median seconds over ROUNDS interleaved rounds, after one warm-up round."""
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(ROUNDS + 1):
            for k, run in kinds.items():
                t = run()
                if r:
                    times[k].append(t)
        return {k: statistics.median(v) for k, v in times.items()}
