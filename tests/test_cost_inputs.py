"""Bad input to ``profile``, ``plan`` and ``breakeven`` (one line, exit 2, before any measuring),
unwritable output places, atomic files, and canonical draft keys in profiles and plans."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import draftwise
from draftwise.cli import app
from draftwise.policy import adaptive
from draftwise.planner.plan import Plan, load_plan, make_plan
from draftwise.cost.profile import SCHEMA, Profile, model_fingerprint
from draftwise.errors import ConfigError
from draftwise.questions import Question

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
GOOD = {
    "schema": SCHEMA, "model": "m", "fingerprint": "0" * 16, "dtype": "float32", "runtime": "NativeRuntime",
    "forward": {"64": [0.01, 0.011, 0.012]}, "step": {"64": [0.011, 0.012, 0.013]},
    "drafts": {"lookup": [1e-5, 2e-5]},
}

# (file content, what the one-line error says)
BAD_PROFILES = [
    (PNG, "not UTF-8"),
    (b"\x00\x01garbage", "is not JSON"),
    (b"", "is not JSON"),
    (b"[1, 2, 3]", "a JSON list, not an object"),
    (b'"a profile"', "a JSON str, not an object"),
    (json.dumps({"schema": "other"}).encode(), "not a draftwise profile (schema 'other'"),
    (json.dumps({"schema": SCHEMA}).encode(), "is incomplete: it has no 'forward' field"),
    (json.dumps({**GOOD, "forward": [0.01, 0.02]}).encode(), "'forward' must map context lengths"),
    (json.dumps({**GOOD, "step": {"64": "fast"}}).encode(), "step[64] must be a non-empty list"),
    (json.dumps({**GOOD, "step": {"64": [0.01, -1, 0.02]}}).encode(), "negative or non-finite"),
    (json.dumps({**GOOD, "step": {"64": [0.01]}}).encode(), "same contexts and the same n"),
    (json.dumps({**GOOD, "drafts": {"lookup": []}}).encode(), "drafts['lookup'] must be a non-empty list"),
    (json.dumps({**GOOD, "drafts": {"beam": [0.1]}}).encode(), "unknown draft spec 'beam'"),
    (json.dumps({**GOOD, "drafts": ["lookup"]}).encode(), "'drafts' must map draft specs"),
    (json.dumps({**GOOD, "model": 7}).encode(), "'model' must be a string"),
]


def one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output and result.output.strip().count("\n") == 0, result.output


@pytest.mark.parametrize("content, needle", BAD_PROFILES)
def test_bad_profile_file_is_one_line_for_breakeven_and_plan(tmp_path, content, needle):
    bad = tmp_path / "profile.json"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match="profile"):
        Profile.load(bad)
    one_line_error(CliRunner().invoke(app, ["breakeven", "--profile", str(bad)]), needle)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    # the profile is read before the model: a model that does not exist is never reached
    r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--profile", str(bad),
                                 "--model", str(tmp_path / "no-such-model")])
    one_line_error(r, needle)


@pytest.mark.parametrize(
    "content, needle",
    [
        (PNG, "not UTF-8"),
        (b"hello\x00world\n", "looks binary"),
        (b'{"question_id": 1, "category": "code", "turns": "write a sort"}\n', "'turns' must be a non-empty list"),
        (b'{"question_id": 1, "category": 5, "turns": ["x"]}\n', "'category' must be a non-empty string"),
        (b'[1, 2]\n', "p.jsonl:1"),
        (b'{"question_id": 1, "category": "a", "turns": ["x"]}\n{oops\n', "p.jsonl:2 is not valid JSON"),
        (b"\n\n", "empty"),
    ],
)
def test_bad_prompt_file_is_one_line_for_plan(tmp_path, content, needle):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tmp_path / "no-such-model")])
    one_line_error(r, needle)


def test_unwritable_outputs_fail_before_the_model_loads(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    nowhere = str(tmp_path / "no-such-model")  # reaching the model would be a different error
    runner = CliRunner()
    cases = [
        (["profile", "--model", nowhere, "--out", str(a_file / "p.json")], "cannot write to the folder of --out"),
        (["profile", "--model", nowhere, "--out", str(tmp_path)], "is a folder"),
        (["profile", "--model", nowhere, "--plot", str(a_file / "t.png")], "cannot write to the folder of --plot"),
        (["profile", "--model", nowhere, "--draft", "lookup,beam"], "unknown draft spec 'beam'"),
        (["plan", "--prompts", str(prompts), "--model", nowhere, "--out", str(a_file)], "is a file"),
        (["plan", "--prompts", str(prompts), "--model", nowhere, "--out", str(a_file / "sub")],
         "cannot write to the --out folder"),
        (["breakeven", "--plot", str(a_file / "s.png")], "cannot write to the folder of --plot"),
        (["breakeven", "--plot", str(tmp_path)], "is a folder"),
    ]
    for args, needle in cases:
        one_line_error(runner.invoke(app, args), needle)


def _explode(*args, **kwargs):
    raise AssertionError("measured although the cache cannot be written")


def test_k_auto_with_an_unwritable_cache_fails_before_measuring(tiny, tmp_path, monkeypatch):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    monkeypatch.setenv("DRAFTWISE_CACHE", str(a_file))  # a cache folder that cannot be made
    monkeypatch.setattr(adaptive, "measure_profile", _explode)
    with pytest.raises(ConfigError, match="cannot write to the profile cache folder .*DRAFTWISE_CACHE"):
        draftwise.generate(tiny, "hello", draft="lookup", k="auto", max_new_tokens=4)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes to read-only folders")
def test_k_auto_with_a_read_only_cache_fails_before_measuring(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "profiles").mkdir(parents=True)
    os.chmod(cache / "profiles", 0o500)
    monkeypatch.setenv("DRAFTWISE_CACHE", str(cache))
    monkeypatch.setattr(adaptive, "measure_profile", _explode)
    try:
        with pytest.raises(ConfigError, match="cannot write"):
            draftwise.generate(tiny, "hello", draft="lookup", k="auto", max_new_tokens=4)
    finally:
        os.chmod(cache / "profiles", 0o700)


def test_a_complete_cached_profile_needs_no_writable_cache(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    prof = Profile(model=tiny.name, fingerprint=model_fingerprint(tiny), dtype="float32", runtime="NativeRuntime",
                   forward={64: [0.01] * 9}, step={64: [0.01] * 9}, drafts={"lookup": [1e-5] * 8})
    prof.save(adaptive.default_profile_path(tiny, "auto"))  # the kind --k auto reads and writes
    monkeypatch.setattr(adaptive, "measure_profile", _explode)

    def unwritable(*args, **kwargs):
        raise ConfigError("cannot write")

    monkeypatch.setattr(adaptive, "check_writable", unwritable)
    assert adaptive.resolve_profile(tiny, "lookup:min=1").drafts == prof.drafts
    with pytest.raises(ConfigError, match="cannot write"):  # a missing draft must be measured
        adaptive.resolve_profile(tiny, "self")


def test_old_profile_keys_load_as_canonical_specs(tmp_path):
    data = {**GOOD, "drafts": {"lookup:min=1": [1e-5, 2e-5], "self": [0.004, 0.008], "model:default": [0.002, 0.004]}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    prof = Profile.load(path)
    assert set(prof.drafts) == {"lookup", "self", "model:default"}
    assert prof.draft_time("lookup:max=3,min=1", 2) == prof.draft_time("lookup", 2) == 2e-5
    assert prof.has_draft("lookup:min=1") and prof.has_draft("none") and not prof.has_draft("lookup:max=4")
    with pytest.raises(ConfigError, match="no costs for draft 'lookup:max=4'"):
        prof.draft_time("lookup:max=4", 1)


def test_profile_and_plan_are_written_atomically(tiny, tmp_path):
    prof = Profile.from_dict(GOOD)
    path = tmp_path / "p.json"
    path.write_text("old")
    prof.save(path)
    assert Profile.load(path).to_dict() == prof.to_dict()
    prof = Profile(model=tiny.name, fingerprint=model_fingerprint(tiny), dtype="float32", runtime="NativeRuntime",
                   forward={64: [0.01] * 5}, step={64: [0.01 * (1 + 0.05 * n) for n in range(5)]},
                   drafts={"lookup": [1e-5] * 4})
    plan = make_plan(tiny, [Question(1, "code", ("a b a b a b",))], prof, drafts=["lookup"], ks=[2], max_new_tokens=8)
    plan.save(tmp_path / "plan.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "plan.json"]  # no temp file left behind


@pytest.mark.parametrize(
    "content, needle",
    [(PNG, "not UTF-8"), (b"{", "is not JSON"), (b"[]", "a JSON list"), (b'{"schema": "draftwise.plan/1"}', "is incomplete: it has no")],
)
def test_bad_plan_files(tmp_path, content, needle):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle):
        load_plan(tmp_path)


def test_plan_draft_names_load_canonical(tiny, tmp_path):
    prof = Profile(model=tiny.name, fingerprint=model_fingerprint(tiny), dtype="float32", runtime="NativeRuntime",
                   forward={64: [0.01] * 5}, step={64: [0.01] * 5}, drafts={"lookup": [1e-5] * 4})
    plan = make_plan(tiny, [Question(1, "copy", ("x y x y x y x y",))], prof, drafts=["lookup"], ks=[2],
                     max_new_tokens=8)
    data = plan.to_dict()
    data["drafts"] = ["lookup:max=3,min=1"]
    for cands in data["categories"].values():
        for c in cands:
            c["draft"] = "lookup:min=1"
    back = Plan.from_dict(json.loads(json.dumps(data)))
    assert back.drafts == ["lookup"] and {c.draft for c in back.categories["overall"]} == {"lookup"}
    assert Path(plan.save(tmp_path / "x" / "plan.json")).is_file()


class FakeClock:
    """A ``time.perf_counter`` that moves only when told: a test charges each pass or token a
    chosen cost, so what the loop clocks, and what it leaves out, is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charging(self, seconds: float, fn):
        def charged(*args, **kwargs):
            self.now += seconds
            return fn(*args, **kwargs)

        return charged


