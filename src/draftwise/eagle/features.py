"""An EAGLE head's training features on disk: sharded as they are extracted, read back memory-mapped.

One pass of the target's own runtime per sequence, with feature capture on, gives per position

- ``feats`` ``[L, d]`` float16: the last decoder layer's output before the final norm;
- ``aux`` ``[L, 3d]`` float16 (EAGLE-3 only): the head's three other layers side by side;
- ``lse`` ``[L]`` float32: the log-sum-exp of the full-vocabulary logits, and ``top`` ``[L]``
  int32: their argmax.

The logits themselves are not stored (49,152 a token in float32): the trainer recomputes them over
the draft vocabulary from the stored last-layer feature with the target's norm and head, and
``p(v) = exp(logit_v - lse)`` is exact there (a top-k store would be smaller but drop the tail
of p that the KL needs). That is :func:`bytes_per_token` = ``2 d (1 + aux layers) + 8`` bytes.

The store is ``DATA/features/``: ``chunk-NNNNN.safetensors`` of :data:`CHUNK_SEQUENCES`
sequences each, written atomically as extraction runs, and ``index.json``, rewritten once a chunk
is whole, which lists each sequence (by :func:`sequence_key`, a hash of the target, its mode, the
layers recorded and the ids), the store's fingerprint (the target, its mode and weights) and the
layer sets it holds. So

- an interrupted extraction, or one stopped by a full disk, resumes at the first sequence not
  listed; ``max_disk`` is checked before any pass, and free disk space too;
- a store of another target is refused, never mixed; an EAGLE-1 and an EAGLE-3 run may share a
  data folder (its answers cost the most to make): each reads only the sequences keyed by its own
  layer set, whose chunks hold exactly those layers;
- :class:`FeatureStore` maps the chunks (``safetensors`` opens them memory-mapped) and copies
  only the rows a training batch reads, so memory stays bounded by the page cache, not the data.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.files import target_fingerprint
from draftwise.errors import ConfigError
from draftwise.fsutil import atomic_path, write_json_atomic

FEATURES_DIR = "features"
INDEX_FILE = "index.json"
FEATURES_FORMAT = "draftwise-head-features-1"
#: sequences per chunk file
CHUNK_SEQUENCES = 32
#: disk left free by an extraction, beside what it writes
DISK_RESERVE = 1 << 30
#: the per-token tensors besides the features: lse (float32) and top (int32)
SCALAR_BYTES = 8

Progress = Callable[[int, int], None]


def sequence_key(target: Any, ids: Sequence[int], aux_layers: Sequence[int] | None = None) -> str:
    """What a sequence's features depend on: the target, its mode (dtype, quantisation), the ids,
    and the extra layers recorded for an EAGLE-3 head."""
    extra = "" if not aux_layers else "aux=" + ",".join(map(str, aux_layers)) + "|"
    h = hashlib.sha256(f"{target.name}|{target.mode}|{extra}".encode())
    h.update(",".join(map(str, ids)).encode())
    return h.hexdigest()[:24]


def bytes_per_token(hidden_size: int, aux_layers: Sequence[int] | None = None) -> int:
    """Disk bytes a stored position takes: float16 features of the last layer and of each aux
    layer, then lse and top.

    >>> bytes_per_token(576), bytes_per_token(576, (1, 15, 28))
    (1160, 4616)
    """
    return 2 * int(hidden_size) * (1 + len(aux_layers or ())) + SCALAR_BYTES


def human_bytes(n: float) -> str:
    """``n`` bytes for a message.

    >>> human_bytes(4616 * 480_000), human_bytes(512)
    ('2.2 GB', '512 B')
    """
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def store_fingerprint(target: Any) -> dict[str, Any]:
    """What a store's features were computed with: the target's name, mode, and tokenizer and
    shape fingerprint."""
    d, vocab = int(target.config.hidden_size), int(target.runtime.vocab_size)
    return {"target": target.name, "mode": str(target.mode), "model": target_fingerprint(target.tokenizer, d, vocab)}


@dataclass
class FeatureStore:
    """Every sequence's tokens and target outputs, each a view into its memory-mapped chunk.

    ``rows(name, i, lo, hi)`` is sequence ``i``'s rows ``lo .. hi - 1`` of ``feats`` ``[·, d]``,
    ``aux`` ``[·, 3d]`` (EAGLE-3 only), ``lse`` or ``top``; ``ids[i]`` its tokens, the first
    ``prompt_lens[i]`` the prompt."""

    chunks: list[dict[str, torch.Tensor]]
    where: list[tuple[int, int]]  # sequence i: (chunk, its first row there)
    ids: list[torch.Tensor]
    lengths: list[int]
    prompt_lens: list[int]
    width: int  # d
    aux_width: int = 0  # 3d for an EAGLE-3 store, else 0

    def __len__(self) -> int:
        return len(self.where)

    @property
    def has_aux(self) -> bool:
        return self.aux_width > 0

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    def rows(self, name: str, i: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        chunk, first = self.where[i]
        end = self.lengths[i] if hi is None else hi
        return self.chunks[chunk][name][first + lo : first + end]


def _target_pass(runtime: Any, ids: Sequence[int], aux: int) -> dict[str, torch.Tensor]:
    """One full pass over ``ids`` from position 0 with capture on: features (the last layer's
    last, after ``aux`` other layers when asked), lse, argmax."""
    runtime.rollback(0)
    logits = runtime.forward(list(ids)).float()  # [L, vocab]
    recorded = runtime.features(0, len(ids))  # [L, (aux + 1) d]: aux layers, then the last
    runtime.rollback(0)
    if not torch.isfinite(recorded).all() or float(recorded.abs().max()) > 6e4:
        raise ConfigError("the target's features do not fit float16 (|f| > 60000); this target is not supported yet")
    d = recorded.shape[1] // (aux + 1)
    out = {
        "feats": recorded[:, -d:].to(torch.float16).cpu(), "lse": torch.logsumexp(logits, -1).cpu(),
        "top": logits.argmax(-1).to(torch.int32).cpu(),
    }
    if aux:
        out["aux"] = recorded[:, :-d].to(torch.float16).contiguous().cpu()
    return out


def _read_index(folder: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The store's index (a fresh one for an empty folder); refuses a damaged one, or one of
    another target. An index written before fingerprints existed takes this one: its keys
    already hash the target, mode and layers, so nothing of another target can match."""
    path = folder / INDEX_FILE
    if not path.is_file():
        return {"format": FEATURES_FORMAT, "fingerprint": fingerprint, "layer_sets": [], "chunks": 0, "sequences": {}}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        if index.get("format") != FEATURES_FORMAT or not isinstance(index.get("sequences"), dict):
            raise ValueError(f"format is not {FEATURES_FORMAT}")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}); delete {folder} to extract the features again") from None
    have = index.setdefault("fingerprint", fingerprint)
    if have != fingerprint:
        was, now = (f"{fp.get('target')} ({fp.get('mode')})" for fp in (have, fingerprint))
        raise ConfigError(
            f"{folder} holds features of {was}, not of {now}{' (other weights)' if was == now else ''}: "
            f"pass another --data-dir, or delete {folder}"
        )
    return index


