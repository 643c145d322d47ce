"""CPU threads: the OpenMP wait policy set before torch starts, and ``--threads``.

torch's CPU kernels run on GNU OpenMP (libgomp, which MKL and oneDNN share here). Between two
parallel regions libgomp's idle workers spin for ``GOMP_SPINCOUNT`` iterations (300,000 by
default, about 3 ms) before they sleep. A decode step is hundreds of small parallel regions, so
one process alone gains from the spinning; but two processes on the same cores each burn the
cores the other needs, and both collapse (measured here: 26 tok/s alone, 3.5 + 3.5 as a pair).
A short spin keeps most of the alone speed and shares the machine; ``docs/runtime.md``
("Threads and contention") has the figures behind the value chosen.

:func:`apply_omp_defaults` runs from ``draftwise/__init__.py`` before anything imports torch,
because libgomp reads its environment once, when torch loads it. It only fills in what the user
left unset, and ``DRAFTWISE_OMP_DEFAULTS=0`` turns it off.

This module imports nothing heavy: torch is imported inside :func:`set_threads` only.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .errors import ConfigError

OPT_OUT = "DRAFTWISE_OMP_DEFAULTS"
"""Set to ``0`` (or ``off``/``false``/``no``) to leave OpenMP's own defaults alone."""

SPIN_COUNT = "3000"
"""libgomp spins before an idle worker sleeps (about 30 us); see docs/runtime.md for the sweep."""

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
    env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return {"GOMP_SPINCOUNT": SPIN_COUNT}


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
    return torch.get_num_threads()
