"""Profile, planner, validation and adaptive k, on tiny random models (fast) with fake costs."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from draftwise import generate, load_model
from draftwise.cli import app
from draftwise.policy.adaptive import AdaptiveK
from draftwise.cost.measure import measure_profile
from draftwise.planner.plan import Plan, as_questions, load_plan, make_plan
from draftwise.planner.pick import MARGIN, aggregate, routed_items
from draftwise.cost.profile import Profile, model_fingerprint
from draftwise.planner.replay import Trace, replay_hits, replay_lookup, trace_generation
from draftwise.drafters import make_drafter
from draftwise.errors import ConfigError
from draftwise.questions import Question

from .images import is_complete_png
from .tiny import make_chat_folder


@pytest.fixture(scope="module")
def tiny_draft_folder(tmp_path_factory):
    """A second tiny model with the same tokenizer: a model draft for the tiny target."""
    return make_chat_folder(tmp_path_factory.mktemp("tiny-draft"), seed=7, num_hidden_layers=1)


def fake_profile(model, *, step=None, drafts=None, max_n=9, token_overhead=0.0) -> Profile:
    """A profile with chosen costs: ``step(n)`` seconds for a step feeding n tokens."""
    step = step or (lambda n: 0.010 * (1 + 0.05 * (n - 1)))
    times = [step(n) for n in range(1, max_n + 1)]
    return Profile(
        model=model.name,
        fingerprint=model_fingerprint(model),
        dtype="float32",
        runtime="NativeRuntime",
        forward={64: [t * 0.9 for t in times]},
        step={64: times},
        drafts=drafts if drafts is not None else {"lookup": [1e-5] * (max_n - 1)},
        token_overhead=token_overhead,
    )


PROMPTS = [
    "Repeat exactly: alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta",
    "Count: one two three one two three one two three one two three",
    "Tell me about the sea.",
]


# -- replay is exact in greedy mode --------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
def test_lookup_replay_matches_a_real_run_at_that_k(tiny, k):
    for text in PROMPTS:
        ids = tiny.encode_prompt(text)
        ref = trace_generation(tiny, ids, make_drafter("lookup", tiny), 8, 40)
        real = trace_generation(tiny, ids, make_drafter("lookup", tiny), k, 40)
        assert real.tokens == ref.tokens  # greedy: the output does not depend on k
        assert replay_lookup(lambda: make_drafter("lookup", tiny), ids, ref.tokens, k, 40) == real.steps


@pytest.mark.parametrize("k", [1, 2, 4])
def test_model_draft_hit_replay_matches_a_real_run(tiny, tiny_draft_folder, k):
    spec = f"model:{tiny_draft_folder}"
    for text in PROMPTS:
        ids = tiny.encode_prompt(text)
        ref = trace_generation(tiny, ids, make_drafter(spec, tiny), 8, 32)
        real = trace_generation(tiny, ids, make_drafter(spec, tiny), k, 32)
        assert real.tokens == ref.tokens
        assert replay_hits(ref.hits(), k, 32) == real.steps


def test_hits_of_a_trace_cut_by_eos_inside_a_step():
    # the last step accepted 3 tokens, but the second was EOS: only 4 tokens were committed
    t = Trace(None, "c", 5, tokens=[9, 8, 7, 2], new_tokens=3, steps=[(1, 1), (4, 3)],
              prefill_seconds=0.0, seconds=0.0, k=4)
    assert t.hits() == [None, 1, None, 1]


def test_replay_hits_by_hand():
    # position 0 comes from the prefill; hits at 1, 2, miss at 3, hit 4, unknown (bonus) 5
    hits = [None, 1, 1, 0, 1, None, 0]
    assert replay_hits(hits, 1, 100) == [(1, 1), (1, 0), (1, 1), (1, 0)]
    assert replay_hits(hits, 2, 100) == [(2, 2), (2, 2)]
    assert replay_hits(hits, 8, 100) == [(8, 2), (8, 2)]
    # the budget caps the last proposals like decode_steps does
    assert replay_hits([None, 1, 1, 1], 8, 4) == [(2, 2)]


# -- the profile ---------------------------------------------------------------------------
def test_profile_measures_saves_loads_and_interpolates(tiny, tmp_path):
    p = measure_profile(tiny, drafts=["lookup", "self:exit=1"], max_n=4, contexts=(16, 64), repeats=2,
                        progress=False)
    assert set(p.step) == set(p.forward) == set(p.step_sampled) == {16, 64}
    for c, forward in p.forward.items():
        # a pass over more tokens never costs less, and a step (pass + verification) never less than its pass
        assert len(forward) == len(p.step[c]) == 4 and forward == sorted(forward) and forward[0] > 0
        for step in (p.step[c], p.step_sampled[c]):
            assert step == sorted(step) and all(s >= f * (1 - 1e-12) for s, f in zip(step, forward))
    assert set(p.drafts) == {"lookup", "self:exit=1"} and len(p.drafts["lookup"]) == 3
    assert p.draft_variants == {"lookup": "", "self:exit=1": ""}  # what decided each cost, recorded
    back = Profile.load(p.save(tmp_path / "p.json"))
    assert back.to_dict() == p.to_dict()
    mid = back.step_time(2, 40)
    lo, hi = sorted((back.step[16][1], back.step[64][1]))
    assert lo <= mid <= hi
    back.check_model(tiny)


def test_a_profile_of_another_model_is_refused(tiny, tiny_draft_folder, tmp_path):
    other = load_model(str(tiny_draft_folder))
    prof = fake_profile(other)
    with pytest.raises(ConfigError, match="made on model"):
        prof.check_model(tiny)
    with pytest.raises(ConfigError, match="no costs for draft"):
        fake_profile(tiny).draft_time("self", 2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    with pytest.raises(ConfigError, match="not a draftwise profile"):
        Profile.load(bad)


# -- the plan ------------------------------------------------------------------------------
def rows_for(texts):
    return [Question(i, c, (t,)) for i, (c, t) in enumerate(texts)]


def test_plan_recommends_lookup_on_repetition_and_none_when_nothing_pays(tiny):
    rows = rows_for([("copy", PROMPTS[0]), ("copy", PROMPTS[1]), ("free", PROMPTS[2])])
    cheap = fake_profile(tiny, step=lambda n: 0.01)  # a GPU-like curve: verification is free
    plan = make_plan(tiny, rows, cheap, drafts=["lookup"], ks=[1, 2, 4], max_new_tokens=24, auto=False)
    assert set(plan.categories) == {"copy", "free", "overall"}
    assert sorted(c.k for c in plan.categories["overall"]) == [1, 2, 4]
    for cands in plan.categories.values():  # greedy: ranked by the prediction
        assert [c.speedup for c in cands] == sorted((c.speedup for c in cands), reverse=True)
        assert all(c.interval[0] <= c.speedup <= c.interval[1] for c in cands)
    # on a free-verification machine any hit pays, so the best is the largest k
    best = plan.categories["copy"][0]
    assert best.acceptance  # the copy prompts repeat, so lookup gets some tokens right
    assert plan.recommended["copy"] == ("lookup", 4) and plan.predicted["copy"] > 1
    # ranked by the interval's low end instead: the pick is the one that reaches highest there
    low = make_plan(tiny, rows, cheap, drafts=["lookup"], ks=[1, 2, 4], max_new_tokens=24, pick="low")
    for cands in low.categories.values():
        assert [c.interval[0] for c in cands] == sorted((c.interval[0] for c in cands), reverse=True)
    best = low.categories["copy"][0]
    # the pick is the top unless it reaches no more than MARGIN above the default, the simple
    # choice (lookup k=auto): the two can land that close, and which leads then turns on the
    # draft's timed cost
    default = next(c for c in low.categories["copy"] if c.k == "auto")
    close = best.interval[0] <= (1 + MARGIN) * default.interval[0]
    assert low.recommended["copy"] == (("lookup", "auto") if close else ("lookup", best.k))
    assert low.config["pick"] == "low"
    with pytest.raises(ConfigError, match="pick="):
        make_plan(tiny, rows, cheap, drafts=["lookup"], ks=[1], pick="mean")
    # a machine where a step of n tokens costs n plain steps: no k can pay
    linear = fake_profile(tiny, step=lambda n: 0.01 * n * 1.2)
    plan = make_plan(tiny, rows, linear, drafts=["lookup"], ks=[1, 2, 4], max_new_tokens=24)
    assert all(rec == ("none", 0) for rec in plan.recommended.values())
    assert all(c.breakeven is None for cands in plan.categories.values() for c in cands)


def test_plan_roundtrips_and_chooses(tiny, tmp_path):
    rows = rows_for([("copy", PROMPTS[0]), ("free", PROMPTS[2])])
    plan = make_plan(tiny, rows, fake_profile(tiny), drafts=["lookup"], ks=[2, 4], max_new_tokens=16)
    back = load_plan(plan.save(tmp_path / "plan.json"))
    assert back.to_dict() == plan.to_dict()
    assert back.choose("copy") == plan.recommended["copy"]
    assert back.choose("never-seen") == plan.recommended["overall"]
    assert isinstance(load_plan(tmp_path), Plan)  # a folder holding plan.json


def test_plan_takes_questions_or_spec_bench_rows(tiny):
    rows = [{"question_id": 7, "category": "code", "turns": [PROMPTS[0]]}]
    assert as_questions(rows) == [Question(7, "code", (PROMPTS[0],))]
    with pytest.raises(ConfigError, match="prompt 1: 'turns'"):
        as_questions([{"question_id": 1, "category": "code", "turns": "not a list"}])
    prof = fake_profile(tiny)
    by_dict = make_plan(tiny, rows, prof, drafts=["lookup"], ks=[2], max_new_tokens=12)
    by_question = make_plan(tiny, as_questions(rows), prof, drafts=["lookup"], ks=[2], max_new_tokens=12)
    assert set(by_dict.categories) == {"code", "overall"}  # any category is planned for
    assert by_dict.prompts[0]["new_tokens"] == by_question.prompts[0]["new_tokens"]
    with pytest.raises(ConfigError, match="'overall' is reserved"):
        make_plan(tiny, [Question(1, "overall", ("hi",))], prof, drafts=["lookup"], ks=[2])


def test_plan_keys_drafts_by_their_canonical_spec(tiny):
    rows = rows_for([("copy", PROMPTS[0])])
    plan = make_plan(tiny, rows, fake_profile(tiny), drafts=["lookup:min=1,max=3", "lookup"], ks=[2],
                     max_new_tokens=12)
    assert plan.drafts == ["lookup"] and {c.draft for c in plan.categories["overall"]} == {"lookup"}


# -- adaptive k ----------------------------------------------------------------------------
def test_adaptive_k_follows_acceptance_and_costs(tiny):
    flat = fake_profile(tiny, step=lambda n: 0.01)
    policy = AdaptiveK(flat, "lookup", k_max=8)
    for _ in range(40):
        policy.observe(8, 8)
    assert policy.choose(100) == 8
    steep = fake_profile(tiny, step=lambda n: 0.01 * (1 + 0.5 * (n - 1)))
    policy = AdaptiveK(steep, "lookup", k_max=8)
    for _ in range(40):
        policy.observe(4, 0)
    assert policy.choose(100) == 0
    # a cheap draft keeps learning in the shadow and speculates again when text repeats
    assert policy.shadow
    for _ in range(60):
        policy.observe_shadow([5], [5])
    assert policy.choose(100) >= 1


def test_adaptive_k_probes_a_costly_draft(tiny):
    prof = fake_profile(tiny, step=lambda n: 0.01 * (1 + 0.5 * (n - 1)), drafts={"self": [0.008 * k for k in range(1, 9)]})
    policy = AdaptiveK(prof, "self", k_max=4, probe_every=5)
    for _ in range(40):
        policy.observe(4, 0)
    chosen = [policy.choose(64) for _ in range(10)]
    assert not policy.shadow
    assert chosen.count(1) == 2 and chosen.count(0) == 8


@pytest.mark.parametrize("spec", ["lookup", "self:exit=2", "suffix"])
def test_k_auto_is_lossless(tiny, spec, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    for text in PROMPTS:
        plain = generate(tiny, text, max_new_tokens=24)
        auto = generate(tiny, text, max_new_tokens=24, draft=spec, k="auto")
        assert auto.token_ids == plain.token_ids
        assert auto.k == "auto"
    assert list((tmp_path / "profiles").glob("*.json"))  # measured once and cached


# -- the command line ----------------------------------------------------------------------
def test_cli_plan_and_profile(tiny_chat_folder, tmp_path):
    runner = CliRunner()
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    prof = tmp_path / "prof.json"
    r = runner.invoke(app, ["profile", "--model", str(tiny_chat_folder), "--draft", "lookup", "--max-n", "5",
                            "--contexts", "16,64", "--repeats", "1", "--out", str(prof), "--plot", str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    assert prof.exists() and is_complete_png(tmp_path / "t.png")
    r = runner.invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tiny_chat_folder), "--drafts", "lookup",
                            "--ks", "1-4", "--profile", str(prof), "-n", "12", "--out", str(tmp_path / "plan"),
                            "--validate"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert data["validation"]["checks"] and "median_abs_error" in data["validation"]
    # the profile's price of what ran: each traced run's real seconds against it, and plain decoding's
    runs = data["prompts"][0]["runs"]
    assert list(runs) == ["lookup k=8", "plain"]  # the traced draft, and plain decoding timed for the fit
    assert all(r["measured_s"] > 0 < r["predicted_s"] and len(r["parts"]) == 4 for r in runs.values())
    assert abs(sum(runs["plain"]["parts"]) - runs["plain"]["predicted_s"]) < 1e-3
    # measured seconds over priced ones: each timed run's median over the prompts, as the plan kept
    # them; and the validation's plain decoding (its best rate per prompt) over the plan's plain price
    timed = {run: round(statistics.median(p["runs"][run]["measured_s"] / p["runs"][run]["predicted_s"]
                                          for p in data["prompts"]), 4) for run in runs}
    best = {u["question_id"]: max(u["plain"]) for u in data["validation"]["units"]}
    plain = statistics.median(p["new_tokens"] / best[p["question_id"]] / p["plain_s"] for p in data["prompts"])
    assert data["config"]["pricing"] == timed
    assert data["validation"]["pricing"] == {**timed, "plain (validation)": round(plain, 4)}
    fit = data["config"]["loop_fit"]
    assert {"plain", "verify", "drafts", "raw"} <= set(fit) and 0.5 <= fit["plain"] <= 2.0
    assert "Priced as the decode loop ran during the plan" in (tmp_path / "plan" / "plan.md").read_text()
    assert "Measured over the profile's price" in (tmp_path / "plan" / "plan.md").read_text()
    assert is_complete_png(tmp_path / "plan" / "plan.png")
    assert "predicted" in (tmp_path / "plan" / "plan.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ks", "0-3"], "k must be >= 1"),
        (["--drafts", "nonsense"], "unknown draft spec"),
        (["--temperature", "-1"], "must be a finite number >= 0"),
        (["--temperature", "nan"], "--temperature nan must be a finite number >= 0"),
        (["--drafts", "lookup@k=8"], "without @k"),
        (["--drafts", ","], "needs at least one draft"),
    ],
)
def test_cli_plan_bad_input(tiny_chat_folder, tmp_path, args, message):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    prof = fake_profile(load_model(str(tiny_chat_folder))).save(tmp_path / "prof.json")
    r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tiny_chat_folder),
                                 "--profile", str(prof), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_a_named_profile_with_a_stale_draft_is_used_and_said(tiny_chat_folder, tmp_path, capsys):
    """A cached profile's stale draft is measured again; a profile the user names is theirs to
    keep, so it is used as given, with one line saying which drafts it priced in another format."""
    from draftwise.cli.plan import _profile_for_plan

    model = load_model(str(tiny_chat_folder))
    prof = fake_profile(model)
    path = prof.save(tmp_path / "prof.json")
    assert _profile_for_plan(model, ["lookup"], 4, prof, path) is prof
    assert "note" not in capsys.readouterr().err
    prof.draft_variants = {"lookup": "head int8"}  # what no lookup draft is: priced in another format
    assert _profile_for_plan(model, ["lookup"], 4, prof, path) is prof
    err = " ".join(capsys.readouterr().err.split())
    assert "timed lookup in another weight format" in err and "draftwise profile" in err


def test_cli_plan_refuses_empty_files_and_foreign_profiles(tiny_chat_folder, tiny_draft_folder, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = CliRunner().invoke(app, ["plan", "--prompts", str(empty), "--model", str(tiny_chat_folder)])
    assert r.exit_code == 2 and "empty" in r.output
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    foreign = fake_profile(load_model(str(tiny_draft_folder))).save(tmp_path / "foreign.json")
    r = CliRunner().invoke(app, ["plan", "--prompts", str(prompts), "--model", str(tiny_chat_folder),
                                 "--profile", str(foreign)])
    assert r.exit_code == 2 and "made on model" in r.output


def test_cli_demo_runs_end_to_end_on_a_tiny_model(tiny_chat_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in
                                   enumerate([("writing", PROMPTS[2]), ("summarization", PROMPTS[0]),
                                              ("qa", PROMPTS[1])])) + "\n")
    r = CliRunner().invoke(app, ["demo", "--model", str(tiny_chat_folder), "--questions", str(questions),
                                 "-n", "10", "--out", str(tmp_path / "demo")])
    assert r.exit_code == 0, r.output
    assert "break-even" in r.output and "recommendation" in r.output
    data = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert set(data["bench"]["groups"]["overall"]) >= {"none", "auto"}
    assert data["bench"]["equality"]["methods"]["auto"]["equal"] == 3


def test_expected_steps_keep_the_accepted_tokens_when_each_step_accepts_under_one():
    """Per-depth replay (sampling, EAGLE) with 3 of 10 first tokens accepted: the steps commit
    the trace's tokens and report its accepted count (rounding per step reported 0)."""
    from draftwise.planner.replay import Trace, expected_steps

    steps = [(1, 1 if i % 10 < 3 else 0) for i in range(100)]
    tokens = list(range(1 + sum(a + 1 for _, a in steps)))
    trace = Trace(0, "c", 5, tokens, len(tokens), steps, 0.0, 1.0, 1)
    replayed = expected_steps(trace, 1)
    assert sum(a for _, a in replayed) == 30
    assert sum(a + 1 for _, a in replayed) == len(tokens) - 1
    assert all(m == 1 and a in (0, 1) for m, a in replayed)


