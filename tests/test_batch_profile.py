"""The batch profile: measured on a tiny random native model, read back by interpolation, kept in
one file per kind that a second writer with other settings cannot silently replace, and refused
on another model or machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draftwise.cost import batch_profile as bpmod
from draftwise.cost.batch_measure import measure_batch_profile, prompt_share, smooth
from draftwise.cost.batch_profile import BatchProfile, default_batch_profile_path, save_batch_profile
from draftwise.cost.profile import cpu_flags, cpu_model
from draftwise.errors import ConfigError
from draftwise.runtime.loaders import Model
from draftwise.runtime.native import NativeRuntime

from .conftest import random_hf_model, tiny_llama_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> Model:
    config = tiny_llama_config(max_position_embeddings=512)
    folder = tmp_path_factory.mktemp("tiny-batch")
    (folder / "config.json").write_text(config.to_json_string())
    hf = random_hf_model(config, seed=3)
    rt = NativeRuntime(config, hf.state_dict(), max_context=512)
    return Model(name="tiny-batch", folder=folder, runtime=rt, tokenizer=None, eos_token_ids=frozenset({2}),
                 config=config)


def synthetic(times: dict[int, list[list[float]]] | None = None, **fields: Any) -> BatchProfile:
    batches, rows = [1, 2, 4], [1, 2, 4]
    grid = times or {64: [[0.01 * b * r + 0.01 for r in rows] for b in batches]}
    base: dict[str, Any] = dict(model="m", fingerprint="f" * 16, machine_fingerprint=bpmod.machine_fingerprint(),
                                dtype="float32", runtime="NativeRuntime", batches=batches, rows=rows,
                                contexts=sorted(grid), times=grid, repeats=1)
    base.update(fields)
    return BatchProfile(**base)


def test_a_tiny_model_gives_a_sane_monotone_grid(tiny: Model) -> None:
    rt: Any = tiny.runtime
    seen: list[float] = []
    bp = measure_batch_profile(tiny, batches=(1, 2, 4), rows_per_seq=(1, 3, 6), contexts=(16, 64), repeats=2,
                               progress=lambda desc, frac: seen.append(frac))
    assert (bp.batches, bp.rows, bp.contexts) == ([1, 2, 4], [1, 3, 6], [16, 64])
    assert seen and seen[-1] == 1.0
    for c in bp.contexts:
        grid = bp.times[c]
        assert len(grid) == 3 and all(len(row) == 3 for row in grid)
        assert all(0 < t < 5 for row in grid for t in row)
        assert all(a <= b for row in grid for a, b in zip(row, row[1:]))  # more rows never cheaper
        assert all(grid[i][j] <= grid[i + 1][j] for i in range(2) for j in range(3))  # nor more sequences
        assert len(bp.raw[c]) == 3
    # 4 sequences x 6 rows is real work next to 1 x 1 on any machine
    assert bp.pass_time(4, 24, 64) > bp.pass_time(1, 1, 64)
    # the runtime gets its slots back, and every slot was rolled back after its passes
    assert (rt.slots, rt.slot_context) == (1, 512) and rt.length == 0
    assert bp.fingerprint and bp.machine_fingerprint == bpmod.machine_fingerprint()
    assert bp.machine["cpu_flags"] == cpu_flags() and bp.machine["cpu"] == cpu_model()
    bp.check_model(tiny)
    # prompt rows timed at the first and last rows per sequence; the share is the ratio of what
    # those rows add without logits and with them (a tiny model's time is mostly overhead)
    assert all(len(bp.prompt_raw[c]) == 3 and all(len(g) == 2 for g in bp.prompt_raw[c]) for c in bp.contexts)
    assert bp.prompt_share == prompt_share(bp.raw, bp.prompt_raw)  # None where the tiny model shows no rise
    assert bp.priced_rows(4, 10) == pytest.approx(4 + 10 * (bp.prompt_share or 1.0))


def test_the_prompt_share_is_what_prompt_rows_add_over_what_verified_rows_add() -> None:
    raw = {16: [[0.010, 0.020, 0.030], [0.020, 0.040, 0.060]], 64: [[0.012, 0.022, 0.032], [0.030, 0.050, 0.070]]}
    prompt = {16: [[0.010, 0.025], [0.020, 0.050]], 64: [[0.012, 0.027], [0.030, 0.060]]}  # 3/4 of each rise
    assert prompt_share(raw, prompt) == 0.75
    assert prompt_share({16: [[0.01]]}, {16: [[0.01, 0.01]]}) is None  # one rows value: no rise to compare


def test_a_measured_batch_spreads_its_contexts_around_the_mean(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving batch's sequences sit at different lengths, and a ragged batch costs more than
    one at a single length: the timed passes of batch B at context c see slots filled evenly
    from c/2 to 3c/2 (mean c), one sequence sees c, and spread=0 keeps every slot at c."""
    rt: Any = tiny.runtime
    timed: dict[tuple[int, float], list[list[int]]] = {}
    real = rt.forward_batch

    def spy(passes: Any, **kw: Any) -> Any:
        if all(not p.last_only and p.logits for p in passes):  # a timed pass (fills ask for the last row)
            timed.setdefault((len(passes), spread), []).append([rt._lengths[p.slot] for p in passes])
        return real(passes, **kw)

    monkeypatch.setattr(rt, "forward_batch", spy)
    for spread in (0.5, 0.0):
        bp = measure_batch_profile(tiny, batches=(1, 4), rows_per_seq=(1, 2), contexts=(64,), repeats=1,
                                   spread=spread, progress=False)
        assert bp.spread == spread and bp.settings["spread"] == spread
    assert {tuple(x) for x in timed[(4, 0.5)]} == {(32, 53, 75, 96)}
    assert {tuple(x) for x in timed[(1, 0.5)]} == {(64,)}
    assert {tuple(x) for x in timed[(4, 0.0)]} == {(64, 64, 64, 64)}