def _check_disk(folder: Path, need: int, tokens: int, bpt: int, sequences: int, max_disk: int | None) -> None:
    """Refuse, before any pass, an extraction over ``max_disk`` (with what is stored) or over the
    free disk space less :data:`DISK_RESERVE`."""
    used = sum(p.stat().st_size for p in folder.glob("chunk-*.safetensors"))
    what = f"the features need {human_bytes(need)} more ({bpt} bytes a token x {tokens:,} tokens of {sequences} sequences)"
    if max_disk is not None and used + need > max_disk:
        fit = max(0, max_disk - used) // max(1, bpt)
        raise ConfigError(
            f"{what} beside the {human_bytes(used)} in {folder}: over --max-disk {human_bytes(max_disk)}, which holds "
            f"about {fit:,} more tokens; pass fewer sequences or a larger --max-disk"
        )
    free = shutil.disk_usage(folder).free
    if need > free - DISK_RESERVE:
        raise ConfigError(f"{what} and {folder} has {human_bytes(free)} free; free some space (1 GB is kept spare)")


def extract_features(
    target: Any, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int], data_dir: Path, *,
    aux_layers: Sequence[int] | None = None, max_disk: int | None = None, on_progress: Progress | None = None,
    on_status: Callable[[str], None] | None = None,
) -> FeatureStore:
    """The target's features of every sequence, from ``DATA/features`` or one runtime pass each
    (see the module doc); with ``aux_layers`` (an EAGLE-3 head's), those layers' outputs too."""
    runtime = target.runtime
    if not hasattr(runtime, "capture_features"):
        raise ConfigError(f"train-head needs a runtime that records features; {target.name} runs on one that does not")
    folder = data_dir / FEATURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    aux = tuple(int(i) for i in aux_layers) if aux_layers else None
    index = _read_index(folder, store_fingerprint(target))
    layers = list(aux) if aux else None
    keys = [sequence_key(target, s, aux) for s in sequences]
    first_of = {k: keys.index(k) for k in dict.fromkeys(keys)}
    todo = [first_of[k] for k in first_of if k not in index["sequences"]]
    bpt = bytes_per_token(int(target.config.hidden_size), aux)
    tokens = sum(len(sequences[i]) for i in todo)
    if todo:
        _check_disk(folder, tokens * bpt, tokens, bpt, len(todo), max_disk)
    done, total = len(first_of) - len(todo), len(first_of)
    if on_progress:
        on_progress(done, total)
    if todo:
        if layers not in index.setdefault("layer_sets", []):
            index["layer_sets"].append(layers)
        runtime.capture_features(None if aux is None else (*aux, int(runtime.num_layers) - 1))
        try:
            for c in range(0, len(todo), CHUNK_SEQUENCES):
                batch = todo[c : c + CHUNK_SEQUENCES]
                _write_chunk(folder, index, [_target_pass(runtime, sequences[i], len(aux or ())) for i in batch],
                             [keys[i] for i in batch], done, total)
                done += len(batch)
                if on_progress:
                    on_progress(done, total)
        finally:
            runtime.capture_features(enabled=False)
    store = open_store(folder, index, keys, sequences, prompt_lens)
    if on_status:
        size = store.tokens * bpt
        on_status(f"features: {len(store)} sequences, {store.tokens:,} tokens, {human_bytes(size)} ({bpt} bytes a token)")
    return store


