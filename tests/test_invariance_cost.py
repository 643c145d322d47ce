"""benchmarks/invariance_cost.py: its free comparator computes the same attention, and the
runtime gets its row-invariant kernels back."""

from __future__ import annotations

import pytest
import torch

from draftwise.runtime import native, quant

from .benchmark_scripts import load_benchmark

invariance_cost = load_benchmark("invariance_cost")


def test_free_path_matches_and_is_undone(tiny_chat_folder, one_thread):
    attend, call = native.attend_groups, quant.Linear.__call__
    res = invariance_cost.measure("float32", context=40, sizes=[1, 5], rounds=2, model=str(tiny_chat_folder))
    assert native.attend_groups is attend and quant.Linear.__call__ is call
    assert [r["n"] for r in res["rows"]] == [1, 5]
    for row in res["rows"]:
        assert row["invariant_ms"] > 0 and row["free_ms"] > 0
        # the same model either way: only the summation order differs
        assert row["max_logit_gap"] < 1e-3


def test_free_attention_refuses_a_batch():
    from draftwise.runtime.base import Rows
    from draftwise.runtime.batch_plan import make_plan

    plan = make_plan([Rows(0, [1]), Rows(1, [2])], [3, 4], 64, kv_heads=1, group=2, head_dim=8,
                     device=torch.device("cpu"))
    cache = torch.zeros(2, 1, 64, 8)
    with pytest.raises(ValueError, match="one sequence"):
        invariance_cost.free_attention(plan, torch.zeros(2, 2, 8), cache, cache, 1.0, torch.float32)


def test_cli_refuses_unknown_modes(capsys):
    with pytest.raises(SystemExit):
        invariance_cost.main(["--modes", "float64", "--out", "/nonexistent"])
    assert "unknown" in capsys.readouterr().err
