"""``draftwise bench``: answer files, summary schema, equality, budget, workloads, plans, peers.

Everything runs on the tiny random Llama with the default model's chat template, a handful of
questions and ~8 new tokens, so the whole file stays fast. The output folder and ``--resume``
are in test_bench_outdir.py.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError
from draftwise.bench import render_markdown, run_bench
from draftwise.bench.answers import read_answers
from draftwise.bench.equality import check_equality
from draftwise.bench.hf_peer import hf_methods
from draftwise.bench.methods import method_filename, parse_methods
from draftwise.bench.runner import build_methods, build_prompt
from draftwise.cli import app
from draftwise.planner.plan import Plan
from draftwise.questions import Question
from draftwise.core.sampling import SamplingConfig

from .images import is_complete_png

N = 8
QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 3, "category": "summarization", "turns": ["Summarise: the cat sat on the mat. The cat sat."]},
]
ROW_KEYS = {"tokens_per_s", "speedup", "speedup_total_time", "new_tokens", "wall_s", "mat", "acceptance",
            "draft_time_share", "questions"}


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
    """Wraps draftwise.core.decode.generate: records prompts; can raise after ``fail_after`` calls."""

    def __init__(self, monkeypatch, fail_after=None):
        import draftwise.core.decode as decode

        self.real = decode.generate
        self.calls: list[list[int]] = []
        self.fail_after = fail_after
        monkeypatch.setattr(decode, "generate", self)

    def __call__(self, model, prompt, **kw):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt
        self.calls.append(list(prompt))
        return self.real(model, prompt, **kw)


def make_plan(recommended):
    """A real Plan whose only content that matters here is its recommendations."""
    return Plan(
        model="tiny", fingerprint="f", dtype="float32", greedy=True, drafts=["lookup"], ks=[2], categories={},
        recommended=recommended, predicted={c: 1.0 for c in recommended}, routed_overall=1.0,
    )


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
    assert md == render_markdown(summary)
    assert "## overall" in md and "| lookup |" in md and "Command:" in md
    assert is_complete_png(out / "speedup.png")
    assert is_complete_png(out / "acceptance_by_position.png")
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary file behind


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


def test_an_equality_mismatch_reports_position_and_margin(tiny):
    q = Question(7, "qa", ("Hello?",))

    def answer(ids):
        return {"choices": [{"turns": ["x"], "token_ids": [ids]}]}

    answers = {"none": {"7": answer([5, 6, 7, 8])}, "x": {"7": answer([5, 6, 9])}}
    eq = check_equality(tiny, answers, [q], ["none", "x"])
    (mm,) = eq["mismatches"]
    assert (mm["method"], mm["turn"], mm["position"], mm["baseline_token"], mm["method_token"]) == ("x", 0, 2, 7, 9)
    # the margin is the target's own top-1 minus top-2 logit after the common prefix
    logits = tiny.runtime.prefill(build_prompt(tiny, ["Hello?"], []) + [5, 6]).float()
    top = logits.topk(2).values
    assert mm["margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-4) and mm["margin"] > 0
    assert eq["methods"]["x"] == {"equal": 0, "total": 1}


# -- time budget, interruption ---------------------------------------------------------------


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
        run_bench(tiny, qfile, drafts="lookup", max_new_tokens=N, out_dir=tmp_path, progress=False, warmup=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run"]["stopped"] == "interrupted"
    assert summary["run"]["questions_finished"] == 1
    lines = (tmp_path / "answers" / "none.jsonl").read_text().splitlines()
    lines += (tmp_path / "answers" / "lookup.jsonl").read_text().splitlines()
    assert len(lines) == 2  # both answers of question 1; question 2's methods run turn by turn, so none finished


# -- methods and bad options -----------------------------------------------------------------


def test_method_names_are_canonical_draft_specs():
    parsed = parse_methods("none, lookup:min=2,max=4, self:skip=3,1-2@k=2, auto", 4)
    assert [(name, str(spec), k) for name, spec, k in parsed] == [
        ("lookup:max=4,min=2", "lookup:max=4,min=2", 4),
        ("self:skip=1-3@k=2", "self:skip=1-3", 2),
        ("auto", "auto", 4),
    ]
    assert [n for n, _, _ in parse_methods([("lookup", "8"), ("auto", 2)], 4)] == ["lookup@k=8", "auto@k=2"]
    with pytest.raises(ConfigError, match="listed twice"):
        parse_methods("lookup:min=1,lookup", 4)  # one draft, two spellings


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"drafts": "lookup,bogus"}, "unknown draft spec 'bogus'"),
        ({"drafts": "lookup:min=3,max=2"}, "1 <= min <= max"),
        ({"peers": ["vllm"]}, "unknown peer 'vllm'"),
        ({"k": 0}, "k=0"),
        ({"drafts": "auto"}, "needs a plan"),
        ({"resume": True}, "need out_dir"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"repeats": 0}, "repeats=0 must be an integer >= 1"),
        ({"repeats": 2, "sampling": SamplingConfig(temperature=0.7)}, "needs a seed"),
    ],
)
def test_bad_options_are_config_errors(tiny, qfile, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        run_bench(tiny, qfile, **{"max_new_tokens": N, "progress": False, "warmup": False, **kwargs})


# -- your workload ---------------------------------------------------------------------------


def test_any_category_is_its_own_group(tiny, tmp_path):
    qs = [Question("a", "code", ("def add(a, b):",)), Question("b", "qa", ("Hi?",)),
          Question("c", "code", ("def sub(a, b):",))]
    summary = run_bench(tiny, qs, drafts="lookup", max_new_tokens=4, out_dir=tmp_path, progress=False, warmup=False)
    assert list(summary["groups"]) == ["qa", "code", "overall"]
    assert summary["groups"]["code"]["lookup"]["questions"] == 2
    assert "## code" in (tmp_path / "summary.md").read_text()
    assert is_complete_png(tmp_path / "speedup.png")


def test_drafts_auto_follows_the_plan_and_its_overall_pick_for_unseen_categories(tiny, qfile, tmp_path):
    # the plan and the bench share one folder, as `draftwise plan --out DIR` then `bench --out DIR`
    make_plan({"summarization": ("lookup", 2), "qa": ("none", 0), "overall": ("lookup:max=2", 3)}).save(
        tmp_path / "plan.json"
    )
    code = Question(9, "code", ("def f(x): return x",))
    qs = [Question(q["question_id"], q["category"], tuple(q["turns"])) for q in QUESTIONS[1:]] + [code]
    summary = run_bench(tiny, qs, drafts="auto", max_new_tokens=N, out_dir=tmp_path, progress=False)
    rows = {json.loads(line)["category"]: json.loads(line)["choices"][0]["stats"][0]
            for line in (tmp_path / "answers" / "auto.jsonl").read_text().splitlines()}
    assert (rows["summarization"]["draft"], rows["summarization"]["k"]) == ("lookup", 2)
    assert rows["summarization"]["plan_choice_for"] == "summarization"
    assert (rows["qa"]["draft"], rows["qa"]["k"]) == ("none", 0)  # the plan says: don't speculate
    assert (rows["code"]["draft"], rows["code"]["k"], rows["code"]["plan_choice_for"]) == ("lookup:max=2", 3, "overall")
    assert summary["equality"]["methods"]["auto"] == {"equal": 3, "total": 3}


def test_cli_runs_a_text_prompt_file_with_canonical_lookup_options(tiny_chat_folder, tmp_path, one_thread):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\n\nCount to three.\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [
        "bench", "--questions", str(prompts), "--model", str(tiny_chat_folder),
        "--drafts", "lookup:min=2,max=4", "-n", "4", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    assert "## prompts" in res.stdout and "| lookup:max=4,min=2 |" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["methods"] == ["none", "lookup:max=4,min=2"]
    assert summary["groups"]["prompts"]["none"]["questions"] == 2


# -- adaptive k, peers, context --------------------------------------------------------------


def test_k_auto_is_passed_through(tiny, qfile, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))  # the tiny model's profile
    summary = run_bench(tiny, qfile, drafts="lookup", k="auto", max_new_tokens=N,
                        limit_per_category=1, out_dir=tmp_path / "out", progress=False)
    assert summary["config"]["k"] == "auto"
    assert summary["equality"]["methods"]["lookup"]["equal"] == 4
    rows = [json.loads(line) for line in (tmp_path / "out" / "answers" / "lookup.jsonl").read_text().splitlines()]
    assert {s["k"] for r in rows for s in r["choices"][0]["stats"]} == {"auto"}


def test_hf_peers_run_interleaved_on_the_same_prompts(tiny, qfile, tmp_path):
    summary = run_bench(tiny, qfile, drafts="self:exit=1", k=3, max_new_tokens=6,
                        limit_per_category=1, peers=["hf"], out_dir=tmp_path, progress=False)
    overall = summary["groups"]["overall"]
    assert list(overall) == ["none", "self:exit=1", "hf", "hf-lookup", "hf-early-exit"]
    for name in ("hf", "hf-lookup", "hf-early-exit"):
        row = overall[name]
        lines = (tmp_path / "answers" / f"{name}.jsonl").read_text().splitlines()
        answers = [json.loads(line)["choices"][0] for line in lines]
        assert len(answers) == 3
        # Spec-Bench's rate: the mean over questions of new tokens / wall time; speedup: over plain's
        rate = sum(sum(a["new_tokens"]) / sum(a["wall_time"]) for a in answers) / 3
        assert row["tokens_per_s"] == pytest.approx(rate)
        assert row["speedup"] == pytest.approx(rate / overall["none"]["tokens_per_s"])
        assert row["mat"] is None and row["acceptance"] is None
    peers = {m.name: m for m in hf_methods(tiny, build_methods(tiny, "self:exit=1", 3, ()), 3)}
    assert peers["hf-early-exit"].hf_kwargs["assistant_early_exit"] == 1
    assert peers["hf-lookup"].hf_kwargs["prompt_lookup_num_tokens"] == 3
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
    assert (tmp_path / "answers" / method_filename(spec)).is_file()


def test_a_question_too_long_for_the_context_is_skipped(tiny, tmp_path):
    long = Question(5, "rag", (" ".join(["word"] * 600),))
    short = Question(6, "qa", ("Hi?",))
    summary = run_bench(tiny, [long, short], drafts="lookup", max_new_tokens=4, out_dir=tmp_path,
                        progress=False, warmup=False)
    assert summary["run"]["skipped"] == [{"question_id": 5, "reason": "context"}]
    assert summary["run"]["questions_finished"] == 1 and list(summary["groups"]) == ["qa", "overall"]


def test_repeats_keep_the_fastest_run_and_only_its_answer_teaches_the_draft(tiny, qfile, tmp_path, monkeypatch):
    """Each turn runs 3 times, the methods alternating run by run: the fastest is kept, and all 3
    decode the same steps, because a draft that learns across generations (suffix's cache) learns
    from none of them, only from the kept answer, once, after the runs."""
    import draftwise.bench.runner as runner_module

    real, calls = runner_module.api.generate, []
    real_teach, taught = runner_module.teach, []

    def spy(*args, **kw):
        res = real(*args, **kw)
        method = "none" if kw["draft"] is None else "suffix"
        calls.append((method, kw["learn"], res.stats.accepted, res.stats.target_passes, list(res.token_ids)))
        return res

    def teach_spy(drafter, prompt_ids, answer, sampling):
        taught.append((len(calls), list(answer)))
        real_teach(drafter, prompt_ids, answer, sampling)

    one = run_bench(tiny, qfile, drafts="suffix", k=3, max_new_tokens=N, out_dir=tmp_path / "one", progress=False,
                    warmup=False)
    assert "noise" not in one  # one run a turn: nothing to redraw
    monkeypatch.setattr(runner_module.api, "generate", spy)
    monkeypatch.setattr(runner_module, "teach", teach_spy)
    three = run_bench(tiny, qfile, drafts="suffix", k=3, max_new_tokens=N, out_dir=tmp_path / "three",
                      progress=False, warmup=False, repeats=3)
    assert len(calls) == 3 * 4 * 2  # 4 turns, 2 methods (none and suffix), 3 runs each
    assert not any(learn for _, learn, *_ in calls), "a timed run taught the draft"
    assert [at for at, _ in taught] == [6, 12, 18, 24], "suffix learns once a turn, after its runs"
    for i in range(0, len(calls), 6):  # one turn: 3 rounds of both methods
        turn = calls[i:i + 6]
        rounds = [turn[j:j + 2] for j in range(0, 6, 2)]
        assert all({c[0] for c in r} == {"none", "suffix"} for r in rounds), "a round left a method out"
        assert [r[0][0] for r in rounds][:2] in (["none", "suffix"], ["suffix", "none"]), "the order did not rotate"
        runs = [c[2:] for c in turn if c[0] == "suffix"]
        assert all(r == runs[0] for r in runs), "a later run decoded other steps: it learned from an earlier"
        assert taught[i // 6][1] == runs[0][2], "the draft learned another answer than the turn's"
    assert three["config"]["repeats"] == 3 and three["equality"]["mismatches"] == []
    for name in ("none", "suffix"):
        for key, rec in read_answers(tmp_path / "three" / "answers" / method_filename(name)).items():
            before = read_answers(tmp_path / "one" / "answers" / method_filename(name))[key]
            assert rec["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]
            for t, (stats, wall) in enumerate(zip(rec["choices"][0]["stats"], rec["choices"][0]["wall_time"])):
                assert len(stats["repeat_seconds"]) == 3 and wall == min(stats["repeat_seconds"])
                assert stats["accepted"] == before["choices"][0]["stats"][t]["accepted"]
    assert "each turn the fastest of 3 runs" in render_markdown(three)
    assert three["noise"]["draws"] == 1000 and set(three["noise"]["groups"]) == set(three["groups"])
    assert all("suffix" in rows for rows in three["noise"]["groups"].values())
    assert "## Run-to-run noise" in render_markdown(three)


def _timed(monkeypatch, seconds):
    """The runner's timed runs, each one's time the next of ``seconds[method]``; how many ran."""
    import dataclasses

    from draftwise.bench.runner import Runner

    real, left = Runner.turn, {m: iter(s) for m, s in seconds.items()}
    counts = {m: 0 for m in seconds}

    def fake(self, method, prompt_ids, category):
        counts[method.name] += 1
        return dataclasses.replace(real(self, method, prompt_ids, category), seconds=next(left[method.name]))

    monkeypatch.setattr(Runner, "turn", fake)
    return counts


def test_settle_runs_every_method_again_until_each_ones_two_fastest_runs_agree(tiny, tmp_path, monkeypatch):
    """With settle=0.05 a turn runs another round of every method while any method's two fastest
    runs are more than 5% apart, so each keeps the fastest of as many runs; the kept time is the
    fastest, and a turn that never settles stops at 3 x repeats rounds."""
    q = [Question(1, "qa", ("What is the capital of France?",))]
    counts = _timed(monkeypatch, {"none": [1.0, 1.01, 1.5, 0.9, 0.91], "suffix": [3.0, 4.0, 5.0, 3.5, 3.05]})
    done = run_bench(tiny, q, drafts="suffix", k=3, max_new_tokens=N, out_dir=tmp_path / "a", progress=False,
                     warmup=False, repeats=3, settle=0.05)
    assert counts == {"none": 5, "suffix": 5}  # suffix: 3.0/4.0, then 3.0/3.5 apart; 3.0/3.05 agree
    for name, fastest in (("suffix", 3.0), ("none", 0.9)):
        rec = next(iter(read_answers(tmp_path / "a" / "answers" / method_filename(name)).values()))
        assert len(rec["choices"][0]["stats"][0]["repeat_seconds"]) == 5 and rec["choices"][0]["wall_time"] == [fastest]
    assert done["config"]["settle"] == 0.05 and "agreed within 5%" in render_markdown(done)

    monkeypatch.undo()  # the runner's own turn again, timed anew
    counts = _timed(monkeypatch, {"none": [1.0] * 9, "suffix": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]})
    run_bench(tiny, q, drafts="suffix", k=3, max_new_tokens=N, out_dir=tmp_path / "b", progress=False,
              warmup=False, repeats=2, settle=0.05)
    assert counts == {"none": 6, "suffix": 6}  # never within 5%: the cap, 3 x 2 rounds

    monkeypatch.undo()
    counts = _timed(monkeypatch, {"none": [1.0, 1.02, 9.0], "suffix": [2.0, 2.04, 9.0]})
    run_bench(tiny, q, drafts="suffix", k=3, max_new_tokens=N, out_dir=tmp_path / "c", progress=False,
              warmup=False, repeats=2, settle=0.05)
    assert counts == {"none": 2, "suffix": 2}  # both settled after the repeats: no more rounds


@pytest.mark.parametrize("settle, repeats, match", [
    (0.0, 3, "between 0 and 1"), (1.5, 3, "between 0 and 1"), (0.05, 1, "needs repeats >= 2"),
])
def test_bad_settle_is_one_config_error(tiny, qfile, settle, repeats, match):
    with pytest.raises(ConfigError, match=match):
        run_bench(tiny, qfile, max_new_tokens=N, progress=False, warmup=False, repeats=repeats, settle=settle)
