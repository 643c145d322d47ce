"""benchmarks/pass_time.py: T(n) through the single-sequence interface, any commit's runtime."""

from __future__ import annotations

import pytest

from .benchmark_scripts import load_benchmark

pass_time = load_benchmark("pass_time")


def test_times_each_size_and_rolls_back(tiny_chat_folder, one_thread):
    res = pass_time.measure("float32", context=30, sizes=[1, 4], rounds=3, model=str(tiny_chat_folder))
    assert set(res["median_ms"]) == {"1", "4"}
    assert all(len(s) == 3 and min(s) > 0 for s in res["seconds"].values())  # the warm-up is not counted


def test_cli_refuses_unknown_modes(capsys):
    with pytest.raises(SystemExit):
        pass_time.main(["--modes", "float64", "--out", "/nonexistent"])
    assert "unknown modes" in capsys.readouterr().err
