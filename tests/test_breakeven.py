"""The break-even calculator: closed forms, break-even, optimal k, and ``draftwise breakeven``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from draftwise.cli import app
from draftwise.cost.breakeven import (
    DRAFT_KIND_COSTS,
    CostCurve,
    cost_ratio_from_c,
    cost_ratio_from_profile,
    cost_ratio_from_times,
    kind_curves,
    plot_speedup,
    sweep,
)
from draftwise.cost.formulas import (
    KChoice,
    breakeven_acceptance,
    ceiling,
    expected_committed,
    leviathan_speedup,
    min_breakeven,
    optimal_k,
    speedup,
    step_cost_ratio,
)
from draftwise.cost.parsing import parse_acceptances, parse_ks
from draftwise.errors import ConfigError

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["breakeven", *args], catch_exceptions=False)


# -- the worked checks of the cost model ---------------------------------------------------
@pytest.mark.parametrize("a, k, want, places", [(0.8, 4, 3.36, 2), (0.5, 4, 1.94, 2), (0.5, 8, 1.996, 3)])
def test_worked_checks(a, k, want, places):
    # with a free draft and v = 1, the speedup is E itself
    assert round(speedup(a, k, step_cost_ratio(k, c=0.0)), places) == want
    assert round(expected_committed(a, k), places) == want


def test_ceilings():
    assert ceiling(0.8) == pytest.approx(5.0)
    assert ceiling(0.5) == pytest.approx(2.0)
    assert expected_committed(0.8, 200) == pytest.approx(ceiling(0.8))


@settings(max_examples=300, deadline=None)
@given(
    a=st.floats(0.0, 0.999, allow_nan=False),
    k=st.integers(1, 32),
    c=st.floats(0.0, 2.0, allow_nan=False),
)
def test_leviathan_closed_form_equals_speedup_with_unit_verification(a, k, c):
    assert leviathan_speedup(a, k, c) == pytest.approx(speedup(a, k, k * c + 1), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 16), c=st.floats(0.0, 1.5, allow_nan=False), v=st.floats(0.5, 3.0))
def test_speedup_is_one_at_breakeven(k, c, v):
    r = step_cost_ratio(k, c, v)
    a_star = breakeven_acceptance(k, r)
    if a_star is None:  # even a -> 1 commits k + 1 tokens for r >= k + 1 steps
        assert r >= k + 1
    elif a_star == 0.0:  # speculation pays at any acceptance
        assert r <= 1
        assert speedup(0.0, k, r) >= 1 - 1e-12
    else:
        assert speedup(a_star, k, r) == pytest.approx(1.0, abs=1e-6)
        if r - 1 < 1e-12:  # E(a) = 1 + a + ... is computed to ~1e-16: a root this small has no crossing to see
            assert a_star < 1e-11
            return
        step = min(1e-3, (1 - a_star) / 2, a_star / 2)
        assert speedup(a_star - step, k, r) < 1 < speedup(a_star + step, k, r)


@pytest.mark.parametrize("excess", [3e-11, 1e-9])
def test_breakeven_near_zero_is_found_to_relative_precision(excess):
    # a nearly free draft: R just above 1 puts the root near R - 1, far below an absolute 1e-10
    r = 1 + excess
    a_star = breakeven_acceptance(4, r)
    assert a_star == pytest.approx(r - 1, rel=1e-3)
    assert speedup(a_star / 2, 4, r) < 1 < speedup(a_star * 1.5, 4, r)


@pytest.mark.parametrize("a", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.0003, 0.15, 0.6])
def test_optimal_k_is_the_argmax(a, c):
    ratio = cost_ratio_from_c(c, v=1.05)
    choice = optimal_k(a, ratio, k_max=12)
    speeds = {k: speedup(a, k, ratio(k)) for k in range(1, 13)}
    best_k = max(speeds, key=lambda k: (speeds[k], -k))
    if speeds[best_k] > 1:
        assert choice == KChoice(best_k, pytest.approx(speeds[best_k]))
    else:
        assert choice == KChoice(None, 1.0)


def test_optimal_k_none_when_nothing_beats_one():
    assert optimal_k(0.2, cost_ratio_from_c(0.6), k_max=8) == KChoice(None, 1.0)
    # exactly 1 is not a gain either
    assert optimal_k(0.0, cost_ratio_from_c(0.0), k_max=4) == KChoice(None, 1.0)


def test_optimal_k_over_given_ks():
    ratio = cost_ratio_from_c(0.0)
    assert optimal_k(0.9, ratio, ks=[2, 4]).k == 4


def test_cost_ratio_sources_agree():
    # D(k) = k c T(1) measured in ms gives the same R(k) as --c
    t1, c = 20.0, 0.1
    from_times = cost_ratio_from_times([k * c * t1 for k in range(1, 9)], t1, v=[1.0 + 0.01 * k for k in range(1, 9)])
    from_c = cost_ratio_from_c(c, v=[1.0 + 0.01 * k for k in range(1, 9)])
    for k in range(1, 9):
        assert from_times(k) == pytest.approx(from_c(k))


def test_lists_must_cover_the_k_asked_for():
    with pytest.raises(ConfigError, match="k=1..2"):
        cost_ratio_from_c(0.1, v=[1.0, 1.1])(3)
    with pytest.raises(ConfigError, match="--draft-ms"):
        cost_ratio_from_times([1.0], 10.0)(2)


def test_min_breakeven_kinds_order():
    a = {kind: min_breakeven(cost_ratio_from_c(c), range(1, 9)) for kind, c in DRAFT_KIND_COSTS.items()}
    assert a["lookup"][0] < a["model"][0] < a["self"][0]


# -- parsing ------------------------------------------------------------------------------
def test_parse_ranges():
    assert parse_acceptances("0.1:0.95:0.05")[0] == 0.1
    assert parse_acceptances("0.1:0.95:0.05")[-1] == 0.95
    assert len(parse_acceptances("0.1:0.95:0.05")) == 18
    assert parse_ks("1-3,8") == [1, 2, 3, 8]


@pytest.mark.parametrize("text", ["1.0", "-0.1", "0.5,,0.6", "x", "0.1:0.9", "0.9:0.1:0.1", "0.1:0.9:0", "0.1:1.0:0.1"])
def test_bad_acceptance(text):
    with pytest.raises(ConfigError):
        parse_acceptances(text)


@pytest.mark.parametrize("text", ["0", "-1", "8-1", "a", "1.5", "1-", "1-100000"])
def test_bad_k(text):
    with pytest.raises(ConfigError):
        parse_ks(text)


def test_bad_direct_values():
    for call in (lambda: speedup(1.0, 4, 1.0), lambda: speedup(0.5, 0, 1.0), lambda: step_cost_ratio(4, -0.1),
                 lambda: cost_ratio_from_c(-1), lambda: cost_ratio_from_c(0.1, v=0)):
        with pytest.raises(ConfigError):
            call()


def test_sweep_shapes():
    curve = CostCurve("c=0.1", cost_ratio_from_c(0.1), "c", 0.1)
    out = sweep([0.5, 0.8], [1, 4], [curve])
    d = out["drafts"][0]
    assert out["expected"][1][1] == pytest.approx(3.3616)
    assert d["speedup"][1][1] == pytest.approx(3.3616 / 1.4, abs=1e-6)
    assert len(d["breakeven"]) == 2 and len(d["best"]) == 2


# -- the CLI ------------------------------------------------------------------------------
def test_cli_table():
    res = run("--a", "0.8", "--k", "4", "--c", "0.1")
    assert res.exit_code == 0, res.output
    assert "3.362" in res.stdout  # E(0.8, 4)
    assert "2.40x" in res.stdout  # S = 3.3616 / 1.4
    assert "0.287" in res.stdout  # a*(4) at c = 0.1
    assert "k=4" in res.stdout


def test_cli_default_shows_the_three_kinds():
    res = run("--a", "0.3,0.8", "--k", "1-4")
    assert res.exit_code == 0, res.output
    for kind in DRAFT_KIND_COSTS:
        assert kind in res.stdout
    assert "no speculation" in res.stdout  # self at a = 0.3 never pays


def test_cli_json():
    res = run("--a", "0.5,0.8", "--k", "4,8", "--c", "0", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {"acceptance", "k", "ceiling", "expected", "drafts"} <= data.keys()
    assert data["ceiling"] == pytest.approx([2.0, 5.0])
    d = data["drafts"][0]
    assert {"name", "cost_ratio", "breakeven", "speedup", "best"} <= d.keys()
    assert d["speedup"][0] == pytest.approx([1.9375, 1.996094], abs=1e-6)
    assert d["best"][1] == {"a": 0.8, "k": 8, "speedup": pytest.approx(4.3289, abs=1e-4)}


def test_cli_draft_ms_and_v_list():
    res = run("--a", "0.7", "--k", "1-3", "--draft-ms", "2,4,6", "--t1-ms", "20", "--v", "1,1.1,1.2", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["drafts"][0]
    assert d["cost_ratio"] == pytest.approx([1.1, 1.3, 1.5])


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "s.png"
    res = run("--a", "0.1:0.9:0.2", "--k", "1-4", "--draft-kind", "lookup,model", "--plot", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_kind_follows_the_extension(tmp_path):
    pytest.importorskip("matplotlib")
    svg = tmp_path / "s.svg"
    res = run("--c", "0.1", "--k", "1-3", "--plot", str(svg))
    assert res.exit_code == 0, res.output
    assert b"<svg" in svg.read_bytes()[:400]


def test_a_plot_matplotlib_cannot_write_is_refused_in_the_library_too(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ConfigError, match=r"cannot write a \.txt file"):
        plot_speedup(tmp_path / "s.txt", [1, 2], kind_curves(["lookup"]))
    assert not (tmp_path / "s.txt").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--a", "1.0"], "[0, 1)"),
        (["--a", "1.2"], "[0, 1)"),
        (["--a", "0.1:0.9"], "start:stop:step"),
        (["--k", "0"], "k must be >= 1"),
        (["--k", "4-2"], "low <= high"),
        (["--c", "-0.1"], "must be a finite number >= 0"),
        (["--c", "nan"], "must be a finite number >= 0"),
        (["--c", "inf"], "must be a finite number >= 0"),
        (["--draft-ms", "1,2", "--t1-ms", "nan", "--k", "1-2"], "--t1-ms=nan must be a finite number > 0"),
        (["--c", "0.1", "--draft-ms", "1,2", "--t1-ms", "10"], "not both"),
        (["--c", "0.1", "--draft-kind", "self"], "one source"),
        (["--draft-ms", "1,2"], "--t1-ms"),
        (["--draft-ms", "1,-2", "--t1-ms", "10", "--k", "1-2"], ">= 0 ms"),
        (["--c", "0.1", "--t1-ms", "10"], "--t1-ms goes with --draft-ms"),
        (["--draft-kind", "tree"], "unknown draft kind"),
        (["--c", "0.1", "--v", "0"], "v=0.0 must be a finite number > 0"),
        (["--c", "0.1", "--v", "1,1.1", "--k", "1-4"], "k=1..2"),
        (["--draft", "lookup"], "--profile"),
    ],
)
def test_cli_bad_input_exits_2(args, needle):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


# -- a measured profile --------------------------------------------------------------------
@pytest.fixture
def profile_file(tmp_path):
    from draftwise.cost.profile import Profile

    t1 = 0.020
    prof = Profile(
        model="tiny",
        fingerprint="0" * 16,
        dtype="float32",
        runtime="NativeRuntime",
        forward={128: [t1 * (1 + 0.05 * n) for n in range(6)]},
        step={128: [t1 * (1 + 0.05 * n) for n in range(6)]},  # step(n) = T(1) (1 + 0.05 (n - 1))
        drafts={"lookup": [0.0001 * k for k in range(1, 6)]},
    )
    return prof.save(tmp_path / "profile.json"), prof


def test_cli_profile(profile_file):
    path, prof = profile_file
    res = run("--profile", str(path), "--draft", "lookup", "--a", "0.6", "--k", "1-4", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["drafts"][0]
    assert d["name"] == "lookup" and d["source"] == "profile"
    want = [prof.step_cost_ratio("lookup", k) for k in range(1, 5)]
    assert d["cost_ratio"] == pytest.approx(want, abs=1e-6)
    assert want[3] == pytest.approx(0.0004 / 0.02 + 1.2)
    assert cost_ratio_from_profile(prof, "lookup")(2) == pytest.approx(want[1])


def test_cli_profile_table_and_plot(profile_file, tmp_path):
    pytest.importorskip("matplotlib")
    path, _ = profile_file
    png = tmp_path / "p.png"
    res = run("--profile", str(path), "--a", "0.5,0.7", "--k", "1-3", "--plot", str(png))
    assert res.exit_code == 0, res.output
    assert "lookup" in res.stdout and png.exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--draft", "self"], "no costs for draft 'self'"),
        (["--k", "1-9"], "narrow --k"),
        (["--v", "1.1"], "drop --v"),
        (["--c", "0.1"], "one source"),
        (["--context", "nan"], "--context=nan must be a context length"),
        (["--context", "-5"], "--context=-5.0 must be a context length"),
        (["--draft", "beam"], "unknown draft spec"),
    ],
)
def test_cli_profile_errors(profile_file, args, needle):
    path, _ = profile_file
    res = run("--profile", str(path), *args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_cli_missing_profile(tmp_path):
    res = run("--profile", str(tmp_path / "nope.json"))
    assert res.exit_code == 2 and "no profile" in res.output


def test_cli_profile_default_k_is_what_it_measured(profile_file):
    path, _ = profile_file
    res = run("--profile", str(path), "--a", "0.7", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["k"] == [1, 2, 3, 4, 5]


def test_cli_profile_draft_names_are_canonical(profile_file):
    # "lookup:min=1" is the default lookup, the draft the profile measured
    path, prof = profile_file
    res = run("--profile", str(path), "--draft", "lookup:min=1,max=3", "--a", "0.6", "--k", "1-2", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["drafts"][0]
    assert d["name"] == "lookup"
    assert d["cost_ratio"] == pytest.approx([prof.step_cost_ratio("lookup", k) for k in (1, 2)], abs=1e-6)
