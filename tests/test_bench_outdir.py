"""``draftwise bench``'s output folder: never written over by accident, ``--overwrite`` deletes
only what bench made, and ``--resume`` reuses an answer only when nothing that shaped it changed.
Bad input gets one line and exit status 2, before the model loads.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.bench import run_bench
from draftwise.bench.outdir import FINGERPRINT, prepare_out
from draftwise.cli import app
from draftwise.fsutil import MARKER
from draftwise.questions import Question

N = 4
QS = [Question(1, "writing", ("Write a haiku.", "Now make it rhyme.")), Question(2, "qa", ("Capital of France?",))]


class GenerateSpy:
    """Counts calls of draftwise.core.decode.generate."""

    def __init__(self, monkeypatch):
        import draftwise.core.decode as decode

        self.real = decode.generate
        self.calls = 0
        monkeypatch.setattr(decode, "generate", self)

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.real(*args, **kw)


def run(tiny, out, qs=QS, **kw):
    return run_bench(tiny, qs, **{"drafts": "lookup", "max_new_tokens": N, "out_dir": out, "progress": False,
                                  "warmup": False, **kw})


@pytest.fixture()
def done(tiny, tmp_path):
    """A finished run in tmp_path/out."""
    out = tmp_path / "out"
    run(tiny, out)
    return out


def test_a_folder_with_answers_is_refused_without_resume_or_overwrite(tiny, done):
    before = (done / "answers" / "lookup.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds bench answers; pass --resume .* --overwrite"):
        run(tiny, done)
    assert (done / "answers" / "lookup.jsonl").read_text() == before  # not truncated
    with pytest.raises(ConfigError, match="not both"):
        run(tiny, done, resume=True, overwrite=True)


def test_overwrite_replaces_a_folder_bench_made(tiny, done, monkeypatch):
    assert (done / MARKER).read_text().strip() == "bench"
    (done / "notes.txt").write_text("mine")
    run(tiny, done, drafts="self:exit=1", overwrite=True)
    assert not (done / "notes.txt").exists() and not (done / "answers" / "lookup.jsonl").exists()
    assert json.loads((done / "summary.json").read_text())["config"]["methods"] == ["none", "self:exit=1"]


def test_overwrite_never_deletes_a_folder_bench_did_not_make(tiny, tmp_path):
    mine = tmp_path / "project"
    (mine / "answers").mkdir(parents=True)
    (mine / "answers" / "notes.jsonl").write_text("{}\n")
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="refusing to delete"):
        run(tiny, mine, overwrite=True)
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_a_folder_of_other_things_is_written_beside_them(tiny, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "plan.json").write_text("{}")
    run(tiny, shared)
    assert (shared / "plan.json").read_text() == "{}" and (shared / "summary.json").is_file()
    assert not (shared / MARKER).exists()  # bench did not make it, so it does not claim it


def test_resume_reuses_answers_and_may_add_a_method(tiny, done, monkeypatch):
    first = json.loads((done / "summary.json").read_text())
    before = (done / "answers" / "lookup.jsonl").read_text()
    spy = GenerateSpy(monkeypatch)
    again = run(tiny, done, resume=True)
    assert spy.calls == 0 and again["run"]["answers_reused"] == 4
    assert again["groups"] == first["groups"]  # the recorded numbers, not new ones
    run(tiny, done, drafts="lookup,self:exit=1", resume=True)  # a new method runs; nothing else
    assert spy.calls == 3  # the 3 turns of self:exit=1
    assert (done / "answers" / "lookup.jsonl").read_text() == before
    stored = json.loads((done / FINGERPRINT).read_text())
    assert set(stored["methods"]) == {"none", "lookup", "self:exit=1"}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"k": 3}, r"method lookup: k 4 -> 3"),  # `lookup` takes the global k; lookup@k=4 keeps its own
        ({"seed": 7}, r"seed: None -> 7"),
        ({"max_new_tokens": N + 1}, r"max_new_tokens: 4 -> 5"),
        ({"dtype": "bfloat16"}, r"dtype: 'float32' -> 'bfloat16'"),
        ({"text": "Capital of Spain?"}, r"question 2: its text or category differs"),
        ({"category": "rag"}, r"question 2: its text or category differs"),
        ({"repeats": 2}, r"repeats: 1 -> 2"),
    ],
)
def test_resume_refuses_any_difference_and_names_it(tiny, tmp_path, change, match):
    from draftwise import load_model
    from draftwise.core.sampling import SamplingConfig

    out = tmp_path / "out"
    run(tiny, out, drafts="lookup,lookup@k=4")
    model = load_model(str(tiny.folder), dtype=change["dtype"]) if "dtype" in change else tiny
    qs = [QS[0], Question(2, change.get("category", "qa"), (change.get("text", QS[1].prompt),))]
    kw = {"drafts": "lookup,lookup@k=4", "k": change.get("k", 4), "max_new_tokens": change.get("max_new_tokens", N),
          "sampling": SamplingConfig(seed=change.get("seed")), "repeats": change.get("repeats", 1)}
    with pytest.raises(ConfigError, match=match):
        run(model, out, qs, resume=True, **kw)


def test_a_fingerprint_from_before_repeats_resumes_as_one_run_a_turn(tiny, done, monkeypatch):
    path = done / "fingerprint.json"
    stored = json.loads(path.read_text())
    assert stored["run"].pop("repeats") == 1
    path.write_text(json.dumps(stored))
    spy = GenerateSpy(monkeypatch)
    run(tiny, done, resume=True)
    assert spy.calls == 0  # every answer reused
    with pytest.raises(ConfigError, match=r"repeats: 1 -> 3"):
        run(tiny, done, resume=True, repeats=3)


def test_resume_knows_a_draft_by_its_canonical_spec(tiny, done, monkeypatch):
    spy = GenerateSpy(monkeypatch)
    summary = run(tiny, done, drafts="lookup:max=3,min=1", resume=True)  # the same draft as `lookup`
    assert spy.calls == 0 and summary["config"]["methods"] == ["none", "lookup"]


def test_resume_refuses_answers_of_another_plan(tiny, tmp_path):
    from draftwise.planner.plan import Plan

    def plan(pick):
        return Plan(model="tiny", fingerprint="f", dtype="float32", greedy=True, drafts=["lookup"], ks=[2],
                    categories={}, recommended={"overall": pick}, predicted={"overall": 1.0}, routed_overall=1.0)

    out = tmp_path / "out"
    run(tiny, out, drafts="auto", plan=plan(("lookup", 2)))
    run(tiny, out, drafts="auto", plan=plan(("lookup", 2)), resume=True)  # the same plan: fine
    with pytest.raises(ConfigError, match=r"method auto: plan"):
        run(tiny, out, drafts="auto", plan=plan(("lookup", 3)), resume=True)


def test_resume_of_a_folder_without_a_fingerprint_is_refused(tmp_path):
    (tmp_path / "answers").mkdir()
    (tmp_path / "answers" / "none.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=f"no {FINGERPRINT}"):
        prepare_out(tmp_path, resume=True)


def test_resume_after_a_line_cut_short_reruns_only_that_answer(tiny, tmp_path, monkeypatch):
    qs = [Question(2, "qa", ("Hi?",)), Question(3, "rag", ("Ho?",))]
    run(tiny, tmp_path, qs)
    path = tmp_path / "answers" / "lookup.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])  # killed while writing
    spy = GenerateSpy(monkeypatch)
    summary = run(tiny, tmp_path, qs, resume=True)
    assert spy.calls == 1 and summary["run"]["questions_finished"] == 2
    lines = path.read_text().splitlines()
    rows = [json.loads(line) for line in lines[:1] + lines[2:]]
    assert sorted(r["question_id"] for r in rows) == [2, 3]


# -- the CLI: one line, exit status 2, before the model loads ---------------------------------


def _cli(args, monkeypatch=None):
    if monkeypatch is not None:  # prove the model is never loaded
        import draftwise.cli.bench as cli_bench

        monkeypatch.setattr(cli_bench, "load_with_status", lambda *a, **k: pytest.fail("model loaded"))
    return CliRunner().invoke(app, ["bench", *args])


def _one_error_line(res, needle):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and needle in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) <= 2  # one message (maybe wrapped)


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\x00\x01\x02binary\xff", "not UTF-8"),
        (b'{"question_id": 1, "category": "qa", "turns": ["x"]}\n{oops\n', ":2 is not valid JSON"),
        (b'{"question_id": [1], "category": "qa", "turns": ["x"]}\n', "'question_id' must be"),
        (b'{"question_id": 1, "category": "qa", "turns": "x"}\n', "'turns' must be"),
    ],
)
def test_cli_bad_questions_file(tmp_path, monkeypatch, content, needle):
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    _one_error_line(_cli(["--questions", str(path), "--out", str(tmp_path / "o")], monkeypatch), needle)


@pytest.mark.parametrize(
    "drafts, needle",
    [("lookup,bogus", "unknown draft spec"), ("lookup:min=0", "min= takes"), ("[/x]", "unknown draft spec")],
)
def test_cli_bad_drafts(tmp_path, monkeypatch, drafts, needle):
    _one_error_line(_cli(["--drafts", drafts, "--out", str(tmp_path / "o")], monkeypatch), needle)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_cli_unwritable_out(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _one_error_line(_cli(["--out", str(locked / "run")], monkeypatch), "cannot write")
    finally:
        locked.chmod(0o700)


def test_cli_out_under_a_file(tmp_path, monkeypatch):
    (tmp_path / "file.txt").write_text("x")
    _one_error_line(_cli(["--out", str(tmp_path / "file.txt" / "run")], monkeypatch), "cannot write")
    _one_error_line(_cli(["--out", str(tmp_path / "file.txt")], monkeypatch), "is not a folder")


def test_cli_refuses_an_out_with_answers(done, monkeypatch):
    _one_error_line(_cli(["--out", str(done)], monkeypatch), "already holds bench answers")