def test_token_overhead_counts_only_time_outside_the_steps(tiny, monkeypatch):
    """On a fake clock: 20 ms per pass (a slow or noisy machine) is step time, not per-token
    overhead; 5 ms per streamed token outside the loop's clocks is exactly 5 ms of overhead."""
    import time

    from draftwise.cost import measure
    from draftwise.core.text import TextAssembler

    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(tiny.runtime, "forward", clock.charging(0.02, tiny.runtime.forward))
    monkeypatch.setattr(tiny.runtime, "prefill", clock.charging(0.02, tiny.runtime.prefill))
    assert measure._token_overhead(tiny, 16) == pytest.approx(0.0, abs=1e-12)
    assert clock.now > 0.02 * 2  # the passes were charged (so the clocks did read this clock)
    monkeypatch.setattr(TextAssembler, "push", clock.charging(0.005, TextAssembler.push))
    assert measure._token_overhead(tiny, 16) == pytest.approx(0.005, rel=1e-9)


@pytest.mark.parametrize(
    ("seconds", "clocked", "new_tokens", "want"),
    [
        (1.0, 0.6, 32, 0.4 / 32),  # the wall time the loop did not clock, per token
        (1.0, 1.2, 32, 0.0),  # the steps clocked more than the whole run: no negative overhead
        (0.5, 0.1, 0, 0.4),  # no token committed: the whole remainder, not a division by zero
    ],
)
def test_token_overhead_arithmetic(monkeypatch, seconds, clocked, new_tokens, want):
    from types import SimpleNamespace

    from draftwise.cost import measure

    def fake_generate(model, prompt, *, max_new_tokens):
        stats = SimpleNamespace(verify_seconds=clocked * 0.75, draft_seconds=clocked * 0.25)
        return SimpleNamespace(seconds=seconds, stats=stats, new_tokens=new_tokens)

    monkeypatch.setattr(measure, "generate", fake_generate)
    assert measure._token_overhead(object(), 16) == pytest.approx(want)


