"""The runtime's compiled kernels (``attention.c``, ``layer.c``, ``simd.h``), built at first use.

Torch has no attention whose summation order ignores the rest of the batch, so
:mod:`..attention` builds one from fixed-shape matmuls, about ten operations a layer that at one
sequence cost twice ``F.scaled_dot_product_attention``. ``attention.c`` does the same job in one
call per layer for every sequence of a pass, each row's arithmetic fixed by the code alone (its
header says how). ``layer.c`` does the rest of the work between a layer's matmuls, one call per
gap (rotation and cache writes; residual add and norm; SwiGLU): after a matmul has streamed its
weights through the caches, each small torch operation cost 40-90 us, and a layer ran about 25 of
them (its header has the measurements). Both are compiled once per machine, into one library,
with the system's C compiler (``cc -O3 -march=native -fopenmp -ffp-contract=off``, about two
seconds) into the draftwise cache folder, under a name that covers the sources, the compiler and
the CPU, and loaded with :mod:`ctypes`; their OpenMP threads are torch's own (the same ``libgomp``).

Where it cannot be built or loaded, for a head size it does not cover, or with
``DRAFTWISE_KERNELS=off``, the runtime runs :mod:`..attention` and torch's operations instead. Both are row-invariant;
they differ from each other in the last bits, so one process uses one of them throughout
(:func:`available` decides once). The kernel fails safe: whatever goes wrong on the way to it (no
compiler, a compiler that fails, such as Apple's clang without ``-fopenmp``, Windows, anything
else) the process takes the torch path with one ``RuntimeWarning`` that says why (none for
``DRAFTWISE_KERNELS=off``, which asks for it), never an exception. Windows is not tried: the
build assumes a POSIX ``cc`` and ``dlopen``, and ``libgomp`` is not torch's OpenMP runtime there.

A cached library that does not load (a truncated or corrupt ``.so``: "file too short", "invalid
ELF header", or one without ``dw_attend``) is rebuilt once in place; if that does not load
either, the torch path it is.

A shared library runs as the process that loads it, so the cache's ``kernels`` folder must be the
user's own: draftwise creates it private (``0700``), and loads nothing from it nor writes to it
when another user owns it or it is group- or world-writable (someone else could have put a
library there, or could swap one in between the check and the load), nor where it cannot be made
(a read-only home). A cached library that is not the user's own, or that others may write, is
rebuilt like a corrupt one. Where the folder is refused, the process builds the kernel in a
private temporary folder, loads it and deletes the folder (the loaded library stays mapped), with
the one warning naming the folder and the fix. It builds elsewhere rather than taking the torch
path because the kernel's bits do not depend on where it was built: the process keeps the same
arithmetic and the same cost-profile fingerprint (:func:`signature`) as every other draftwise
process on the machine, and pays only the compile, once per process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from draftwise.errors import ConfigError
from draftwise.fsutil import cache_root

SOURCE = Path(__file__).with_name("attention.c")
#: everything the library is built from: attention, the element-wise work between the matmuls, and
#: the vector helpers both include
SOURCES = (SOURCE, SOURCE.with_name("layer.c"))
HEADERS = (SOURCE.with_name("simd.h"),)
HEAD_DIMS = (16, 32, 64, 128)  # what attention.c covers
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]

_lock = threading.Lock()
#: "lib": the loaded library (None: the torch path), "why": why not (None while the kernel runs)
_state: dict[str, object] = {}


def _compiler() -> str | None:
    for name in (os.environ.get("CC", "").strip(), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_key() -> str:
    """What -march=native compiles for: the machine and the CPU's feature flags (x86 "flags", Arm
    "Features"; none where there is no ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo") as f:
            found = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        found = ""
    return platform.machine() + " " + found


def _user() -> int:
    """The effective user id: whose files the cache's may be."""
    return os.geteuid()


def _untrusted(path: Path) -> str | None:
    """Why ``path`` (a folder, or a library in it) is not safe to load code from: owned by another
    user, or writable by the group or the world; None when it is the user's own."""
    st = os.stat(path)
    if st.st_uid != _user():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is {'world' if st.st_mode & stat.S_IWOTH else 'group'}-writable ({stat.filemode(st.st_mode)})"
    return None


def _target(cc: str) -> Path:
    """Where the cache keeps the library ``cc`` builds for this CPU from this source."""
    cpu = _cpu_key()
    version = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([_source_text(), version, cpu, *FLAGS]).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"attention-{key}.so"


def _source_text() -> str:
    """Every file the library is built from, in one string (what its cache key and signature hash)."""
    return "\0".join(path.read_text() for path in (*SOURCES, *HEADERS))


