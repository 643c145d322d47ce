"""The EAGLE head's feature store on disk (draftwise.eagle.features): sharded, memory-mapped,
bounded by --max-disk and free space, stopped cleanly by a full disk, refused for another target."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.cli import app
from draftwise.cli.train_head import parse_bytes
from draftwise.eagle import features as feature_store
from draftwise.eagle.features import (
    FEATURES_DIR,
    INDEX_FILE,
    bytes_per_token,
    extract_features,
)


def _seqs(tiny, n: int) -> list[list[int]]:
    return [tiny.encode_prompt(f"Question number {i} about the sea.") + [5 + i % 7, 6, 2] for i in range(n)]


def test_a_store_of_many_chunks_is_mapped_not_copied(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(feature_store, "CHUNK_SEQUENCES", 2)
    seqs = _seqs(tiny, 5)
    store = extract_features(tiny, seqs, [3] * 5, tmp_path)
    assert len(store.chunks) == 3 and [w[0] for w in store.where] == [0, 0, 1, 1, 2]
    files = sorted(p.name for p in (tmp_path / FEATURES_DIR).glob("chunk-*"))
    assert files == ["chunk-00000.safetensors", "chunk-00001.safetensors", "chunk-00002.safetensors"]
    # each sequence's rows are a view of its chunk's tensor (nothing concatenated in memory)
    base = store.chunks[1]["feats"]
    assert store.rows("feats", 3).untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    size = sum(p.stat().st_size for p in (tmp_path / FEATURES_DIR).glob("chunk-*"))
    want = store.tokens * bytes_per_token(int(tiny.config.hidden_size))
    assert want <= size < want + 3 * 4096  # the safetensors headers are all that is added


def test_max_disk_is_checked_before_any_pass(tiny, tmp_path, monkeypatch):
    seqs = _seqs(tiny, 3)
    passes = []
    real = feature_store._target_pass
    monkeypatch.setattr(feature_store, "_target_pass", lambda *a: passes.append(1) or real(*a))
    need = sum(map(len, seqs)) * bytes_per_token(int(tiny.config.hidden_size))
    with pytest.raises(ConfigError, match=r"over --max-disk .* pass fewer sequences or a larger --max-disk"):
        extract_features(tiny, seqs, [3] * 3, tmp_path, max_disk=need - 1)
    assert passes == []
    extract_features(tiny, seqs, [3] * 3, tmp_path, max_disk=need)
    assert len(passes) == 3


def test_free_disk_space_is_checked_before_any_pass(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(feature_store.shutil, "disk_usage", lambda p: type("U", (), {"free": 10**9})())
    with pytest.raises(ConfigError, match=r"has 1\.0 GB free; free some space"):
        extract_features(tiny, _seqs(tiny, 2), [3, 3], tmp_path)


def test_a_full_disk_stops_cleanly_and_the_rerun_resumes(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(feature_store, "CHUNK_SEQUENCES", 2)
    seqs = _seqs(tiny, 5)
    import safetensors.torch as st

    real_save, writes = st.save_file, []

    def save(tensors, path):
        writes.append(path)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(tensors, path)

    monkeypatch.setattr(st, "save_file", save)
    with pytest.raises(ConfigError, match=r"the disk filled .* 2 of 5 sequences are stored .* run again to resume"):
        extract_features(tiny, seqs, [3] * 5, tmp_path)
    folder = tmp_path / FEATURES_DIR
    index = json.loads((folder / INDEX_FILE).read_text())
    assert index["chunks"] == 1 and len(index["sequences"]) == 2
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no half-written chunk
    monkeypatch.setattr(st, "save_file", real_save)
    passes = []
    real = feature_store._target_pass
    monkeypatch.setattr(feature_store, "_target_pass", lambda *a: passes.append(1) or real(*a))
    store = extract_features(tiny, seqs, [3] * 5, tmp_path)
    assert len(passes) == 3 and len(store) == 5


def test_a_store_of_another_target_is_refused(tiny, tmp_path):
    seqs = _seqs(tiny, 2)
    extract_features(tiny, seqs, [3, 3], tmp_path)
    path = tmp_path / FEATURES_DIR / INDEX_FILE
    index = json.loads(path.read_text())
    index["fingerprint"]["model"] = "0" * 16
    path.write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"holds features of .*\(other weights\): pass another --data-dir"):
        extract_features(tiny, seqs, [3, 3], tmp_path)
    del index["fingerprint"]  # written before fingerprints: it takes this target's
    path.write_text(json.dumps(index))
    assert len(extract_features(tiny, seqs, [3, 3], tmp_path)) == 2
    assert json.loads(path.read_text()).get("fingerprint") is None  # nothing new was written


@pytest.mark.parametrize("text", ["0", "-1GB", "forty", "12XB", ""])
def test_max_disk_must_be_a_size(text):
    with pytest.raises(ConfigError, match="--max-disk .* is not a size"):
        parse_bytes(text, "--max-disk")


def test_train_head_refuses_a_bad_max_disk_and_weight_decay_in_one_line(tmp_path, tiny_chat_folder):
    runner = CliRunner()
    target = ["--target", str(tiny_chat_folder)]  # not the default model: the refusals need no real one
    got = runner.invoke(app, ["train-head", *target, "--out", str(tmp_path / "h"), "--max-disk", "lots"])
    assert got.exit_code != 0 and "--max-disk 'lots' is not a size" in got.output and "Traceback" not in got.output
    got = runner.invoke(app, ["train-head", *target, "--out", str(tmp_path / "h"), "--weight-decay", "-1"])
    assert got.exit_code != 0 and "weight_decay=-1.0" in got.output and "Traceback" not in got.output


def test_weight_decay_reaches_the_optimizer(tiny, tmp_path, monkeypatch):
    from draftwise.eagle import run as head_run

    seen = []
    real = torch.optim.AdamW

    def adamw(params, **kw):
        seen.append(kw["weight_decay"])
        return real(params, **kw)

    monkeypatch.setattr(head_run.torch.optim, "AdamW", adamw)
    from .test_train_head import FAST

    head_run.train_head(tiny, tmp_path / "h", steps=1, weight_decay=0.05, **FAST)
    assert seen == [0.05]
    meta = json.loads((tmp_path / "h" / "draftwise_head.json").read_text())
    assert meta["settings"]["weight_decay"] == 0.05