def test_the_machine_fingerprint_tells_cpu_features_apart(monkeypatch):
    from draftwise.cost import profile as profile_mod

    here = profile_mod.machine_fingerprint()
    assert here == profile_mod.machine_fingerprint() and len(here) == 16
    monkeypatch.setattr(profile_mod, "cpu_flags", lambda: ["avx2", "fma"])
    avx2 = profile_mod.machine_fingerprint()
    monkeypatch.setattr(profile_mod, "cpu_flags", lambda: ["avx2", "fma", "avx512f"])
    assert profile_mod.machine_fingerprint() != avx2  # same model name, another kernel set


def test_the_machine_fingerprint_tells_the_attention_paths_apart(monkeypatch):
    from draftwise.cost import profile as profile_mod
    from draftwise.runtime import kernels

    monkeypatch.setattr(kernels, "signature", lambda: "kernel-0123456789ab")
    compiled = profile_mod.machine_fingerprint()
    monkeypatch.setattr(kernels, "signature", lambda: "torch")
    assert profile_mod.machine_fingerprint() != compiled  # a profile timed on the torch path is stale


def test_the_model_fingerprint_ignores_who_wrote_the_config(tmp_path):
    import json
    from types import SimpleNamespace

    folder = tmp_path / "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f"
    folder.mkdir()
    model = SimpleNamespace(folder=folder)
    config = {"hidden_size": 576, "num_hidden_layers": 30, "transformers_version": "4.57.0"}
    (folder / "config.json").write_text(json.dumps(config))
    before = model_fingerprint(model)
    (folder / "config.json").write_text(json.dumps({**config, "transformers_version": "5.25.0"}, indent=2))
    assert model_fingerprint(model) == before  # converted again under another release: the same model
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 29}))
    assert model_fingerprint(model) != before


