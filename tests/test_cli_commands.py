"""The commands' plumbing, checked without training or measuring anything: options reach the
library functions unchanged, the ``profile`` command has its own module, and ``--threads``
warns only past the cores."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import draftwise.cli.common as cli_common
import draftwise.cli.distill as cli_distill
import draftwise.cli.train_head as cli_train_head
from draftwise.cli import app

runner = CliRunner()


def test_distill_passes_its_options_through(tmp_path, monkeypatch):
    seen: dict = {}

    def fake_distill(target, out_dir, **kwargs):
        seen.update(kwargs, target=target, out_dir=out_dir)
        return SimpleNamespace(
            out_dir=out_dir, steps=3, planned_steps=3, first_loss=2.0, loss=1.0, tokens=96, train_seconds=1.0,
            data_seconds=0.5, stopped="completed", layers=2, init_layers=[0, 2], hidden_size=64,
            vocab_subset_size=None, train_sequences=4, eval=None,
        )

    monkeypatch.setattr(cli_distill, "distill", fake_distill)
    # the command recorded in the draft is the shell's, quoted, whatever the executable's path
    monkeypatch.setattr("sys.argv", ["/opt/venv/bin/draftwise", "distill", "--out", "my draft"])
    out = tmp_path / "draft"
    res = runner.invoke(app, ["distill", "--out", str(out), "--target", "tiny", "--layers", "2", "--init-layers",
                              "0,2", "--gen-temperatures", "0,0.7", "--k", "3", "--steps", "3", "--json"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert seen["target"] == "tiny" and seen["out_dir"] == out  # a plain target: distill loads it
    assert seen["layers"] == 2 and seen["init_layers"] == [0, 2] and seen["gen_temperatures"] == [0.0, 0.7]
    assert seen["eval_k"] == 3 and seen["steps"] == 3 and seen["checkpoint_every"] == 50
    assert seen["command"] == "draftwise distill --out 'my draft'"
    assert json.loads(res.stdout)["init_layers"] == [0, 2]


def test_distill_bad_number_list_is_one_line(tmp_path):
    res = runner.invoke(app, ["distill", "--out", str(tmp_path / "d"), "--init-layers", "0,x"])
    assert res.exit_code == 2
    assert res.output.strip() == "error: --init-layers '0,x' must be comma-separated numbers, like 0,10,20,29"


def test_train_head_passes_its_options_through(tmp_path, monkeypatch):
    seen: dict = {}

    def fake_train_head(model, out_dir, **kwargs):
        seen.update(kwargs, model=model)
        return SimpleNamespace(
            out_dir=tmp_path, steps=2, planned_steps=2, stopped="completed", first_loss=3.0, loss=2.0,
            heldout=None, draft_vocab_size=512, train_sequences=4, heldout_sequences=1, phase_seconds={"train": 1.0},
        )

    (tmp_path / "train_log.jsonl").write_text("")  # no snapshots: no curve drawn
    monkeypatch.setattr(cli_train_head, "train_head", fake_train_head)
    monkeypatch.setattr(cli_train_head, "check_out", lambda *a, **kw: None)
    monkeypatch.setattr(cli_train_head, "load_with_status", lambda target, *a, **kw: f"model {target}")
    res = runner.invoke(app, ["train-head", "--out", str(tmp_path / "head"), "--target", "tiny", "--arch", "eagle3",
                              "--gen-temperatures", "0.5", "--ttt", "2", "--steps", "2", "--json"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert seen["model"] == "model tiny" and seen["arch"] == "eagle3" and seen["ttt"] == 2
    assert seen["gen_temperatures"] == [0.5] and seen["steps"] == 2 and seen["snapshot_every"] == 50
    assert seen["init"] is None and callable(seen["on_status"]) and callable(seen["on_step"])
    assert json.loads(res.stdout)["draft_vocab_size"] == 512


def test_profile_is_its_own_command_module():
    from draftwise.cli import plan, profile

    commands = {c.name: c.callback for c in app.registered_commands}
    assert commands["profile"] is profile.profile_cmd
    assert not hasattr(plan, "profile_cmd")


@pytest.mark.parametrize("threads, warned", [("2", False), ("3", True)])
def test_threads_warns_only_past_the_cores(threads, warned, monkeypatch):
    monkeypatch.setattr(cli_common, "usable_cores", lambda: 2)
    monkeypatch.setattr(cli_common, "load_model", lambda *a, **kw: pytest.fail("loaded the model"))
    res = runner.invoke(app, ["plan", "--ks", "0", "--threads", threads])  # fails before the model loads
    assert res.exit_code == 2
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == warned and all("--threads 3 is more than the 2 CPU cores" in w for w in warnings)


def test_usable_cores_is_what_the_process_may_use():
    cores = cli_common.usable_cores()
    assert 1 <= cores <= (os.cpu_count() or cores)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_profile_says_so(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text("{}")
    prof.chmod(0)
    res = runner.invoke(app, ["breakeven", "--profile", str(prof)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: --profile {prof} cannot be read (permission denied); give a profile JSON you can read"


def test_a_missing_profile_names_the_file_to_make(tmp_path):
    missing = tmp_path / "p.json"
    res = runner.invoke(app, ["breakeven", "--profile", str(missing)])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: no profile at {missing}; make one with `draftwise profile --out {missing}`"
