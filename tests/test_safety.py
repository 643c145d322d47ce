"""Unsafe and destructive paths of distill, each reproduced and shown closed.

- ``--resume`` reads ``checkpoints/last.pt`` with ``torch.load(weights_only=True)``: a crafted
  pickle whose ``__reduce__`` would run code is refused, and its code does not run.
- ``--overwrite`` never deletes a folder distill did not make; the CLI says so in one line,
  with exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.cli import app
from draftwise.distill import distill
from draftwise.training.checkpoint import load_checkpoint, load_snapshot

PROMPTS = [("writing", "Write a short poem."), ("qa", "Why is the sky blue?"), ("math", "What is 12 times 7?")] * 2
FAST = dict(layers=1, steps=2, batch=2, seq_len=16, gen_tokens=4, eval_prompts=0)


class Payload:
    """Unpickling it calls ``open(path, "w")``: creates a file, as a real attack would run code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in enumerate(PROMPTS)))
    return path


def test_the_payload_really_runs_when_loaded_unsafely(tmp_path):
    """The crafted file is a real attack: its pickle runs code when unpickled without
    ``weights_only`` (shown with the pickle module itself on the archive's data.pkl; the file
    holds no tensors, so that is all an unrestricted torch.load would do)."""
    import pickle
    import zipfile

    proof = tmp_path / "ran"
    torch.save({"model": Payload(proof)}, tmp_path / "evil.pt")
    with zipfile.ZipFile(tmp_path / "evil.pt") as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        pickle.loads(archive.read(name))
    assert proof.exists()


def test_resume_does_not_run_a_crafted_checkpoint(tiny, prompts_file, tmp_path):
    out = tmp_path / "run"
    first = distill(tiny, out, prompts=prompts_file, on_step=lambda log: True, **FAST)  # stops after step 1
    assert first.steps == 1 and (out / "checkpoints" / "last.pt").is_file()
    real = torch.load(out / "checkpoints" / "last.pt", weights_only=True)  # what distill writes loads safely
    assert real["step"] == 1 and isinstance(real["settings"], dict)

    proof = tmp_path / "pwned"
    torch.save({**real, "model": Payload(proof)}, out / "checkpoints" / "last.pt")
    with pytest.raises(ConfigError, match=r"last\.pt is not a distill checkpoint draftwise can load safely") as info:
        distill(tiny, out, resume=True)
    assert not proof.exists() and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="load safely"):
        load_checkpoint(out / "checkpoints")
    assert not proof.exists()

    # a snapshot (read by benchmarks/distill_curve.py) is read the same way
    torch.save({"weights": {}, "step": 5, "x": Payload(proof)}, out / "checkpoints" / "step-000005.pt")
    with pytest.raises(ConfigError, match="snapshot"):
        load_snapshot(out / "checkpoints", 5)
    assert not proof.exists()

    # the folder is distill's: --overwrite starts over there
    again = distill(tiny, out, prompts=prompts_file, overwrite=True, **FAST)
    assert again.steps == 2 and again.stopped == "completed"


def test_a_truncated_checkpoint_is_one_clear_line(tiny, prompts_file, tmp_path):
    out = tmp_path / "run"
    distill(tiny, out, prompts=prompts_file, on_step=lambda log: True, **FAST)
    last = out / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:100])
    with pytest.raises(ConfigError, match="can load safely") as info:
        distill(tiny, out, resume=True)
    assert "\n" not in str(info.value)


def test_cli_overwrite_keeps_a_user_folder_and_exits_2(tiny_chat_folder, prompts_file, tmp_path):
    user = tmp_path / "project"
    (user / "data").mkdir(parents=True)
    (user / "data" / "results.csv").write_text("a,b\n1,2\n")
    (user / "checkpoints").mkdir()
    (user / "report.md").write_text("# my work\n")
    before = sorted(str(p.relative_to(user)) for p in user.rglob("*"))
    args = ["distill", "--target", str(tiny_chat_folder), "--out", str(user), "--prompts", str(prompts_file),
            "--layers", "1", "--steps", "1", "--eval-prompts", "0"]
    for extra in (["--overwrite"], ["--resume"], []):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "error:" in lines[0], result.output
        assert "Traceback" not in result.output
    assert "refusing to delete" in CliRunner().invoke(app, [*args, "--overwrite"]).output
    assert sorted(str(p.relative_to(user)) for p in user.rglob("*")) == before
    assert (user / "data" / "results.csv").read_text() == "a,b\n1,2\n" and (user / "report.md").exists()