def test_a_profile_from_another_machine_is_refused_and_a_cached_one_measured_again(tiny, tmp_path, monkeypatch):
    from draftwise.cost import profile as profile_mod

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    common = dict(model=tiny.name, fingerprint=model_fingerprint(tiny), dtype="float32", runtime="NativeRuntime",
                  forward={64: [0.01] * 9}, step={64: [0.01] * 9}, drafts={"lookup": [1e-5] * 8})
    elsewhere = Profile(**common, machine={"cpu": "other", "fingerprint": "0" * 16})
    with pytest.raises(ConfigError, match="measured on another machine .*other"):
        elsewhere.check_model(tiny)
    elsewhere.check_model(tiny, machine=False)
    Profile(**common).check_model(tiny)  # written before the fingerprint was recorded: taken as this machine's
    Profile(**common, machine={"fingerprint": profile_mod.machine_fingerprint()}).check_model(tiny)

    elsewhere.save(adaptive.default_profile_path(tiny, "auto"))
    measured = []
    monkeypatch.setattr(adaptive, "measure_profile",
                        lambda *a, **k: measured.append(1) or Profile(**common))
    adaptive.resolve_profile(tiny, "lookup")
    assert measured == [1]  # the other machine's costs were not used


def test_a_head_draft_measured_in_another_weight_format_is_measured_again(tiny, tmp_path, monkeypatch):
    """A cached ``--k auto`` profile whose head draft was timed in float32 (before heads drafted
    in int8, or on a CPU without the int8 kernel) is stale; its copy drafts are not."""
    from draftwise.cost import profile as profile_mod
    from draftwise.drafters import factory

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(factory, "default_head_weights", lambda device="cpu": "int8")
    common = dict(model=tiny.name, fingerprint=model_fingerprint(tiny), dtype="float32", runtime="NativeRuntime",
                  forward={64: [0.01] * 9}, step={64: [0.01] * 9})
    old = Profile(**common, drafts={"lookup": [1e-5] * 8, "eagle:default": [0.004] * 8,
                                    "suffix+eagle:default": [0.005] * 8})  # no variants recorded
    assert old.stale_drafts(["lookup", "suffix", "eagle:default", "suffix+eagle:default"]) == [
        "eagle:default", "suffix+eagle:default"]
    path = profile_mod.default_profile_path(tiny, "auto")
    old.save(path)
    assert Profile.load(path).draft_variants == {}
    measured = []
    fresh = Profile(**common, drafts={"lookup": [1e-5] * 8, "eagle:default": [0.003] * 8},
                    draft_variants={"lookup": "", "eagle:default": "head int8"})
    monkeypatch.setattr(adaptive, "measure_profile", lambda *a, **k: measured.append(k["drafts"]) or fresh)
    assert adaptive.resolve_profile(tiny, "lookup") is not None and measured == []  # lookup's cost stands
    got = adaptive.resolve_profile(tiny, "eagle:default")
    assert measured == [["eagle:default", "lookup", "suffix+eagle:default"]]
    assert got.draft_time("eagle:default", 1) == 0.003
    again = Profile.load(path)  # the fresh costs and their variants, cached
    assert again.draft_variants == {"lookup": "", "eagle:default": "head int8"} and not again.stale_drafts(["eagle:default"])
    adaptive.resolve_profile(tiny, "eagle:default")
    assert len(measured) == 1
    monkeypatch.setattr(factory, "default_head_weights", lambda device="cpu": "float32")  # another CPU
    assert again.stale_drafts(["eagle:default", "lookup"]) == ["eagle:default"]
    monkeypatch.setattr(factory, "default_head_weights", lambda device="cpu": "int8")
    # a hybrid timed when its spec meant fill=1 (recorded as "head int8") is stale now that it means fill=3
    hybrid = Profile(**common, drafts={"suffix+eagle:default": [0.004] * 8, "suffix+eagle:default,fill=1": [0.004] * 8},
                     draft_variants={"suffix+eagle:default": "head int8", "suffix+eagle:default,fill=1": "head int8 fill 1"})
    assert hybrid.stale_drafts(["suffix+eagle:default", "suffix+eagle:default,fill=1"]) == ["suffix+eagle:default"]


def test_draft_variants_are_checked_when_read(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**GOOD, "draft_variants": {"lookup": 3}}))
    with pytest.raises(ConfigError, match="draft_variants"):
        Profile.load(path)
