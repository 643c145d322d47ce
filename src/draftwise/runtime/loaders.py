"""Loading a model: a built-in name, a Hugging Face folder or a GGUF file -> :class:`Model`.

A GGUF file is converted once (transformers de-quantises it, ~35 s for SmolLM2-135M) into a
Hugging Face folder (config.json, safetensors, tokenizer files) under the user's cache
directory, keyed by the file's content hash; later loads read that folder in a few seconds.

The conversion writes into ``converted/.convert-<pid>-<name>-<random>`` and renames it into
place, so a reader never sees half a folder. A conversion killed outright (SIGKILL, power
loss) leaves that temporary folder behind; the next conversion removes it once its process is
gone, or once it is an hour old (:func:`clean_stale_conversions`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from draftwise.errors import ConfigError, ModelLoadError, UnsupportedArchitectureError
from draftwise.fsutil import cache_root, check_writable, write_json_atomic
from draftwise.runtime.base import Runtime
from draftwise.runtime.chat import encode_conversation
from draftwise.runtime.models import BUILTIN_MODELS
from draftwise.runtime.native import NativeRuntime, check_supported, load_state_dict
from draftwise.runtime.quant import parse_quant

#: the prefix of a conversion's temporary folder, followed by ``<pid>-``
_CONVERT_PREFIX = ".convert-"
#: a temporary folder this old is stale even if a process with its pid runs (the pid was reused)
STALE_AFTER_S = 3600.0


def staging_folder(converted: Path, stem: str) -> Path:
    """A new, empty ``converted/.convert-<pid>-<stem>-<random>`` folder for this process."""
    return Path(tempfile.mkdtemp(prefix=f"{_CONVERT_PREFIX}{os.getpid()}-{stem}-", dir=converted))


def move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished ``tmp`` to ``target``; a complete ``target`` another process made
    meanwhile wins (``tmp`` is then dropped by the caller), an incomplete one is replaced."""
    try:
        tmp.rename(target)
        return
    except OSError:
        if (target / "config.json").exists():
            return
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (assumed so where it cannot be asked without harm)."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate it on Windows: go by age there
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to someone else
        return True
    except OSError:
        return False
    return True


def clean_stale_conversions(folder: Path, *, max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary folders of conversions that died (their process is gone) or that are
    older than ``max_age_s``; return what was removed. A live conversion's folder is kept.

    Folders of the old naming (``.tmp-*``) are removed by age only.
    """
    removed = []
    now = time.time()
    for tmp in folder.glob(".*"):
        if not tmp.is_dir():
            continue
        try:
            age = now - tmp.stat().st_mtime
        except OSError:
            continue  # removed meanwhile
        if tmp.name.startswith(_CONVERT_PREFIX):
            pid_text = tmp.name[len(_CONVERT_PREFIX):].split("-", 1)[0]
            dead = not pid_text.isdigit() or not _process_alive(int(pid_text))
        elif tmp.name.startswith(".tmp-"):
            dead = False
        else:
            continue
        if dead or age > max_age_s:
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


DTypeName = Literal["float32", "bfloat16"]
RuntimeName = Literal["auto", "native", "hf"]
_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_GGUF_MAGIC = b"GGUF"


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name in _DTYPES.values():
            return name
        raise ConfigError(f"dtype {name} is not supported; use float32 or bfloat16")
    if name not in _DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def parse_device(name: str | torch.device) -> torch.device:
    """``name`` as a torch device that exists here (one clear line otherwise)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device {name!r} is not a device name (use cpu, cuda, cuda:1, ...)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} is not available: this torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ConfigError(f"device {name!r} is not supported (use cpu or cuda)")
    return device


def _q4_cache_key(source: Path, folder: Path) -> str:
    files = sorted(folder.glob("*.safetensors")) + ([source] if source.is_file() else [])
    stamp = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return hashlib.sha256(json.dumps(["q4-v1", stamp]).encode()).hexdigest()[:24]


def _load_q4(source: Path, folder: Path, config: Any, status: Callable[[str], None] | None) -> dict[str, Any]:
    """The runtime options of a q4 load: the GGUF's own blocks (or weights quantized at load),
    cached under ``cache_dir()/quant`` like a conversion."""
    from draftwise.runtime.gguf_blocks import load_q4, q4_weights, save_q4

    state = load_state_dict(folder)
    cached = writable_cache_dir("quant") / f"{_q4_cache_key(source, folder)}.q4.safetensors"
    if cached.exists():
        blocks, sources = load_q4(cached)
    else:
        if status:
            status("reading the 4-bit weights (once; cached after)")
        blocks, sources = q4_weights(state, config, source if source.is_file() else None)
        save_q4(blocks, sources, cached)
    return {"state": state, "blocks": blocks, "block_sources": sources}