def test_a_plan_with_a_draft_of_its_own_cost_times_plain_and_a_host_draft_and_fits_its_price(tiny, monkeypatch):
    """A traced draft (self, not replayable) beside a replayed one: the plan also times plain
    decoding and lookup on every turn, fits the profile to the loop (one factor for the self
    draft's own passes) and prices every candidate, the adaptive k included, with the fit."""
    import draftwise.planner.plan as plan_mod

    priced = []  # (profile, each (draft, k)'s items) of each pricing of the units
    price_units = plan_mod._price_units
    monkeypatch.setattr(plan_mod, "_price_units",
                        lambda profile, *args: priced.append((profile, price_units(profile, *args))) or priced[-1][1])
    rows = rows_for([("copy", PROMPTS[0]), ("free", PROMPTS[2])])
    prof = fake_profile(tiny, drafts={"lookup": [1e-5] * 8, "self:exit=1": [0.004 * k for k in range(1, 9)]})
    plan = make_plan(tiny, rows, prof, drafts=["lookup", "self:exit=1"], ks=[1, 2, 4], max_new_tokens=16)
    runs = plan.prompts[0]["runs"]
    assert set(runs) == {"self:exit=1 k=8", "self:exit=1 k=auto", "plain", "lookup k=8"}
    assert all(r["measured_s"] > 0 and len(r["parts"]) == 4 for r in runs.values())
    assert runs["self:exit=1 k=8"]["parts"][3] > 0 == runs["plain"]["parts"][3]  # its own passes, priced apart
    fit = plan.config["loop_fit"]
    assert set(fit["drafts"]) <= {"self:exit=1"} and all(0.5 <= v <= 2.0 for v in fit["drafts"].values())
    assert {(c.draft, c.k) for c in plan.categories["overall"]} >= {("self:exit=1", "auto"), ("lookup", "auto")}
    assert all(p["equal"] for p in plan.prompts)  # plain decoding's timed run committed the same tokens
    # each pick also priced with the profile as measured, for scoring the fit against the same measurements
    # (the plan's picks are the units priced with the fitted profile, the unfitted ones those priced with `prof`)
    (fitted, fitted_items), (measured, items) = priced
    assert fitted.step != prof.step and measured is prof

    def predictions(per):  # each category's pick (plain decoding's is no prediction), and the routed workload
        out = {c: aggregate([x for x in per[pick] if c == "overall" or x["category"] == c])
               for c, pick in plan.recommended.items() if pick[0] != "none"}
        return {**out, "overall (routed)": aggregate(routed_items(plan.recommended, per, next(iter(per)))[0])}

    assert predictions(fitted_items) == {**{c: plan.predicted[c] for c, (d, _) in plan.recommended.items()
                                            if d != "none"}, "overall (routed)": plan.routed_overall}
    assert plan.config["unfitted"] == {c: round(v, 4) for c, v in predictions(items).items()}
