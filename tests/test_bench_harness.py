"""``draftwise bench``: answer files, summary schema, equality, resume, budget, errors, peers.

Everything runs on the tiny random Llama with the default model's chat template, a handful of
questions and ~8 new tokens, so the whole file stays fast.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.bench import harness
from draftwise.bench.harness import (
    GROUP_ORDER,
    Question,
    build_prompt,
    check_equality,
    read_questions,
    run_bench,
)
from draftwise.cli import app

N = 8
QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 3, "category": "summarization", "turns": ["Summarise: the cat sat on the mat. The cat sat."]},
]
ROW_KEYS = {"tokens_per_s", "speedup", "mat", "acceptance", "draft_time_share", "questions"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def qfile(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("q") / "questions.jsonl", QUESTIONS)


@pytest.fixture(scope="module")
def bench(tiny, qfile, tmp_path_factory):
    """One greedy run with lookup and self, shared by the schema tests."""
    out = tmp_path_factory.mktemp("bench")
    summary = run_bench(tiny, qfile, drafts="lookup,self", k=3, max_new_tokens=N, out_dir=out, progress=False)
    return summary, out


class GenerateSpy:
    """Wraps draftwise.decode.generate: records prompts; can raise after ``fail_after`` calls."""

    def __init__(self, monkeypatch, fail_after=None):
        import draftwise.decode as decode

        self.real = decode.generate
        self.calls: list[list[int]] = []
        self.fail_after = fail_after
        monkeypatch.setattr(decode, "generate", self)

    def __call__(self, model, prompt, **kw):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt
        self.calls.append(list(prompt))
        return self.real(model, prompt, **kw)


# -- files and schema ------------------------------------------------------------------------


def test_answer_files_follow_the_spec_bench_schema(bench):
    _, out = bench
    for method in ("none", "lookup", "self"):
        rows = [json.loads(line) for line in (out / "answers" / f"{method}.jsonl").read_text().splitlines()]
        assert [r["question_id"] for r in rows] == [1, 2, 3]
        for r in rows:
            assert {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"} <= r.keys()
            (choice,) = r["choices"]
            n_turns = 2 if r["question_id"] == 1 else 1
            for key in ("turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"):
                assert len(choice[key]) == n_turns, key
            assert all(0 < n <= N for n in choice["new_tokens"])
            # every pass commits its accept length; they add up to the new tokens (+ a final EOS)
            for lengths, steps, new in zip(choice["accept_lengths"], choice["decoding_steps"], choice["new_tokens"]):
                assert len(lengths) == steps and new <= sum(lengths) <= new + 1


def test_summary_has_the_documented_schema(bench):
    summary, out = bench
    assert json.loads((out / "summary.json").read_text())["groups"] == summary["groups"]
    assert {"groups", "equality", "config"} <= summary.keys()
    assert list(summary["groups"]) == ["mt_bench", "summarization", "qa", "overall"]
    assert set(summary["groups"]) <= set(GROUP_ORDER)
    for group, table in summary["groups"].items():
        assert list(table) == ["none", "lookup", "self"]
        for method, row in table.items():
            assert row.keys() == ROW_KEYS, (group, method)
    overall = summary["groups"]["overall"]
    assert overall["none"]["speedup"] == pytest.approx(1.0)
    assert overall["none"]["mat"] == pytest.approx(1.0) and overall["none"]["acceptance"] is None
    assert overall["self"]["mat"] >= 1.0 and 0 <= overall["self"]["acceptance"] <= 1
    assert overall["lookup"]["questions"] == 3
    pos = summary["acceptance_by_position"]["self"]
    assert len(pos["tested"]) == 3 and pos["tested"][0] >= pos["tested"][-1]
    assert summary["run"]["questions_finished"] == 3 and summary["run"]["stopped"] is None
    md = (out / "summary.md").read_text()
    assert "## overall" in md and "| lookup |" in md and "Command:" in md
    assert (out / "speedup.png").stat().st_size > 0
    assert (out / "acceptance_by_position.png").stat().st_size > 0


def test_greedy_drafts_equal_plain_decoding(bench):
    eq = bench[0]["equality"]
    assert eq["checked"] and eq["mismatches"] == []
    assert eq["methods"] == {"lookup": {"equal": 4, "total": 4}, "self": {"equal": 4, "total": 4}}


def test_second_turn_has_the_models_own_first_answer(tiny, tmp_path, monkeypatch):
    spy = GenerateSpy(monkeypatch)
    q = Question(1, "writing", tuple(QUESTIONS[0]["turns"]))
    run_bench(tiny, [q], drafts=(), max_new_tokens=N, out_dir=tmp_path, progress=False, warmup=False)
    first, second = spy.calls
    answer = json.loads((tmp_path / "answers" / "none.jsonl").read_text())["choices"][0]["turns"][0]
    assert second == build_prompt(tiny, q.turns, [answer])
    assert second[: len(first)] == first  # the conversation so far is a prefix
    text = tiny.tokenizer.decode(second)
    assert answer.strip() and answer.strip() in text and "Now make it rhyme." in text


def test_raw_text_prompt_without_chat_template(tiny, monkeypatch):
    monkeypatch.setattr(tiny.tokenizer, "chat_template", None)
    ids = build_prompt(tiny, ["Hi.", "More."], ["Hello."])
    assert tiny.tokenizer.decode(ids) .endswith("Hi.\n\nHello.\n\nMore.")


def test_an_equality_mismatch_reports_position_and_margin(tiny):
    q = Question(7, "qa", ("Hello?",))
    base = [5, 6, 7, 8]

    def answer(ids):
        return {"choices": [{"turns": ["x"], "token_ids": [ids]}]}

    answers = {"none": {"7": answer(base)}, "x": {"7": answer([5, 6, 9])}}
    eq = check_equality(tiny, answers, [q], ["none", "x"])
    (mm,) = eq["mismatches"]
    assert (mm["method"], mm["turn"], mm["position"], mm["baseline_token"], mm["method_token"]) == ("x", 0, 2, 7, 9)
    assert mm["margin"] >= 0
    assert eq["methods"]["x"] == {"equal": 0, "total": 1}


# -- resume, time budget, interruption -------------------------------------------------------


def test_resume_skips_answers_already_there(tiny, qfile, tmp_path, monkeypatch):
    first = run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N, limit_per_category=1,
                      out_dir=tmp_path, progress=False)
    before = (tmp_path / "answers" / "lookup.jsonl").read_text()
    spy = GenerateSpy(monkeypatch)
    again = run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N, limit_per_category=1,
                      out_dir=tmp_path, resume=True, progress=False)
    assert spy.calls == []
    assert again["groups"] == first["groups"]  # the recorded numbers, not new ones
    assert again["run"]["answers_reused"] == 6
    # a new method on the same folder runs only that method (plus its one warm-up call)
    run_bench(tiny, qfile, drafts="lookup,self", max_new_tokens=N, limit_per_category=1,
              out_dir=tmp_path, resume=True, progress=False)
    assert len(spy.calls) == 1 + 4  # warm-up + 4 turns of `self`
    assert (tmp_path / "answers" / "lookup.jsonl").read_text() == before
    with pytest.raises(ConfigError, match="max_new_tokens"):
        run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N + 1, out_dir=tmp_path, resume=True,
                  progress=False)


def test_resume_after_a_line_cut_short_reruns_only_that_answer(tiny, tmp_path, monkeypatch):
    qs = [Question(2, "qa", ("Hi?",)), Question(3, "rag", ("Ho?",))]
    run_bench(tiny, qs, drafts="lookup", max_new_tokens=4, out_dir=tmp_path, progress=False, warmup=False)
    path = tmp_path / "answers" / "lookup.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])  # killed while writing
    spy = GenerateSpy(monkeypatch)
    summary = run_bench(tiny, qs, drafts="lookup", max_new_tokens=4, out_dir=tmp_path, resume=True,
                        progress=False, warmup=False)
    assert len(spy.calls) == 1 and summary["run"]["questions_finished"] == 2
    rows = [json.loads(line) for line in path.read_text().splitlines()[:1] + path.read_text().splitlines()[2:]]
    assert sorted(r["question_id"] for r in rows) == [2, 3]


def test_time_budget_zero_stops_after_the_first_question(tiny, qfile, tmp_path):
    summary = run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N, out_dir=tmp_path,
                        time_budget=0, progress=False, warmup=False)
    assert summary["run"]["stopped"] == "time_budget"
    assert summary["run"]["questions_finished"] == 1 and summary["run"]["questions_total"] == 3
    assert len((tmp_path / "answers" / "none.jsonl").read_text().splitlines()) == 1
    assert "1 of 3 questions finished (stopped: time_budget)" in (tmp_path / "summary.md").read_text()


def test_ctrl_c_writes_the_summary_of_finished_questions(tiny, qfile, tmp_path, monkeypatch):
    # question 1 has 2 turns x 2 methods = 4 calls; stop in the middle of question 2
    GenerateSpy(monkeypatch, fail_after=5)
    with pytest.raises(KeyboardInterrupt):
        run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N, out_dir=tmp_path,
                  progress=False, warmup=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run"]["stopped"] == "interrupted"
    assert summary["run"]["questions_finished"] == 1
    lines = (tmp_path / "answers" / "none.jsonl").read_text().splitlines()
    lines += (tmp_path / "answers" / "lookup.jsonl").read_text().splitlines()
    assert len(lines) == 3  # both answers of question 1 and the one finished of question 2


# -- bad input -------------------------------------------------------------------------------


GOOD = json.dumps(QUESTIONS[1])


@pytest.mark.parametrize(
    "lines, match",
    [
        ([GOOD, "{not json"], r":2 is not valid JSON"),
        ([GOOD, json.dumps({"question_id": 9, "category": "qa"})], r":2: missing 'turns'"),
        ([GOOD, json.dumps({"question_id": 9, "turns": ["x"]})], r":2: missing 'category'"),
        ([json.dumps({"question_id": 9, "category": "poetry", "turns": ["x"]})], r":1: unknown category 'poetry'"),
        ([GOOD, json.dumps({"question_id": 9, "category": "qa", "turns": []})], r":2: 'turns' must be"),
        ([GOOD, "", GOOD], r":3: question_id 2 repeats line 1"),
        ([], r"is empty"),
    ],
)
def test_bad_question_files_name_the_line(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(ConfigError, match=match):
        read_questions(path)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"drafts": "lookup,bogus"}, "unknown draft spec 'bogus'"),
        ({"peers": ["vllm"]}, "unknown peer 'vllm'"),
        ({"k": 0}, "k=0"),
        ({"drafts": "lookup,lookup"}, "listed twice"),
        ({"drafts": "auto"}, "needs a plan"),
        ({"resume": True}, "needs out_dir"),
    ],
)
def test_bad_options_are_config_errors(tiny, qfile, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        run_bench(tiny, qfile, max_new_tokens=N, progress=False, warmup=False, **kwargs)


def test_cli_bad_file_exits_2_with_one_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n{oops\n")
    res = CliRunner().invoke(app, ["bench", "--questions", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert ":2 is not valid JSON" in res.output and "Traceback" not in res.output


def test_cli_runs_and_prints_the_tables(tiny_chat_folder, qfile, tmp_path, one_thread):
    res = CliRunner().invoke(app, [
        "bench", "--questions", str(qfile), "--model", str(tiny_chat_folder), "--drafts", "lookup",
        "-n", "4", "--limit-per-category", "1", "--out", str(tmp_path),
    ])
    assert res.exit_code == 0, res.output
    assert "## overall" in res.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["methods"] == ["none", "lookup"]


# -- plans, adaptive k, peers ----------------------------------------------------------------


def test_drafts_auto_follows_the_plan_per_category(tiny, qfile, tmp_path, monkeypatch):
    class Plan:
        def choose(self, category):
            return ("lookup", 2) if category == "summarization" else ("none", 0)  # as a real Plan says it

    module = types.ModuleType("draftwise.cost.plan")
    module.load_plan = lambda path: Plan()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "draftwise.cost.plan", module)
    (tmp_path / "plan.json").write_text("{}")
    summary = run_bench(tiny, qfile, drafts="auto", max_new_tokens=N, out_dir=tmp_path, progress=False)
    rows = {json.loads(line)["category"]: json.loads(line)
            for line in (tmp_path / "answers" / "auto.jsonl").read_text().splitlines()}
    assert rows["summarization"]["choices"][0]["stats"][0]["draft"] == "lookup"
    assert rows["summarization"]["choices"][0]["stats"][0]["k"] == 2
    assert rows["qa"]["choices"][0]["stats"][0]["draft"] == "none"
    assert summary["equality"]["methods"]["auto"] == {"equal": 4, "total": 4}


def test_k_auto_is_passed_through(tiny, qfile, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))  # the tiny model's profile
    summary = run_bench(tiny, qfile, drafts="lookup", k="auto", max_new_tokens=N,
                        limit_per_category=1, out_dir=tmp_path, progress=False)
    assert summary["config"]["k"] == "auto"
    assert summary["equality"]["methods"]["lookup"]["equal"] == 4


def test_hf_peers_run_interleaved_on_the_same_prompts(tiny, qfile, tmp_path):
    summary = run_bench(tiny, qfile, drafts="self:exit=1", k=3, max_new_tokens=6,
                        limit_per_category=1, peers=["hf"], out_dir=tmp_path, progress=False)
    overall = summary["groups"]["overall"]
    assert list(overall) == ["none", "self:exit=1", "hf", "hf-lookup", "hf-early-exit"]
    for name in ("hf", "hf-lookup", "hf-early-exit"):
        row = overall[name]
        assert row["tokens_per_s"] > 0 and row["speedup"] > 0
        assert row["mat"] is None and row["acceptance"] is None
        answers = (tmp_path / "answers" / f"{name}.jsonl").read_text().splitlines()
        assert len(answers) == 3
    hf_cfg = {m.name: m for m in harness.build_methods(tiny, "self:exit=1", 3, ["hf"])}
    assert hf_cfg["hf-early-exit"].hf_kwargs["assistant_early_exit"] == 1
    assert hf_cfg["hf-lookup"].hf_kwargs["prompt_lookup_num_tokens"] == 3
    assert "hf" in summary["equality"]["methods"]
    assert "not against `hf`" in (tmp_path / "summary.md").read_text()


def test_hf_assistant_uses_the_model_drafts_folder(tiny, tiny_chat_folder, tmp_path):
    q = Question(2, "qa", ("What is the capital of France?",))
    spec = f"model:{tiny_chat_folder}"
    summary = run_bench(tiny, [q], drafts=spec, k=2, max_new_tokens=4, peers=["hf"], out_dir=tmp_path,
                        progress=False)
    overall = summary["groups"]["overall"]
    assert list(overall) == ["none", spec, "hf", "hf-lookup", "hf-assistant", "hf-early-exit"]
    assert overall[spec]["acceptance"] == 1.0  # the draft is the target itself
    assert summary["equality"]["methods"]["hf-assistant"] == {"equal": 1, "total": 1}
    assert (tmp_path / "answers" / harness.method_filename(spec)).is_file()


def test_a_question_too_long_for_the_context_is_skipped(tiny, tmp_path):
    long = Question(5, "rag", (" ".join(["word"] * 600),))
    short = Question(6, "qa", ("Hi?",))
    summary = run_bench(tiny, [long, short], drafts="lookup", max_new_tokens=4, out_dir=tmp_path,
                        progress=False, warmup=False)
    assert summary["run"]["skipped"] == [{"question_id": 5, "reason": "context"}]
    assert summary["run"]["questions_finished"] == 1 and list(summary["groups"]) == ["qa", "overall"]