def test_every_round_times_every_batch_so_drift_hits_them_alike(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch has slots of its own, filled once a context; every round then times every batch
    and shape, not one batch's rounds in a block (a slow minute landed on one batch's block)."""
    rt: Any = tiny.runtime
    order: list[int] = []
    real = rt.forward_batch

    def spy(passes: Any, **kw: Any) -> Any:
        if all(not p.last_only and p.logits for p in passes):  # a timed verification pass
            order.append(len(passes))
        return real(passes, **kw)

    monkeypatch.setattr(rt, "forward_batch", spy)
    measure_batch_profile(tiny, batches=(1, 2), rows_per_seq=(1, 3), contexts=(16,), repeats=2, progress=False)
    assert order == [1, 1, 2, 2] * 3  # round 0 (warm-up) and 2 kept rounds, each over both batches


def test_bad_measure_settings_are_one_line(tiny: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="repeats=0"):
        measure_batch_profile(tiny, repeats=0)
    with pytest.raises(ConfigError, match=r"batches must be integers >= 1"):
        measure_batch_profile(tiny, batches=(0, 2))
    with pytest.raises(ConfigError, match="positions; the model holds 512"):
        measure_batch_profile(tiny, contexts=(600,))
    with pytest.raises(ConfigError, match=r"spread=1\.0 must be a number from 0"):
        measure_batch_profile(tiny, spread=1.0)
    with pytest.raises(ConfigError, match="positions; the model holds 512"):  # 3c/2 of 400 does not fit
        measure_batch_profile(tiny, batches=(1, 2), contexts=(400,))
    monkeypatch.setattr("draftwise.core.engine.memory_available", lambda: 1000)  # 1 kB free
    with pytest.raises(ConfigError, match=r"batches \[1, 4\] holds 5 sequences' caches at once: max_batch=5 needs .* GiB"):
        measure_batch_profile(tiny, batches=(1, 4), rows_per_seq=(1,), contexts=(16,), repeats=1, progress=False)


def test_pass_time_interpolates_in_the_grid() -> None:
    bp = synthetic({64: [[1.0, 2.0, 4.0], [2.0, 3.0, 6.0], [3.0, 5.0, 9.0]],
                    256: [[2.0, 4.0, 8.0], [4.0, 6.0, 12.0], [6.0, 10.0, 18.0]]})
    assert bp.pass_time(2, 4, 64) == 3.0  # a grid point
    assert bp.pass_time(2, 6, 64) == pytest.approx(4.5)  # 3 rows a sequence: between 2 and 4
    assert bp.pass_time(3, 3, 64) == pytest.approx(2.5)  # 3 sequences: between batches 2 and 4
    assert bp.pass_time(1, 1, 160) == pytest.approx(1.5)  # halfway in context
    assert bp.pass_time(1, 1, None) == 1.0
    assert bp.pass_time(1, 6, 64) == pytest.approx(6.0)  # past 4 rows: the last segment's slope, 1 a row
    curve = bp.rows_curve(2, 160)
    assert curve(6) == pytest.approx(bp.pass_time(2, 6, 160))
    with pytest.raises(ConfigError, match="batches of up to 4 sequences, not 8"):
        bp.pass_time(8, 8, 64)
    with pytest.raises(ConfigError, match="at least 2 rows"):
        bp.pass_time(2, 1, 64)


def test_linear_fit_finds_where_a_line_in_rows_stops_holding() -> None:
    straight = synthetic()
    fit = straight.linear_fit()[64]
    assert fit["breaks_at_rows"] is None and fit["max_error"] < 1e-9
    assert fit["per_row_s"] == pytest.approx(0.01)
    # flat to 4 rows, then steep (a GPU-like knee): the line breaks at the first row past it
    kinked = synthetic({64: [[1.0, 1.0, 1.0], [1.0, 1.0, 3.0], [1.0, 3.0, 7.0]]})
    fit = kinked.linear_fit()[64]
    assert fit["holds_to_rows"] == 4 and fit["breaks_at_rows"] == 8
    assert fit["max_error"] > 0.1


def test_smooth_makes_the_grid_monotone() -> None:
    assert smooth([[1.0, 3.0, 2.0], [0.5, 4.0, 5.0]]) == [[1.0, 2.5, 2.5], [1.0, 4.0, 5.0]]


def test_files_round_trip_and_bad_files_are_one_line(tmp_path: Path) -> None:
    bp = synthetic()
    path = bp.save(tmp_path / "b.json")
    back = BatchProfile.load(path)
    assert back.times == bp.times and back.settings == bp.settings
    assert back.prompt_share is None and back.priced_rows(3, 10) == 13  # an older profile: prompt rows at 1
    timed = synthetic(prompt_share=0.8, prompt_raw={64: [[0.01, 0.02]] * 3})
    back = BatchProfile.load(timed.save(tmp_path / "t.json"))
    assert (back.prompt_share, back.prompt_raw) == (0.8, timed.prompt_raw) and back.priced_rows(3, 10) == 11
    assert json.loads(path.read_text())["linear_fit"]["64"]["breaks_at_rows"] is None
    with pytest.raises(ConfigError, match="no batch profile at"):
        BatchProfile.load(tmp_path / "missing.json")
    (tmp_path / "p.json").write_text(json.dumps({"schema": "draftwise.profile/1"}))
    with pytest.raises(ConfigError, match="not a draftwise batch profile"):
        BatchProfile.load(tmp_path / "p.json")
    data = bp.to_dict()
    data["times"]["64"][0] = [0.1]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="malformed"):
        BatchProfile.load(tmp_path / "bad.json")


def test_another_model_or_machine_is_refused(tiny: Model) -> None:
    with pytest.raises(ConfigError, match="measured on model 'm'"):
        synthetic().check_model(tiny)
    mine = bpmod.model_fingerprint(tiny)
    elsewhere = synthetic(fingerprint=mine, machine_fingerprint="0" * 16, machine={"cpu": "other", "cpu_flags": []})
    with pytest.raises(ConfigError, match=r"on another machine \(other\)"):
        elsewhere.check_model(tiny)
    elsewhere.check_model(tiny, machine=False)
    # written before the fingerprint covered the CPU's features (no flags recorded): maybe this machine
    older = synthetic(fingerprint=mine, machine_fingerprint="0" * 16, machine={"cpu": "x86_64"})
    with pytest.raises(ConfigError, match="by an older draftwise.*measure it here"):
        older.check_model(tiny)
    with pytest.raises(ConfigError, match="measured in bfloat16"):
        synthetic(fingerprint=mine, dtype="bfloat16").check_model(tiny)


def test_no_second_writer_replaces_a_profile_with_other_settings(tmp_path: Path, tiny: Model) -> None:
    path = tmp_path / "m-batch.json"
    save_batch_profile(synthetic(), path)
    save_batch_profile(synthetic(created="later"), path)  # same settings: a refresh is fine
    other = synthetic(repeats=5)
    with pytest.raises(ConfigError, match=r"holds one measured with .*repeats.: 1.*replace=True"):
        save_batch_profile(other, path)
    assert BatchProfile.load(path).repeats == 1
    save_batch_profile(other, path, replace=True)
    assert BatchProfile.load(path).repeats == 5
    assert default_batch_profile_path(tiny).name.endswith("-batch.json")
    assert default_batch_profile_path(tiny).parent == bpmod.default_profile_path(tiny).parent


def test_a_stale_cached_profile_is_measured_again_and_a_named_one_refused(tiny: Model, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from draftwise.cost import batch_measure
    from draftwise.cost.profile import model_fingerprint

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    stale = synthetic(model=tiny.name, fingerprint="0" * 16)  # e.g. timed before the attention kernel
    save_batch_profile(stale, default_batch_profile_path(tiny))
    fresh = synthetic(model=tiny.name, fingerprint=model_fingerprint(tiny))
    monkeypatch.setattr(batch_measure, "measure_batch_profile", lambda model, **kw: fresh)
    said: list[str] = []
    assert batch_measure.resolve_batch_profile(tiny, status=said.append) is fresh
    assert "no longer fits" in said[0]
    assert BatchProfile.load(default_batch_profile_path(tiny)).fingerprint == fresh.fingerprint
    # one that fits but never timed a prompt's rows (written before they were priced apart) too
    save_batch_profile(fresh, default_batch_profile_path(tiny), replace=True)
    timed = synthetic(model=tiny.name, fingerprint=model_fingerprint(tiny), prompt_share=0.8,
                      prompt_raw={64: [[0.01, 0.02]] * 3})
    monkeypatch.setattr(batch_measure, "measure_batch_profile", lambda model, **kw: timed)
    assert batch_measure.resolve_batch_profile(tiny, status=said.append) is timed
    assert "prices a prompt's rows as verified rows" in said[-2]
    monkeypatch.setattr(batch_measure, "measure_batch_profile", lambda model, **kw: pytest.fail("measured again"))
    assert batch_measure.resolve_batch_profile(tiny).prompt_share == 0.8  # read from the cache now
    no_rise = synthetic(model=tiny.name, fingerprint=model_fingerprint(tiny), prompt_raw={64: [[0.01, 0.01]] * 3})
    save_batch_profile(no_rise, default_batch_profile_path(tiny), replace=True)
    assert batch_measure.resolve_batch_profile(tiny).prompt_share is None  # timed, no rise: kept, not measured again
    named = tmp_path / "theirs.json"
    save_batch_profile(stale, named)
    with pytest.raises(ConfigError, match="measured on model"):
        batch_measure.resolve_batch_profile(tiny, named)
