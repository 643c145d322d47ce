"""The runtime's one compiled kernel: row-invariant attention (``attention.c``), built at first use.

Torch has no attention whose summation order ignores the rest of the batch, so
:mod:`..attention` builds one from fixed-shape matmuls, about ten operations a layer that at one
sequence cost twice ``F.scaled_dot_product_attention``. ``attention.c`` does the same job in one
call per layer for every sequence of a pass, each row's arithmetic fixed by the code alone (its
header says how). It is compiled once per machine with the system's C compiler
(``cc -O3 -march=native -fopenmp -ffp-contract=off``, about two seconds) into the draftwise cache
folder, under a name that covers the source, the compiler and the CPU, and loaded with
:mod:`ctypes`; its OpenMP threads are torch's own (the same ``libgomp``).

Where it cannot be built (no compiler, a head size it does not cover) or ``DRAFTWISE_KERNELS=off``,
the runtime runs :mod:`..attention` instead. Both are row-invariant; they differ from each other in
the last bits, so one process uses one of them throughout (:func:`available` decides once).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from draftwise.errors import ConfigError
from draftwise.fsutil import cache_root

SOURCE = Path(__file__).with_name("attention.c")
HEAD_DIMS = (16, 32, 64, 128)  # what attention.c covers
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]

_lock = threading.Lock()
_state: dict[str, object] = {}


def _compiler() -> str | None:
    for name in (os.environ.get("CC", "").strip(), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_key() -> str:
    """What -march=native compiles for: the CPU's feature flags (x86 "flags", Arm "Features")."""
    try:
        with open("/proc/cpuinfo") as f:
            found = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        found = ""
    return os.uname().machine + " " + found


def _build(cc: str) -> Path:
    """The compiled library's path, compiling it first if this machine has not yet."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _cpu_key(), *FLAGS]).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"attention-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise ConfigError(f"{cc} could not build {SOURCE.name}: {said}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load() -> ctypes.CDLL | str:
    """The loaded library, or why not (a few words)."""
    if os.environ.get("DRAFTWISE_KERNELS", "").strip().lower() in ("off", "0", "no", "torch"):
        return "DRAFTWISE_KERNELS=off"
    cc = _compiler()
    if cc is None:
        return "no C compiler on PATH"
    try:
        return bind(ctypes.CDLL(str(_build(cc))))
    except (OSError, ConfigError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib`` (a build of ``attention.c``) with ``dw_attend``'s argument and result types set."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.dw_attend.argtypes = [ptr, i64, i64, ptr, ptr, ctypes.c_int, i64, i64, i64, ptr, i64, ctypes.c_int, ptr,
                              ptr, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    lib.dw_attend.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None where this process runs the torch path (:func:`why_not` says why)."""
    with _lock:
        if "lib" not in _state:
            got = _load()
            _state["lib"], _state["why"] = (got, None) if isinstance(got, ctypes.CDLL) else (None, got)
            if _state["why"] is not None and "KERNELS=off" not in str(_state["why"]):
                warnings.warn(f"draftwise: the compiled attention kernel is not available ({_state['why']}); "
                              "using the slower torch path", RuntimeWarning, stacklevel=3)
    lib = _state["lib"]
    return lib if isinstance(lib, ctypes.CDLL) else None


def why_not() -> str | None:
    """Why this process runs the torch path (None: it runs the compiled kernel)."""
    library()
    why = _state.get("why")
    return None if why is None else str(why)


def signature() -> str:
    """Which attention this process runs, for fingerprints of what a pass costs: ``kernel-`` and a
    hash of the kernel's source, or ``torch``."""
    if library() is None:
        return "torch"
    return "kernel-" + hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the KV cache's element types attention.c reads


def available(head_dim: int, cache_dtype: torch.dtype = torch.float32) -> bool:
    """Whether a model with heads of ``head_dim`` and a KV cache of ``cache_dtype`` runs the
    compiled kernel in this process."""
    return head_dim in HEAD_DIMS and cache_dtype in CACHE_DTYPES and library() is not None


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: torch.Tensor, trees: torch.Tensor,
           scale: float, threads: int) -> torch.Tensor:
    """Every sequence's rows of ``q`` (``[R, H, hd]``, float32, last axis contiguous) over its own
    slot of one layer's cache (``[slots, KV, ctx, hd]``, float32 or bfloat16, contiguous):
    ``[R, H * hd]`` float32. ``seq`` is ``[n, 5]`` int64 (per sequence: slot, start, rows, first
    row, offset of its ancestor mask in ``trees`` or -1 for a chain), ``trees`` uint8."""
    lib = library()
    assert lib is not None
    if k_cache.dtype not in CACHE_DTYPES or v_cache.dtype != k_cache.dtype or q.dtype != torch.float32:
        raise ConfigError(f"the attention kernel takes float32 queries and a float32 or bfloat16 cache, "
                          f"not {q.dtype} and {k_cache.dtype}/{v_cache.dtype}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ConfigError("the attention kernel needs the K and V caches in one layout, head_dim contiguous")
    if q.stride(2) != 1:
        q = q.contiguous()
    R, H, hd = q.shape
    KV = k_cache.shape[1]
    out = torch.empty(R, H * hd, dtype=torch.float32)
    sk = k_cache.stride()
    failed = lib.dw_attend(
        q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), sk[0], sk[1], sk[2], out.data_ptr(), out.stride(0),
        seq.shape[0], seq.data_ptr(), trees.data_ptr(), H, KV, hd, scale, threads)
    if failed == 2:
        raise ConfigError(f"the attention kernel does not cover heads of {hd} (it does {HEAD_DIMS})")
    if failed:
        raise MemoryError("the attention kernel could not allocate its scratch memory")
    return out
