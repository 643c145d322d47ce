"""benchmarks/pass_time.py: T(n) through the single-sequence interface, any commit's runtime."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from .benchmark_scripts import load_benchmark

pass_time = load_benchmark("pass_time")


def test_times_each_size_and_rolls_back(tiny_chat_folder, one_thread, monkeypatch):
    """A clock that each pass moves on by its call number (1, 2, ...) makes every timing exact."""
    clock, passes, loaded = [0.0], [], []
    load = pass_time.load_model

    def load_model(*args, **kwargs):
        model = load(*args, **kwargs)
        rt, forward = model.runtime, model.runtime.forward

        def timed_forward(ids, *a, **kw):
            passes.append((rt.length, len(ids)))
            clock[0] += len(passes)
            return forward(ids, *a, **kw)

        monkeypatch.setattr(rt, "forward", timed_forward)
        loaded.append(rt)
        return model

    monkeypatch.setattr(pass_time, "load_model", load_model)
    monkeypatch.setattr(pass_time, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    res = pass_time.measure("float32", context=30, sizes=[1, 4], rounds=3, model=str(tiny_chat_folder))
    # one warm-up round, then 3: sizes interleaved, each pass from the 30-token prompt (rolled back to it)
    assert passes == [(30, 1), (30, 4)] * 4
    assert loaded[0].length == 0  # and rolled back to empty at the end
    # pass i (1-based) took i seconds: 1 and 2 are the warm-up, not counted
    assert res["seconds"] == {"1": [3.0, 5.0, 7.0], "4": [4.0, 6.0, 8.0]}
    assert res["median_ms"] == {"1": 5000.0, "4": 6000.0}


def test_cli_refuses_unknown_modes(capsys):
    with pytest.raises(SystemExit):
        pass_time.main(["--modes", "float64", "--out", "/nonexistent"])
    assert "unknown modes" in capsys.readouterr().err
