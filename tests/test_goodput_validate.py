"""``plan --concurrency --validate``'s load test (:mod:`draftwise.server.validate`): it sends the
plan's workload (every turn of each unseen question, at the plan's token budget) to the server's
own worker in this process and records what it sent; it never runs a script of the current
folder (nothing in the package names one), and its options fail before any work."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from draftwise.errors import ConfigError
from draftwise.planner.plan_file import Candidate, Plan
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions

from .benchmark_scripts import load_benchmark

pytest.importorskip("fastapi")
from draftwise.server import validate  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "draftwise"
#: short questions (the tiny model's context is 512 positions): one seen by the plan, two not,
#: one of them with two turns (its second turn's history holds the first answer)
QUESTIONS = [Question(1, "qa", ("seen",)), Question(2, "qa", ("Count: one two three one two three",)),
             Question(3, "qa", ("Say a b c a b c", "Again, a b c"))]


def test_a_unit_is_every_turn_of_a_question_in_order():
    qs = [Question(1, "writing", ("w1a", "w1b")), Question(3, "qa", ("q3",)), Question(2, "writing", ("w2a", "w2b"))]
    units = validate.conversations(qs, 2)
    assert [[(p["question_id"], p["turn"], p["users"]) for p in u] for u in units] == [
        [(1, 1, ["w1a"]), (1, 2, ["w1a", "w1b"])], [(3, 1, ["q3"])]]


def test_the_units_are_questions_the_plan_did_not_trace():
    questions = read_questions(DEFAULT_QUESTIONS)
    seen = [q.question_id for q in questions[:30]]
    units = validate.unseen_units(seen, 20)
    assert len(units) == 20 and not {u[0]["question_id"] for u in units} & set(seen)
    assert any(len(u) == 2 for u in units)  # MT-bench questions bring both turns
    with pytest.raises(ConfigError, match="dev questions are not in the plan"):
        validate.unseen_units(seen, len(questions))


def test_the_token_budget_is_the_plan_s():
    assert validate.budget(128, None) == 128 == validate.budget(128, 128)
    with pytest.raises(ConfigError, match="up to 128 tokens a turn.*-n 64"):
        validate.budget(128, 64)


def test_units_a_phase():
    assert validate.phase_units([1, 2, 4], 2, None) == 8 and validate.phase_units([1, 4], 2, 0) == 0
    with pytest.raises(ConfigError, match="at least the largest N"):
        validate.phase_units([1, 4], 2, 3)


def test_the_workload_it_records_is_what_the_clients_sent():
    units = [[{"question_id": 1, "category": "writing", "turn": 1, "users": ["a"], "answers": [], "prompt_tokens": 30,
               "reference": [5, 6, 7]},
              {"question_id": 1, "category": "writing", "turn": 2, "users": ["a", "b"], "answers": ["x"],
               "prompt_tokens": 50, "reference": [8]}]]
    assert validate.workload(units) == [[
        {"question_id": 1, "category": "writing", "turn": 1, "prompt_tokens": 30, "new_tokens": 3},
        {"question_id": 1, "category": "writing", "turn": 2, "prompt_tokens": 50, "new_tokens": 1}]]


def _plan(model: Any, folder: Path) -> Plan:
    """A plan for ``model`` that routes every category to lookup at k = 2, saved in ``folder``."""
    c2 = Candidate("lookup", 2, speedup=1.3, mat=1.8, acceptance=0.8, effective_acceptance=0.8, breakeven=0.1,
                   interval=[1.2, 1.4])
    plan = Plan(model=model.name, fingerprint="f" * 16, dtype="float32", greedy=True, drafts=["lookup"], ks=[2],
                categories={"qa": [c2], "overall": [c2]}, recommended={"qa": ("lookup", 2), "overall": ("lookup", 2)},
                predicted={"qa": 1.3, "overall": 1.3}, routed_overall=1.3,
                prompts=[{"question_id": 1, "category": "qa", "prompt_tokens": 30, "new_tokens": 8}],
                config={"max_new_tokens": 8})
    folder.mkdir(parents=True, exist_ok=True)
    plan.save(folder / "plan.json")
    return plan


def test_the_load_test_runs_in_process_from_an_empty_folder(tiny, tmp_path, monkeypatch):
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    _plan(tiny, tmp_path / "plan")
    lines: list[str] = []
    raw = validate.measure_concurrency(tiny, tmp_path / "plan" / "plan.json", "1,2", out_dir=tmp_path / "load",
                                       requests_per_client=1, questions=QUESTIONS, status=lines.append)
    assert list(here.iterdir()) == []  # nothing read or written in the current folder
    assert sorted(p.name for p in (tmp_path / "load").iterdir()) == [
        "measured.json", "run.json", "server-b1.log", "server-b2.log"]
    assert json.loads((tmp_path / "load" / "measured.json").read_text()) == raw
    assert set(raw["measured"]) == set(raw["per_request"]) == {"1", "2"}
    assert all(v[p] > 0 for v in raw["measured"].values() for p in ("plain", "auto"))
    # the same 2 unseen questions (3 turns) at every N, both phases: 12 requests, all equal to decoding alone
    assert raw["units_per_phase"] == 2 and raw["requests_per_client"] == 1 and raw["max_tokens"] == 8
    assert raw["equal"] == [12, 12] and raw["errors"] == 0
    assert [[t["question_id"] for t in unit] for unit in raw["workload"]] == [[2], [3, 3]]
    assert all(0 < t["new_tokens"] <= 8 for unit in raw["workload"] for t in unit)
    records = json.loads((tmp_path / "load" / "run.json").read_text())["records"]
    assert {(r["n"], r["mode"], r["draft"]) for r in records} == {
        (n, mode, draft) for n in (1, 2) for mode, draft in (("none", "none"), ("auto", "lookup"))}
    seconds = [r for r in records if r["turn"] == 2]  # their history: the first turn's reference answer
    assert len(seconds) == 4 and all(r["equal"] for r in seconds)
    assert "draft=lookup@k=2 by=plan" in (tmp_path / "load" / "server-b2.log").read_text()
    assert [line.split(":")[0] for line in lines[1:]] == ["N=1 none", "N=1 auto", "N=2 none", "N=2 auto"]
    assert tiny.runtime.slots == 1  # the engine's slots are given back


def test_a_validation_script_in_the_current_folder_is_never_run(tiny, tmp_path, monkeypatch):
    """The whole ``--validate`` path after planning (prediction, load test, scoring) from a folder
    holding a ``benchmarks/goodput_validate.py`` that would leave a mark if it ran or were imported."""
    from draftwise.capacity import plan as capacity
    from draftwise.cost.batch_profile import machine_fingerprint
    from draftwise.cost.profile import Profile, model_fingerprint

    from .test_goodput import pass_profile

    here = tmp_path / "checkout"
    (here / "benchmarks").mkdir(parents=True)
    (here / "benchmarks" / "goodput_validate.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('RAN').write_text('ran')\nraise SystemExit(3)\n")
    monkeypatch.chdir(here)
    fp = model_fingerprint(tiny)
    bp = pass_profile(0.010, 0.004)
    bp.model, bp.fingerprint, bp.machine_fingerprint = tiny.name, fp, machine_fingerprint()
    profile = Profile(model=tiny.name, fingerprint=fp, dtype="float32", runtime="NativeRuntime",
                      forward={128: [0.01] * 9}, step={128: [0.0105] * 9}, drafts={"lookup": [1e-4] * 8})
    out = tmp_path / "out"
    plan = _plan(tiny, out)
    plan.fingerprint = fp
    result = capacity.run_concurrency(
        tiny, plan, "1,2", out_dir=out, profile=profile, batch_profile=bp, validate=True, requests_per_client=1,
        plan_path=out / "plan.json", measure=functools.partial(validate.measure_concurrency, questions=QUESTIONS))
    assert not (here / "benchmarks" / "RAN").exists()
    v = result["validation"]
    assert v["equal"] == [12, 12] and [(r["n"], r["phase"]) for r in v["rows"]] == [
        (1, "plain"), (1, "auto"), (2, "plain"), (2, "auto")]
    assert json.loads((out / "concurrency.json").read_text())["validation"]["rows"] == v["rows"]
    assert (out / "measured.json").is_file() and (out / "load" / "run.json").is_file()
    with pytest.raises(ConfigError, match="needs the load test: pass measure="):
        capacity.run_concurrency(tiny, plan, "1,2", out_dir=out, profile=profile, batch_profile=bp, validate=True,
                                 plan_path=out / "plan.json")
    # nothing in the package runs or imports a script of benchmarks/, or edits the import path
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "goodput_validate" not in text and "sys.path" not in text, path


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("work started before the options were checked")


def test_plan_refuses_a_bad_validation_option_before_any_work(tmp_path, monkeypatch):
    import draftwise.cli.plan as cli_plan
    import draftwise.server as server
    from draftwise.cli import app

    def run(*args: str) -> str:
        res = CliRunner().invoke(app, ["plan", *args, "--out", str(tmp_path / "o"), "--validate"])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        return " ".join(res.output.split())

    for name in ("_profile_for_plan", "make_plan", "_validate", "run_concurrency"):
        monkeypatch.setattr(cli_plan, name, _fail)
    # too few dev questions left outside the plan: refused before the model loads (there is none)
    assert "dev questions are not in the plan" in run("-m", str(tmp_path / "no-model"), "--per-category", "40",
                                                       "--concurrency", "1")
    # no server package: one line naming the extra, before the model loads
    monkeypatch.delattr(server, "validate", raising=False)
    monkeypatch.setitem(sys.modules, "draftwise.server.validate", None)
    assert "pip install 'draftwise[serve]'" in run("-m", str(tmp_path / "no-model"), "--concurrency", "1,2")


def test_the_policy_runs_summary_reads_the_goal_both_ways(tmp_path):
    """goodput_policy.py compares goodput with the best fixed k at each N (chosen in hindsight per N)
    and with the one k a static configuration would set for every N; --rescore adds the second
    to a finished run's result.json."""
    pytest.importorskip("httpx")
    policy = load_benchmark("goodput_policy")
    measured = {"1": {"plain": 10.0, "goodput": 15.0, "k=1": 12.0, "k=8": 15.0},
                "16": {"plain": 50.0, "goodput": 52.0, "k=1": 60.0, "k=8": 40.0}}
    one = policy.single_k(measured)
    # k=1: 1.2 and 1.2 over plain, geomean 1.2; k=8: 1.5 and 0.8, geomean 1.095
    assert one["k"] == "k=1" and one["geomean_vs_plain"] == pytest.approx(1.2)
    assert one["goodput_over"] == pytest.approx({"1": 1.25, "16": 52 / 60})
    result = {"measured": measured, "paired": {}, "equal": [4, 4], "config": {"rounds": 1},
              "goals": {"every_n_097": True, "n1_13": True, "beats_fixed_105": False}}
    (tmp_path / "result.json").write_text(json.dumps(result))
    assert policy.rescore(tmp_path) == 0
    again = json.loads((tmp_path / "result.json").read_text())
    assert again["goals"]["beats_single_105"] is True and again["goals"]["beats_fixed_105"] is False
    assert "One k for every N" in (tmp_path / "result.md").read_text()
    assert policy.single_k({"1": {"plain": 1.0, "goodput": 1.0}}) is None


def test_the_validation_serves_with_serve_s_defaults(tiny, monkeypatch):
    """The servers the validation measures run what `draftwise serve` runs by default: its prefill
    chunk, context and prefix cache (a validation of a server users do not run predicts nothing)."""
    import typer

    from draftwise.cli import app

    params = {p.name: p.default for p in typer.main.get_command(app).commands["serve"].params}
    from draftwise.server.speculation import Speculation

    speculation = Speculation(tiny, draft="lookup", k=2, plan=None)
    served = validate.Served(tiny, None, 2, k="4", max_tokens=8, capacity=None, speculation=speculation)
    try:
        assert served.settings.prefix_cache_mb == params["prefix_cache_mb"] > 0
        assert served.settings.prefill_chunk == params["prefill_chunk"]
        assert served.worker.prefix_cache is not None
    finally:
        served.worker.stop(timeout=5.0)
        served.thread.shutdown()
