"""Threads and the OpenMP wait policy (draftwise.threads), ``--threads`` and the load options on
the CLI, and sampling that follows the device of its probabilities."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from draftwise.cli import app
from draftwise.errors import ConfigError
from draftwise.core.sampling import SamplingConfig, sample
from draftwise.threads import OPT_OUT, SPIN_COUNT, apply_omp_defaults, set_threads
from draftwise.core.verify import verify_sampled

runner = CliRunner()
OMP_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", OPT_OUT, "DRAFTWISE_SHARE_CORES")


# --- the OpenMP defaults ------------------------------------------------------------------------


def test_defaults_fill_in_only_what_the_user_left_unset():
    env: dict[str, str] = {}
    assert apply_omp_defaults(env) == {} and env == {}  # cores are shared by thread count
    env = {"DRAFTWISE_SHARE_CORES": "0"}  # without that sharing, a short spin shares them
    assert apply_omp_defaults(env) == {"GOMP_SPINCOUNT": SPIN_COUNT}
    assert env["GOMP_SPINCOUNT"] == SPIN_COUNT
    mine = {"GOMP_SPINCOUNT": "123", "DRAFTWISE_SHARE_CORES": "0"}
    assert apply_omp_defaults(mine) == {} and mine["GOMP_SPINCOUNT"] == "123"
    # GOMP_SPINCOUNT would override the user's wait policy in libgomp, so it is left alone too
    passive = {"OMP_WAIT_POLICY": "PASSIVE", "DRAFTWISE_SHARE_CORES": "0"}
    assert apply_omp_defaults(passive) == {} and "GOMP_SPINCOUNT" not in passive


@pytest.mark.parametrize("value", ["0", "off", "False", " no "])
def test_defaults_can_be_turned_off(value):
    env = {OPT_OUT: value, "DRAFTWISE_SHARE_CORES": "0"}
    assert apply_omp_defaults(env) == {} and "GOMP_SPINCOUNT" not in env


# Records GOMP_SPINCOUNT at the moment torch is first imported: libgomp reads it then, once.
# The command line (draftwise.cli) sets the policy; the library (draftwise, then a name from it
# that loads torch) leaves the environment alone.
SEEN_BY_TORCH = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("GOMP_SPINCOUNT"))
sys.meta_path.insert(0, Spy())
import draftwise.cli
print(seen[0], os.environ.get("GOMP_SPINCOUNT"))
"""
LIBRARY_ONLY = SEEN_BY_TORCH.replace("import draftwise.cli", "import draftwise; draftwise.load_model")


OFF = {"DRAFTWISE_SHARE_CORES": "0"}
FRESH = {  # one fresh Python each: (its code, the environment it starts with)
    "cli": (SEEN_BY_TORCH, {}),
    "cli, no core sharing": (SEEN_BY_TORCH, OFF),
    "library, no core sharing": (LIBRARY_ONLY, OFF),
    "cli, the user's spin count": (SEEN_BY_TORCH, {"GOMP_SPINCOUNT": "777", **OFF}),
    "cli, opted out": (SEEN_BY_TORCH, {OPT_OUT: "0", **OFF}),
}


@pytest.fixture(scope="module")
def fresh() -> dict[str, subprocess.CompletedProcess]:
    """What each of :data:`FRESH` printed. Each needs a Python of its own (libgomp reads the
    variable once, when torch loads); they start together, so their imports overlap on the cores."""
    runs = {}
    for name, (code, env_vars) in FRESH.items():
        env = {k: v for k, v in os.environ.items() if k not in OMP_VARS} | env_vars
        runs[name] = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
    done = {}
    try:
        for name, proc in runs.items():
            out, err = proc.communicate(timeout=120)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in runs.values():
            if proc.poll() is None:  # a hung one: ended, not left behind
                proc.kill()
                proc.wait()
    return done


def _printed(fresh: dict[str, subprocess.CompletedProcess], name: str) -> str:
    assert fresh[name].returncode == 0, fresh[name].stderr
    return fresh[name].stdout.strip()


def test_the_command_line_sets_the_policy_before_torch_loads(fresh):
    assert _printed(fresh, "cli") == "None None"  # sharing by threads: libgomp's own spin
    assert _printed(fresh, "cli, no core sharing") == f"{SPIN_COUNT} {SPIN_COUNT}"


def test_the_library_leaves_the_environment_alone(fresh):
    assert _printed(fresh, "library, no core sharing") == "None None"


def test_a_user_setting_is_kept_and_the_opt_out_is_honoured(fresh):
    assert _printed(fresh, "cli, the user's spin count") == "777 777"
    assert _printed(fresh, "cli, opted out") == "None None"


# --- set_threads and --threads ------------------------------------------------------------------


def test_set_threads_sets_torch_and_none_leaves_it():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_threads(None) == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "2"])
def test_set_threads_refuses_less_than_one(bad):
    with pytest.raises(ConfigError, match="--threads must be at least 1"):
        set_threads(bad)


