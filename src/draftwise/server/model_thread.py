"""One thread for the model, from loading to serving (:class:`ModelThread`): GNU OpenMP spins a
waiting worker for about 3 ms only while the process's OpenMP threads fit on the cores; a
second thread that runs parallel regions brings its own team, and then every team sleeps and
wakes through futex calls between regions (plain decoding on a thread other than the one that
loaded the model: 21 tok/s instead of 30). So the model thread loads, plans, warms up and serves.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ModelThread:
    """The one thread that touches the model: load, plan, warm up and serve all run on it.

    Example::

        mt = ModelThread()
        model = mt.call(load_model, "default")  # runs on the model thread, returns its result
        worker = Worker(model, speculation, metrics, max_queue=8, thread=mt)
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftwise-model")

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the model thread and return (or raise) what it did."""
        return self._executor.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        return self._executor.submit(fn)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)
