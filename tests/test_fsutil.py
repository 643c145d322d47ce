"""Safe files: atomic writes, output folders deleted only when draftwise made them, unwritable
places found up front. (Tests run as root, where chmod does not stop writes: a path under a
regular file, ``some_file/sub``, is what cannot be written.)"""

from __future__ import annotations

import json
import os

import pytest
import torch

from draftwise import ConfigError
from draftwise.fsutil import (
    MARKER,
    atomic_path,
    check_output_dir,
    check_writable,
    claim_output_dir,
    is_owned_by,
    write_json_atomic,
    write_text_atomic,
)


def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "x.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "é": "ü"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2, "é": "ü"}
    assert os.listdir(path.parent) == ["x.json"]
    assert path.stat().st_mode & 0o777 == 0o644  # readable like any file, not mkstemp's 0600


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "x.json"
    write_text_atomic(path, "old")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})  # fails while serialising
    with pytest.raises(TypeError):
        write_text_atomic(path, b"bytes are not text")  # type: ignore[arg-type]  # fails mid-write
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["x.json"]


def test_atomic_path_for_torch_save(tmp_path):
    path = tmp_path / "w.pt"
    with atomic_path(path) as tmp:
        torch.save({"x": torch.ones(2)}, tmp)
        assert not path.exists()  # nothing visible until the block ends
    assert torch.load(path, weights_only=True)["x"].tolist() == [1.0, 1.0]
    assert os.listdir(tmp_path) == ["w.pt"]


def test_check_writable(tmp_path):
    assert check_writable(tmp_path / "new" / "deep") == tmp_path / "new" / "deep"
    assert (tmp_path / "new" / "deep").is_dir() and not os.listdir(tmp_path / "new" / "deep")  # no probe left
    blocker = tmp_path / "some_file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"cannot write to the cache .*some_file/sub.*; set X") as info:
        check_writable(blocker / "sub", "cache", fix="set X")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="choose another"):
        check_writable(blocker)


def test_claim_a_new_or_empty_folder(tmp_path):
    out = claim_output_dir(tmp_path / "new", "bench", overwrite=False)
    assert (out / MARKER).read_text() == "bench\n" and is_owned_by(out, "bench") and not is_owned_by(out, "distill")
    (tmp_path / "empty").mkdir()
    assert is_owned_by(claim_output_dir(tmp_path / "empty", "bench", overwrite=False), "bench")
    # a folder holding only the marker loses nothing: claimed again without --overwrite
    assert claim_output_dir(out, "bench", overwrite=False) == out


def test_claim_refuses_earlier_output_without_overwrite_and_replaces_it_with(tmp_path):
    out = claim_output_dir(tmp_path / "run", "bench", overwrite=False)
    (out / "answers.jsonl").write_text("old")
    with pytest.raises(ConfigError, match=r"already holds answers; pass --overwrite"):
        claim_output_dir(out, "bench", overwrite=False, holds="answers")
    assert (out / "answers.jsonl").exists()
    claim_output_dir(out, "bench", overwrite=True)
    assert sorted(os.listdir(out)) == [MARKER]


@pytest.mark.parametrize("overwrite", [False, True])
def test_claim_never_deletes_a_folder_draftwise_did_not_make(tmp_path, overwrite):
    user = tmp_path / "project"
    (user / "data").mkdir(parents=True)
    (user / "checkpoints").mkdir()
    (user / "notes.txt").write_text("mine")
    other = tmp_path / "other"
    claim_output_dir(other, "bench", overwrite=False)
    (other / "x").write_text("bench's")
    for folder, match in ((user, "did not make it"), (other, "did not make it")):
        with pytest.raises(ConfigError, match=match) as info:
            claim_output_dir(folder, "distill", overwrite=overwrite)
        assert str(folder) in str(info.value)
        if not overwrite:
            assert "--overwrite" not in str(info.value)  # it would not help
    assert sorted(os.listdir(user)) == ["checkpoints", "data", "notes.txt"]
    assert (other / "x").read_text() == "bench's"


def test_check_output_dir_touches_nothing(tmp_path):
    assert check_output_dir(tmp_path / "missing", "bench", overwrite=True) == tmp_path / "missing"
    assert not (tmp_path / "missing").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        check_output_dir(tmp_path / "f", "bench", overwrite=False)
