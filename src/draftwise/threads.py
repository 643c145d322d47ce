"""CPU threads: sharing the cores with other draftwise processes, the OpenMP wait policy, and
``--threads``.

**Sharing the cores.** Every draftwise process that decodes registers itself (a file named by
its pid in a per-user folder under the temporary directory) and, at most twice a second while
it decodes, counts the live ones and uses ``cores // processes`` intra-op threads (at least
one). Alone it keeps every core and libgomp's own fast spinning; with company each process
runs one thread per share, so no OpenMP worker spins on a core another process needs. A
process that chose ``--threads`` (:func:`set_threads`) keeps its choice.

torch's CPU kernels run on GNU OpenMP (libgomp, which MKL and oneDNN share here). Between two
parallel regions libgomp's idle workers spin for ``GOMP_SPINCOUNT`` iterations (300,000 by
default, about 3 ms) before they sleep. A decode step is hundreds of small parallel regions, so
one process alone gains from the spinning; but two processes on the same cores each burn the
cores the other needs, and both collapse to a small fraction of one process's speed alone.
Sharing by thread count avoids that and keeps the default spin's speed alone;
``docs/runtime.md`` ("Threads and contention") has the figures.

:func:`apply_omp_defaults` runs from ``draftwise/cli/__init__.py`` (the command line, an entry point) before anything imports torch,
because libgomp reads its environment once, when torch loads it. With sharing on it sets
nothing; with ``DRAFTWISE_SHARE_CORES=0`` it sets a short spin (``GOMP_SPINCOUNT=3000``) where
the user set no wait policy of their own. ``DRAFTWISE_OMP_DEFAULTS=0`` turns both off.

This module imports nothing heavy: torch is imported inside the functions that need it.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path

from draftwise.errors import ConfigError

OPT_OUT = "DRAFTWISE_OMP_DEFAULTS"
"""Set to ``0`` (or ``off``/``false``/``no``) to leave OpenMP's own defaults alone."""

SPIN_COUNT = "3000"
"""A short libgomp spin (about 30 us) for users who run draftwise beside other OpenMP programs:
``GOMP_SPINCOUNT=3000`` (see docs/runtime.md for the sweep). draftwise does not set it itself:
sharing the cores by thread count (below) keeps the default spin's speed alone."""

#: where live draftwise processes register (one empty file per pid)
PROCS_DIR = Path(tempfile.gettempdir()) / f"draftwise-procs-{os.getuid() if hasattr(os, 'getuid') else 0}"
CHECK_EVERY_S = 0.5
_state: dict[str, float | int | bool | None] = {"registered": False, "pinned": False, "cores": None,
                                                "current": None, "checked": -1e9}

# Any of these means the user chose how OpenMP waits: setting GOMP_SPINCOUNT would override an
# OMP_WAIT_POLICY (libgomp lets GOMP_SPINCOUNT win), so we then set nothing.
_USER_WAIT_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def omp_defaults_enabled(environ: MutableMapping[str, str] | None = None) -> bool:
    """False when ``DRAFTWISE_OMP_DEFAULTS`` is 0/off/false/no, else True."""
    env = os.environ if environ is None else environ
    return env.get(OPT_OUT, "1").strip().lower() not in ("0", "off", "false", "no")


def apply_omp_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set draftwise's OpenMP wait policy in ``environ`` (default ``os.environ``) where the user
    set none, and return what was set (``{}`` when opted out or already chosen).

    It must run before torch is first imported; afterwards libgomp has read its settings and a
    change has no effect (it is still harmless).

    Example::

        env = {}
        apply_omp_defaults(env)  # {'GOMP_SPINCOUNT': '3000'}
        apply_omp_defaults({"OMP_WAIT_POLICY": "ACTIVE"})  # {}: the user's choice stands
    """
    env = os.environ if environ is None else environ
    if not omp_defaults_enabled(env) or any(name in env for name in _USER_WAIT_SETTINGS):
        return {}
    if env.get("DRAFTWISE_SHARE_CORES", "1").strip().lower() in ("0", "off", "false", "no"):
        env["GOMP_SPINCOUNT"] = SPIN_COUNT  # no sharing by thread count: share by a short spin
        return {"GOMP_SPINCOUNT": SPIN_COUNT}
    return {}


def check_threads(n: int | None) -> int | None:
    """``n`` if it is None or a whole number >= 1, else a :class:`~draftwise.errors.ConfigError`."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"--threads must be at least 1 (got {n!r})")
    return n


def set_threads(n: int | None) -> int:
    """Use ``n`` intra-op threads (``None``: leave torch's choice) and return the number in use.

    Raises :class:`~draftwise.errors.ConfigError` for ``n < 1``.
    """
    check_threads(n)
    import torch

    if n is not None:
        torch.set_num_threads(n)
        _state["pinned"] = True  # the user's choice: share_cores leaves it alone
    return torch.get_num_threads()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


ACTIVE_WITHIN_S = 2.0  # a process whose entry was touched this recently is decoding


def live_processes(folder: Path | None = None) -> int:
    """Draftwise processes decoding now (entries touched within :data:`ACTIVE_WITHIN_S`), this
    one included; entries of processes that are gone are removed. A process that loaded a model
    but is not decoding (a load-test client, an idle notebook) does not count."""
    folder = PROCS_DIR if folder is None else folder
    count, now = 0, time.time()
    try:
        entries = list(folder.iterdir())
    except OSError:
        return 1
    for entry in entries:
        if not entry.name.isdigit():
            continue
        if not _alive(int(entry.name)):
            entry.unlink(missing_ok=True)
            continue
        try:
            if now - entry.stat().st_mtime <= ACTIVE_WITHIN_S:
                count += 1
        except OSError:
            continue
    return max(count, 1)


def _register(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mine = folder / str(os.getpid())
        mine.touch()
        atexit.register(lambda: mine.unlink(missing_ok=True))
    except OSError:
        pass  # an unwritable temporary folder: run as if alone
    _state["registered"] = True


def share_cores(*, force: bool = False, folder: Path | None = None) -> int | None:
    """Use ``cores // live draftwise processes`` threads (see the module docstring); checked at
    most every :data:`CHECK_EVERY_S` seconds unless ``force``. Returns the threads in use, or
    None when sharing is off (``--threads`` given, ``DRAFTWISE_OMP_DEFAULTS=0`` or
    ``DRAFTWISE_SHARE_CORES=0``, or a platform without process ids)."""
    if _state["pinned"] or not omp_defaults_enabled() or os.name == "nt":
        return None
    if os.environ.get("DRAFTWISE_SHARE_CORES", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    now = time.monotonic()
    if not force and now - float(_state["checked"]) < CHECK_EVERY_S:  # type: ignore[arg-type]
        return _state["current"]  # type: ignore[return-value]
    _state["checked"] = now
    import torch

    folder = PROCS_DIR if folder is None else folder
    if not _state["registered"]:
        _register(folder)
    try:
        os.utime(folder / str(os.getpid()))  # "decoding now"
    except OSError:
        pass
    if _state["cores"] is None:
        _state["cores"] = torch.get_num_threads()
    want = max(1, int(_state["cores"]) // live_processes(folder))  # type: ignore[arg-type]
    if want != _state["current"]:
        torch.set_num_threads(want)
        _state["current"] = want
    return want