def _write_chunk(folder: Path, index: dict[str, Any], part: list[dict[str, torch.Tensor]], keys: list[str],
                 done: int, total: int) -> None:
    """Write one chunk, then list its sequences in the index; a full disk stops the run cleanly
    with what is stored kept for a resume."""
    from safetensors.torch import save_file

    name = f"chunk-{index['chunks']:05d}.safetensors"
    try:
        with atomic_path(folder / name) as tmp:
            save_file({k: torch.cat([p[k] for p in part]).contiguous() for k in part[0]}, str(tmp))
        entries = dict(index["sequences"])
        row = 0
        for key, p in zip(keys, part):
            entries[key] = [name, row, int(p["lse"].shape[0])]
            row += int(p["lse"].shape[0])
        write_json_atomic(folder / INDEX_FILE, {**index, "chunks": index["chunks"] + 1, "sequences": entries}, indent=None)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise ConfigError(
            f"the disk filled while writing {folder / name}: {done} of {total} sequences are stored in {folder}; "
            "free some space and run again to resume"
        ) from None
    index["chunks"] += 1
    index["sequences"] = entries


def open_store(folder: Path, index: dict[str, Any], keys: Sequence[str], sequences: Sequence[Sequence[int]],
               prompt_lens: Sequence[int]) -> FeatureStore:
    """Map the chunks that hold ``keys`` (each opened once, memory-mapped) into a store."""
    from safetensors.torch import load_file

    names: dict[str, int] = {}
    chunks: list[dict[str, torch.Tensor]] = []
    where = []
    for key, seq in zip(keys, sequences):
        name, row, length = index["sequences"][key]
        if length != len(seq):
            raise ConfigError(f"{folder / INDEX_FILE} disagrees with the sequences; delete {folder} to extract again")
        if name not in names:
            try:
                chunks.append(load_file(str(folder / name)))
            except (OSError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"{folder / name} is damaged ({str(exc)[:80]}); delete {folder} to extract again") from None
            names[name] = len(chunks) - 1
        where.append((names[name], int(row)))
    width = int(chunks[0]["feats"].shape[1]) if chunks else 0
    aux_width = int(chunks[0]["aux"].shape[1]) if chunks and "aux" in chunks[0] else 0
    return FeatureStore(
        chunks, where, [torch.tensor(list(s), dtype=torch.long) for s in sequences], [len(s) for s in sequences],
        [int(p) for p in prompt_lens], width, aux_width,
    )
