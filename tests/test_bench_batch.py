"""``draftwise bench --batch N``: the questions again N at a time on the batched engine.

On the tiny random chat model, ~8 new tokens: four questions (one with two turns) at a batch of
3, so a slot frees and takes the fourth question; greedy outputs equal the one-at-a-time run's.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftwise import ConfigError, load_model
from draftwise.bench import render_markdown, run_bench
from draftwise.bench.runner import build_prompt
from draftwise.cli import app
from draftwise.core.decode import generate
from draftwise.core.sampling import SamplingConfig

N = 8
QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 3, "category": "summarization", "turns": ["Summarise: the cat sat on the mat. The cat sat."]},
    {"question_id": 4, "category": "qa", "turns": ["Name three colours."]},
]
BATCHED_KEYS = {"requests", "new_tokens", "wall_s", "tokens_per_s", "per_request_tokens_per_s",
                "one_at_a_time_tokens_per_s", "x_one_at_a_time", "target_passes", "equal", "mismatches"}


@pytest.fixture(scope="module")
def batched(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-batch")
    summary = run_bench(tiny, QUESTIONS, drafts="lookup,suffix,self", k=3, max_new_tokens=N, out_dir=out,
                        progress=False, batch=3)
    return summary, out


def test_batched_rows_are_in_summary_json_beside_the_one_at_a_time_rows(batched):
    summary, out = batched
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["batched"] == summary["batched"]
    assert {"groups", "equality", "config", "acceptance_by_position", "run"} <= on_disk.keys()
    b = summary["batched"]
    assert b["batch"] == 3 and b["questions"] == 4 and b["equality_checked"]
    # a drafter that cannot run on an engine slot is reported, and the others still run
    assert list(b["methods"]) in (["none", "lookup", "suffix", "self"], ["none", "lookup", "suffix"])
    assert set(b["skipped"]) == {"self"} - set(b["methods"])
    for name, row in b["methods"].items():
        assert row.keys() == BATCHED_KEYS, name
        assert row["requests"] == 5 and row["target_passes"] > 0
        overall = summary["groups"]["overall"][name]
        assert row["new_tokens"] == overall["new_tokens"]  # greedy: the same tokens
        assert row["tokens_per_s"] > 0 and row["per_request_tokens_per_s"] > 0
        assert row["one_at_a_time_tokens_per_s"] == pytest.approx(overall["new_tokens"] / overall["wall_s"])
        assert row["x_one_at_a_time"] == pytest.approx(row["tokens_per_s"] / row["one_at_a_time_tokens_per_s"])


def test_batched_greedy_outputs_equal_the_one_at_a_time_outputs(batched):
    for name, row in batched[0]["batched"]["methods"].items():
        assert row["equal"] == row["requests"] == 5 and row["mismatches"] == [], name


def test_summary_md_has_a_labelled_batched_table(batched):
    summary, out = batched
    md = (out / "summary.md").read_text()
    assert md == render_markdown(summary)
    table = md.split("## Batched: 3 at a time", 1)[1]
    assert "| method | aggregate tok/s | per-request tok/s | one at a time tok/s | x one at a time |" in table
    for name in summary["batched"]["methods"]:
        assert f"| {name} |" in table and "| 5/5 | 5 |" in table
    for name, why in summary["batched"]["skipped"].items():
        assert f"- {name}: not batched ({why})." in table
    assert md.index("## overall") < md.index("## Batched")


def test_the_model_decodes_one_sequence_again_afterwards(batched, tiny):
    assert tiny.runtime.slots == 1
    prompt = build_prompt(tiny, ["What is the capital of France?"], [])
    answer = json.loads((batched[1] / "answers" / "none.jsonl").read_text().splitlines()[1])
    assert generate(tiny, prompt, max_new_tokens=N).token_ids == answer["choices"][0]["token_ids"][0]


def test_sampled_runs_report_equality_as_not_applicable(tiny, tmp_path):
    summary = run_bench(tiny, QUESTIONS[1:3], drafts="lookup", k=3, max_new_tokens=4, out_dir=tmp_path,
                        progress=False, batch=2, sampling=SamplingConfig(temperature=0.8, seed=3), warmup=False)
    b = summary["batched"]
    assert not b["equality_checked"] and all(row["equal"] is None for row in b["methods"].values())
    assert "| n/a |" in (tmp_path / "summary.md").read_text()


def test_batch_one_is_todays_run(tiny, tmp_path):
    summary = run_bench(tiny, QUESTIONS[1:2], drafts=(), max_new_tokens=2, out_dir=tmp_path, progress=False,
                        warmup=False)
    assert "batched" not in summary and "Batched" not in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("batch", [0, -2, True, 1.5])
def test_a_bad_batch_is_one_clear_error(tiny, batch):
    with pytest.raises(ConfigError, match=r"--batch .*must be an integer >= 1"):
        run_bench(tiny, QUESTIONS, max_new_tokens=N, progress=False, batch=batch)


def test_the_hf_runtime_refuses_a_batch_before_running_anything(tiny_chat_folder, one_thread, tmp_path):
    hf = load_model(str(tiny_chat_folder), runtime="hf")
    with pytest.raises(ConfigError, match="--batch 2: the .* runtime runs one sequence at a time") as exc:
        run_bench(hf, QUESTIONS, max_new_tokens=N, out_dir=tmp_path, progress=False, batch=2)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "answers").exists()


def test_cli_batch_zero_is_one_line_before_the_model_loads(tmp_path):
    res = CliRunner().invoke(app, ["bench", "--model", str(tmp_path / "no-such-model"), "--batch", "0",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --batch 0: must be an integer >= 1"), res.output


def test_cli_batch_runs_and_prints_the_batched_table(tiny_chat_folder, tmp_path, one_thread):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\nCount to three.\nSay yes.\n")
    res = CliRunner().invoke(app, ["bench", "--questions", str(prompts), "--model", str(tiny_chat_folder),
                                   "--drafts", "lookup", "-n", "4", "--batch", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "## Batched: 2 at a time" in res.stdout and "| lookup |" in res.stdout.split("## Batched")[1]


def test_a_batched_mismatch_is_named_in_summary_md(batched):
    summary = json.loads(json.dumps(batched[0]))
    row = summary["batched"]["methods"]["lookup"]
    row["equal"], row["mismatches"] = 4, [{"question_id": 1, "turn": 1}]
    md = render_markdown(summary)
    assert "| 4/5 | 5 |" in md and "- lookup: batched output differs from one at a time in q1 turn 1." in md