def _compile(cc: str, target: Path) -> Path:
    """Build ``attention.c`` and ``layer.c`` into ``target`` (through a temporary file beside it and a rename, so
    no reader sees half a library and a rebuild replaces a bad one at once)."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, *map(str, SOURCES), "-o", tmp], check=False, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise ConfigError(f"{cc} could not build {SOURCE.name}: {said}")
        os.chmod(tmp, 0o755)  # the linker's own mode follows the umask, which may leave it group-writable
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _open(path: Path) -> ctypes.CDLL:
    """The library at ``path``, bound; OSError where it does not load (AttributeError: no ``dw_attend``)."""
    return bind(ctypes.CDLL(str(path)))


def _cached(cc: str, target: Path) -> ctypes.CDLL:
    """The library from the (trusted) cache folder: the cached one, rebuilt once where it does not
    load or is not the user's own, or a fresh build."""
    if target.exists():
        if _untrusted(target) is None:
            try:
                return _open(target)
            except (OSError, AttributeError):
                pass  # truncated or corrupt: rebuilt below, once
        _compile(cc, target)
        try:
            return _open(target)
        except (OSError, AttributeError) as exc:
            raise OSError(f"the rebuilt {target.name} does not load either: {exc}") from None
    return _open(_compile(cc, target))


def _private(cc: str) -> ctypes.CDLL:
    """A build in a private temporary folder, loaded and deleted (the mapping stays)."""
    with tempfile.TemporaryDirectory(prefix="draftwise-kernel-") as tmp:
        return _open(_compile(cc, Path(tmp) / "attention.so"))


def _load() -> tuple[ctypes.CDLL | None, str | None, str | None]:
    """The loaded library (or None), why not (or None) and what to warn of (or None)."""
    if os.environ.get("DRAFTWISE_KERNELS", "").strip().lower() in ("off", "0", "no", "torch"):
        return None, "DRAFTWISE_KERNELS=off", None
    if sys.platform == "win32":
        return _fallback("not built on Windows")
    cc = _compiler()
    if cc is None:
        return _fallback("no C compiler on PATH")
    refused = None
    try:
        target = _target(cc)
        folder = target.parent
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            refused = _untrusted(folder)
        except OSError as exc:
            refused = f"cannot use {folder}: {_brief(exc)}"
        if refused is None:
            return _cached(cc, target), None, None
        lib = _private(cc)
    except Exception as exc:  # noqa: BLE001  anything at all: the torch path, never an exception out of here
        return _fallback(f"{refused}; in a private folder: {_brief(exc)}" if refused else _brief(exc))
    return lib, None, (f"draftwise: not loading the attention kernel from the cache ({refused}); built it in a "
                       "private temporary folder for this process instead. To cache it again, make that folder "
                       "the user's own and not writable by others (chmod go-w), or set DRAFTWISE_CACHE")


def _brief(exc: BaseException) -> str:
    said = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {said[0][:200] if said else ''}".rstrip(": ")


def _fallback(why: str) -> tuple[None, str, str]:
    return None, why, (f"draftwise: the compiled attention kernel is not available ({why}); "
                       "using the slower torch path")


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib`` (a build of the sources) with its functions' argument and result types set
    (AttributeError: a function is missing)."""
    i64, ptr, cint, cfloat = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.dw_attend.argtypes = [ptr, i64, i64, ptr, ptr, cint, i64, i64, i64, ptr, i64, cint, cint, ptr,
                              ptr, cint, cint, cint, cfloat, cint]
    lib.dw_attend.restype = cint
    lib.dw_add_norm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, cfloat, cint, cint]
    lib.dw_add_norm.restype = cint
    lib.dw_silu_mul.argtypes = [ptr, ptr, i64, i64, cint, cint]
    lib.dw_silu_mul.restype = None
    lib.dw_rope_store.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, cint, cint,
                                  cint, cint, cint]
    lib.dw_rope_store.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None where this process runs the torch path (:func:`why_not` says
    why). Decided at the first call; a failure warns once, at that call."""
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["why"], warn = _load()
            if warn is not None:
                warnings.warn(warn, RuntimeWarning, stacklevel=3)
    lib = _state["lib"]
    return lib if isinstance(lib, ctypes.CDLL) else None


def why_not() -> str | None:
    """Why this process runs the torch path (None: it runs the compiled kernel)."""
    library()
    why = _state.get("why")
    return None if why is None else str(why)


def signature() -> str:
    """Which kernels this process runs, for fingerprints of what a pass costs: ``kernel-`` and a
    hash of their sources, or ``torch``."""
    if library() is None:
        return "torch"
    return "kernel-" + hashlib.sha256(_source_text().encode()).hexdigest()[:12]


CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the KV cache's element types attention.c reads


def available(head_dim: int, cache_dtype: torch.dtype = torch.float32) -> bool:
    """Whether a model with heads of ``head_dim`` and a KV cache of ``cache_dtype`` runs the
    compiled kernel in this process."""
    return head_dim in HEAD_DIMS and cache_dtype in CACHE_DTYPES and library() is not None


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: torch.Tensor, trees: torch.Tensor,
           scale: float, threads: int, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Every sequence's rows of ``q`` (``[R, H, hd]``, float32, last axis contiguous) over its own
    slot of one layer's cache (``[slots, KV, ctx, hd]``, float32 or bfloat16, contiguous):
    ``[R, H * hd]`` in ``out_dtype`` (float32, or bfloat16: rounded to nearest, as ``.to`` would). ``seq`` is ``[n, 5]`` int64 (per sequence: slot, start, rows, first
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
    if out_dtype not in CACHE_DTYPES:
        raise ConfigError(f"the attention kernel writes float32 or bfloat16, not {out_dtype}")
    out = torch.empty(R, H * hd, dtype=out_dtype)
    sk = k_cache.stride()
    failed = lib.dw_attend(
        q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), sk[0], sk[1], sk[2], out.data_ptr(), out.stride(0),
        int(out_dtype == torch.bfloat16), seq.shape[0], seq.data_ptr(), trees.data_ptr(), H, KV, hd, scale, threads)
    if failed == 2:
        raise ConfigError(f"the attention kernel does not cover heads of {hd} (it does {HEAD_DIMS})")
    if failed:
        raise MemoryError("the attention kernel could not allocate its scratch memory")
    return out


# -- the work between a layer's matmuls (layer.c); the runtime calls these only where available() --

def _lib() -> ctypes.CDLL:
    lib = _state.get("lib")
    assert isinstance(lib, ctypes.CDLL), "the kernel library is not loaded: ask available() first"
    return lib


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` with rows one after the other (a view where it already is)."""
    return t if t.is_contiguous() else t.contiguous()


def add_norm(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor | None, eps: float,
             threads: int) -> torch.Tensor | None:
    """``x += y`` in place (``x`` ``[R, d]`` contiguous, float32 or bfloat16; skipped where ``y`` is
    None), then ``rms_norm(x) * weight`` (``[R, d]``; None where ``weight`` is None)."""
    assert x.is_contiguous() and x.dtype in CACHE_DTYPES
    out = torch.empty_like(x) if weight is not None else None
    failed = _lib().dw_add_norm(
        x.data_ptr(), None if y is None else _flat(y).data_ptr(), None if weight is None else weight.data_ptr(),
        None if out is None else out.data_ptr(), x.shape[0], x.shape[1], eps, int(x.dtype == torch.bfloat16),
        threads)
    if failed:
        raise MemoryError("the layer kernel could not allocate its scratch memory")
    return out


def silu_mul(gate_up: torch.Tensor, threads: int) -> torch.Tensor:
    """``silu(gate) * up`` of a ``[R, 2 f]`` gate/up matmul's output (gate first): ``[R, f]``."""
    gate_up = _flat(gate_up)
    R, f = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(R, f, dtype=gate_up.dtype, device=gate_up.device)
    _lib().dw_silu_mul(gate_up.data_ptr(), out.data_ptr(), R, f, int(gate_up.dtype == torch.bfloat16), threads)
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, positions: torch.Tensor,
               slot_of: torch.Tensor, at: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               heads: int, threads: int) -> torch.Tensor:
    """Rotate a pass's queries and keys (``qkv`` ``[R, (H + 2 KV) hd]``; tables ``[ctx, hd]`` in the
    cache's type), store its keys and values at each row's ``slot_of`` and ``at`` in the caches
    (``[slots, KV, ctx, hd]``, one layout), and return the queries as :func:`attend` takes them:
    ``[R, H, hd]`` float32."""
    qkv = _flat(qkv)
    _, KV, _, hd = k_cache.shape
    if qkv.dtype != k_cache.dtype or cos.dtype != k_cache.dtype or k_cache.stride() != v_cache.stride():
        raise ConfigError("rope_store needs q/k/v, the rotary tables and the caches in one type and layout")
    R = qkv.shape[0]
    q = torch.empty(R, heads, hd, dtype=torch.float32, device=qkv.device)
    sk = k_cache.stride()
    _lib().dw_rope_store(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin_signed.data_ptr(), positions.data_ptr(),
        slot_of.data_ptr(), at.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), sk[0], sk[1],
        sk[2], R, heads, KV, hd, int(qkv.dtype == torch.bfloat16), threads)
    return q