def cache_dir() -> Path:
    """Where converted weights live: ``$DRAFTWISE_CACHE`` (``~`` expanded), else the platform's
    user cache dir (:func:`.fsutil.cache_root`)."""
    return cache_root()


def writable_cache_dir(sub: str) -> Path:
    """``cache_dir() / sub``, created and proved writable; a one-line ConfigError otherwise.

    Call it before work whose result goes to the cache (a conversion, a profile, a calibration).
    """
    return check_writable(
        cache_dir() / sub, "draftwise cache folder", fix="set DRAFTWISE_CACHE to a writable folder"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _check_gguf(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it does not start with b'GGUF'); "
            "pass a .gguf file or a Hugging Face model folder"
        )


def gguf_to_folder(path: str | Path, *, status: Callable[[str], None] | None = None) -> Path:
    """Convert a GGUF file to a Hugging Face folder once; return the cached folder.

    The folder is written to a temporary sibling and renamed into place, so an interrupted
    conversion never leaves a half-written cache entry behind.
    """
    path = Path(path).expanduser().resolve()
    _check_gguf(path)
    target = cache_dir() / "converted" / f"{path.stem}-{_sha256(path)[:16]}"
    if (target / "config.json").exists():
        return target
    converted = writable_cache_dir("converted")  # before the conversion, not after it
    clean_stale_conversions(converted)
    if status:
        status(f"converting {path.name} to safetensors (once; cached in {converted})")
    tmp = staging_folder(converted, path.stem)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32
            )
        except Exception as exc:  # transformers raises many kinds on a bad file
            raise ModelLoadError(f"could not read GGUF file {path}: {exc}") from exc
        # the weights are de-quantised float32 now; drop the GGUF quantizer so transformers
        # saves them, and reads the folder back as a plain float32 checkpoint
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / "draftwise_source.json", {"gguf": str(path), "size": path.stat().st_size})
        move_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(spec: str | Path) -> tuple[str, Path]:
    """A model spec (built-in name, folder or .gguf path) -> (display name, HF folder or GGUF)."""
    text = str(spec)
    if text in BUILTIN_MODELS:
        builtin = BUILTIN_MODELS[text]
        return builtin.name, builtin.gguf_path()
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"{path} is a folder without config.json; pass a Hugging Face model folder "
                "(config.json + *.safetensors) or a .gguf file"
            )
        return path.name, path
    if path.exists():
        return path.stem, path
    names = ", ".join(sorted(BUILTIN_MODELS))
    raise ModelLoadError(
        f"model not found: {text!r} is neither a built-in model ({names}) nor an existing "
        "file or folder"
    )