MODEL_COMMANDS = [
    ["generate", "hi"], ["demo"], ["profile"], ["plan"], ["bench"], ["bench-runtime"],
    ["calibrate-self"], ["distill", "--out", "unused-folder"], ["serve"], ["bench-modes"],
]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
def test_threads_zero_is_one_line_on_every_model_command(command, monkeypatch, tmp_path):
    import draftwise.cli.common as common

    monkeypatch.chdir(tmp_path)  # nothing may be written, but if it were, not into the repo
    monkeypatch.setattr(common, "load_model", lambda *a, **kw: pytest.fail("loaded the model"))
    res = runner.invoke(app, [*command, "--threads", "0"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == "error: --threads must be at least 1 (got 0)"
    assert not (tmp_path / "unused-folder").exists()


@pytest.mark.parametrize("command", [c for c in MODEL_COMMANDS if c[0] not in ("bench-runtime", "bench-modes")], ids=lambda c: c[0])
def test_every_model_command_takes_the_load_options(command):
    res = runner.invoke(app, [command[0], "--help"], catch_exceptions=False)
    assert res.exit_code == 0
    for flag in ("--threads", "--device", "--quant", "--compile"):
        assert flag in res.output, (command[0], flag)


def test_load_options_reach_load_model(monkeypatch):
    import draftwise.cli.common as common

    seen: dict = {}

    def fake_load_model(spec, **kwargs):
        seen.update(kwargs, threads=torch.get_num_threads())
        raise ConfigError("stop here")

    before = torch.get_num_threads()
    monkeypatch.setattr(common, "load_model", fake_load_model)
    try:
        res = runner.invoke(
            app, ["generate", "hi", "--threads", "1", "--device", "cuda", "--quant", "q4", "--compile"],
            catch_exceptions=False,
        )
    finally:
        torch.set_num_threads(before)
    assert res.exit_code == 2 and "stop here" in res.output
    assert seen["device"] == "cuda" and seen["quant"] == "q4" and seen["compile"] is True
    assert seen["threads"] == 1  # --threads was applied before the model loaded


def test_bad_quant_is_refused_by_the_cli():
    res = runner.invoke(app, ["generate", "hi", "--quant", "q3"], catch_exceptions=False)
    assert res.exit_code != 0 and "q3" in res.output


# --- sampling follows its probabilities' device; the generator stays on the CPU ------------------


def test_seeded_cpu_sampling_is_unchanged():
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(3)), dim=-1)
    g1, g2 = SamplingConfig(temperature=1.0, seed=5).generator(), torch.Generator().manual_seed(5)
    assert g1.device.type == "cpu"
    ours = [sample(probs, g1) for _ in range(20)]
    plain = [int(torch.multinomial(probs, 1, generator=g2).item()) for _ in range(20)]
    assert ours == plain


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_probabilities_draw_the_same_tokens_as_cpu_ones():
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(5, 64, generator=gen), dim=-1)  # [k + 1, vocab]
    q = torch.softmax(torch.randn(4, 64, generator=gen), dim=-1)  # [k, vocab]
    proposed = [int(t) for t in q.argmax(dim=-1)]
    on_cpu = verify_sampled(proposed, q, p, torch.Generator().manual_seed(0))
    on_cuda = verify_sampled(proposed, q.cuda(), p.cuda(), torch.Generator().manual_seed(0))
    assert on_cpu == on_cuda
    assert sample(p[0].cuda(), torch.Generator().manual_seed(1)) == sample(p[0], torch.Generator().manual_seed(1))


def test_share_cores_splits_the_threads_between_decoding_processes(tmp_path, monkeypatch):
    """Another live draftwise process that is decoding (its entry freshly touched) halves this
    process's threads; once it is gone, or idle, this process takes every core back."""
    import subprocess
    import sys
    import time

    import draftwise.threads as th

    monkeypatch.setattr(th, "_state", {"registered": False, "pinned": False, "cores": 4,
                                       "current": None, "checked": -1e9})
    monkeypatch.delenv("DRAFTWISE_OMP_DEFAULTS", raising=False)
    monkeypatch.delenv("DRAFTWISE_SHARE_CORES", raising=False)
    before = torch.get_num_threads()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert th.share_cores(force=True, folder=tmp_path) == 4  # alone
        (tmp_path / str(other.pid)).touch()
        assert th.share_cores(force=True, folder=tmp_path) == 2 and torch.get_num_threads() == 2
        old = time.time() - 10
        os.utime(tmp_path / str(other.pid), (old, old))  # registered but idle: not counted
        assert th.share_cores(force=True, folder=tmp_path) == 4
        (tmp_path / str(other.pid)).touch()
        assert th.share_cores(force=True, folder=tmp_path) == 2
    finally:
        other.kill()
        other.wait()
    assert th.share_cores(force=True, folder=tmp_path) == 4  # the other one is gone
    assert not (tmp_path / str(other.pid)).exists()  # and its stale entry removed
    th._state["pinned"] = True  # --threads given: the user's choice stands
    assert th.share_cores(force=True, folder=tmp_path) is None
    torch.set_num_threads(before)