@dataclass
class Model:
    """A loaded model: its runtime, its tokenizer and the ids that end a generation."""

    name: str
    folder: Path
    runtime: Runtime
    tokenizer: Any
    eos_token_ids: frozenset[int]
    config: Any = field(repr=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.runtime.dtype

    @property
    def mode(self) -> str:
        """The dtype and weight format, as profiles and benchmarks key them: ``float32``,
        ``bfloat16``, ``float32+q4``, ``float32+int8``."""
        dtype = str(self.runtime.dtype).replace("torch.", "")
        quant = getattr(self.runtime, "quant", "none")
        return dtype if quant == "none" else f"{dtype}+{quant}"

    def encode_prompt(self, prompt: str, *, chat: bool | None = None) -> list[int]:
        """Token ids of ``prompt``; wrapped in the chat template when the model has one
        (``chat=None``) or when asked (``chat=True``)."""
        return encode_conversation(self.tokenizer, [prompt], chat=chat)


def _eos_ids(folder: Path, config: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()

    def add(value: Any) -> None:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)

    add(getattr(config, "eos_token_id", None))
    add(tokenizer.eos_token_id)
    gen = folder / "generation_config.json"
    if gen.exists():
        add(json.loads(gen.read_text()).get("eos_token_id"))
    # chat models end a turn with a special token the config does not always list
    vocab = tokenizer.get_vocab()
    ids.update(vocab[name] for name in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>") if name in vocab)
    return frozenset(ids)


def load_model(
    spec: str | Path = "default",
    *,
    dtype: DTypeName | torch.dtype = "float32",
    runtime: RuntimeName = "auto",
    max_context: int | None = None,
    status: Callable[[str], None] | None = None,
    quant: str = "none",
    device: str | torch.device = "cpu",
    compile: bool = False,
) -> Model:
    """Load ``spec`` (``"default"``, a built-in name, a HF folder or a .gguf file).

    ``runtime="auto"`` uses the native runtime when it supports the architecture and the
    Hugging Face adapter otherwise; ``"native"`` raises for an unsupported architecture.

    Example::

        model = load_model("default", dtype="bfloat16")
        model.runtime.num_layers  # 30
        fast = load_model("default", quant="q4")  # the GGUF's own 4-bit blocks

    ``quant`` (native runtime, CPU): ``"q4"`` runs 4-bit weights in groups of 32 (from a
    Q4_0/Q4_1 GGUF, the file's own blocks; otherwise quantized at load), ``"int8"`` per-channel
    int8; ``"none"`` keeps ``dtype``. ``device`` is where the model runs. ``compile`` runs the
    native runtime's element-wise kernels through ``torch.compile`` where a C++ compiler
    exists; where it cannot, loading says why in one status line and runs uncompiled.
    """
    if runtime not in ("auto", "native", "hf"):
        raise ConfigError(f"runtime {runtime!r} is not one of auto, native, hf")
    # every option is checked before a (slow) conversion starts
    options = _RuntimeOptions.checked(dtype, max_context, quant, device, compile)
    name, source = resolve_model(spec)
    folder = gguf_to_folder(source, status=status) if source.is_file() else source
    if status:
        status(f"loading {name} ({folder})")
    config, tokenizer = _read_folder(folder)
    rt = _make_runtime(runtime, name, source, folder, config, options, status)
    eos = _eos_ids(folder, config, tokenizer)
    return Model(name=name, folder=folder, runtime=rt, tokenizer=tokenizer, eos_token_ids=eos, config=config)


@dataclass(frozen=True)
class _RuntimeOptions:
    """How a runtime runs, checked: what :func:`load_model` hands either runtime."""

    dtype: torch.dtype
    max_context: int | None
    quant: str  # "none", "q4" or "int8"
    device: torch.device
    compile: bool

    @classmethod
    def checked(
        cls, dtype: DTypeName | torch.dtype, max_context: int | None, quant: str, device: str | torch.device,
        compile: bool,
    ) -> _RuntimeOptions:
        """Each bad value a one-line ConfigError, checked in the order of the arguments."""
        torch_dtype = parse_dtype(dtype)
        if max_context is not None and max_context < 2:
            raise ConfigError(f"max_context={max_context} is too small; pass at least 2")
        return cls(torch_dtype, max_context, parse_quant(quant), parse_device(device), compile)


def _read_folder(folder: Path) -> tuple[Any, Any]:
    """The (config, tokenizer) of a Hugging Face folder; a ModelLoadError naming it otherwise."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        return AutoConfig.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:
        raise ModelLoadError(f"could not read model folder {folder}: {exc}") from exc


def _make_runtime(
    runtime: str, name: str, source: Path, folder: Path, config: Any, options: _RuntimeOptions,
    status: Callable[[str], None] | None,
) -> Runtime:
    """The native runtime where asked for or where it supports ``config`` (``runtime="auto"``),
    else the Hugging Face adapter."""
    problem = check_supported(config)
    if runtime == "native" and problem:
        raise UnsupportedArchitectureError(
            f"{problem}; load it with runtime='hf' (CLI: --runtime hf), the Hugging Face adapter"
        )
    if runtime == "native" or (runtime == "auto" and not problem):
        return _native_runtime(source, folder, config, options, status)
    if options.quant != "none" or options.compile:
        what = f"quant={options.quant!r}" if options.quant != "none" else "compile"
        raise ConfigError(
            f"{what} needs the native runtime; {name} runs on the Hugging Face adapter ({problem or 'runtime=hf'})"
        )
    from draftwise.runtime.hf import (
        HFRuntime,  # imports transformers' cache classes: only when used
    )

    return HFRuntime.from_folder(
        folder, dtype=options.dtype, max_context=options.max_context, device=options.device
    )


def _native_runtime(
    source: Path, folder: Path, config: Any, options: _RuntimeOptions, status: Callable[[str], None] | None
) -> NativeRuntime:
    """The native runtime on ``folder``'s weights (q4: the GGUF's own blocks), compiled if asked."""
    q4 = _load_q4(source, folder, config, status) if options.quant == "q4" else {}
    state = q4.pop("state", None)
    rt = NativeRuntime(
        config,
        state if state is not None else load_state_dict(folder),
        dtype=options.dtype,
        max_context=options.max_context,
        quant=options.quant,
        device=options.device,
        **q4,
    )
    if options.compile:
        reason = rt.enable_compile()
        if reason and status:
            status(f"--compile: {reason}; running uncompiled")
    return rt


#: config.json keys that record who wrote the file, not the model: a GGUF converted again under
#: another transformers release must keep its fingerprint (its folder name holds the GGUF's hash)
_VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path", "_model_name_or_path")


def model_fingerprint(model: Any) -> str:
    """Identifies a model's weights and shape: its folder name and config.json (less the keys of
    :data:`_VOLATILE_CONFIG_KEYS`), hashed."""
    folder = Path(model.folder)
    config = b""
    if (folder / "config.json").exists():
        fields = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        for key in _VOLATILE_CONFIG_KEYS:
            fields.pop(key, None)
        config = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(folder.name.encode() + b"\0" + config).hexdigest()[:16]
