"""The planner: run each draft on a sample of the workload, predict every (draft, k), recommend.

How a prediction is made (greedy decoding, which is deterministic):

The workload is a list of :class:`~draftwise.questions.Question` (``read_questions`` +
``select_questions``); any category is planned for. Drafts are keyed by their canonical spec.

1. The target decodes each sampled prompt once per draft, speculatively at ``k_max``. The
   committed tokens are the plain greedy output whatever the draft, so one run gives the
   exact token sequence plain decoding would produce.
2. *Which* tokens a draft gets right does not depend on k:

   - prompt lookup is a pure function of the context, so its steps at any k are replayed
     exactly, offline, on the committed tokens (no model pass at all);
   - a model or self draft proposes its own greedy chain; in the ``k_max`` run every output
     position was either accepted, rejected, or a bonus token. That per-position record
     ("did the draft, given the true prefix, predict this token?") is replayed for any
     k <= k_max, bonus positions counting as hits (:mod:`draftwise.cost.replay`).

3. Each replayed step costs ``D(m) + step(m + 1, context)`` from the machine profile (m tokens
   proposed), each committed token ``token_overhead``, and the prefill what it took. Plain
   decoding is the same sum with m = 0. Predicted speedup = mean tokens/s of the method /
   mean tokens/s of plain decoding over the prompts (Spec-Bench's convention,
   :func:`~draftwise.cost.model.mean_rate_speedup`).

With sampling (temperature > 0) the output is random, so step 2 uses the measured
conditional acceptance per draft position instead: E = 1 + sum_i prod_{j<=i} a_j. So does an
EAGLE head in greedy mode: its i-th token in a step is drafted from its own guessed features,
not from the true prefix, so whether it hits depends on its depth in the step, not only on the
position in the output.

A draft with its own cache (a model draft, a head) also pays, once per generation, for catching
up on the prompt at its first proposal: the profile's ``draft_prefill`` (seconds per prompt
token) times the prompt's length.

"No speculation" is always a candidate: a category whose best draft does not beat plain
decoding is told to decode plainly.
"""

from __future__ import annotations

import json
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..decode import generate
from ..drafters import make_drafter
from ..drafters.spec import DraftSpec
from ..errors import ConfigError
from ..fsutil import write_json_atomic
from ..questions import Question, parse_question
from ..sampling import SamplingConfig
from .intervals import (
    Counts, cost_ratio_draws, counts_from_steps, dispersion, percentile_interval, speedup_draws, uniforms,
)
from .model import breakeven_acceptance, effective_acceptance, mean_rate_speedup
from .profile import Profile
from .replay import Trace, expected_steps, predict_seconds, replay_hits, rates_only, replay_lookup, replayable, trace_generation

PLAN_SCHEMA = "draftwise.plan/1"
NONE = "none"


# -- the plan ------------------------------------------------------------------------------
@dataclass
class Candidate:
    draft: str
    k: int
    speedup: float
    mat: float
    acceptance: float | None  # accepted / proposed in the replay
    effective_acceptance: float | None  # the i.i.d. a with E(a, k) = 1 + accepted per proposing step
    breakeven: float | None  # a*(k) from the profile's costs (None: never pays)
    interval: list[float] | None = None  # 95% prediction interval of the speedup (intervals.py)


@dataclass
class Plan:
    model: str
    fingerprint: str
    dtype: str
    greedy: bool
    drafts: list[str]
    ks: list[int]
    categories: dict[str, list[Candidate]]  # category or "overall" -> every candidate
    recommended: dict[str, tuple[str, int]]  # category -> (draft or "none", k)
    predicted: dict[str, float]  # category -> predicted speedup of its recommendation
    routed_overall: float  # predicted overall speedup with each category's recommendation
    prompts: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] | None = None
    intervals: dict[str, list[float]] = field(default_factory=dict)  # category -> its pick's
    routed_interval: list[float] | None = None

    def choose(self, category: str) -> tuple[str, int]:
        """The recommended (draft spec, k) for a category; unknown ones get the overall pick."""
        return self.recommended.get(category, self.recommended["overall"])

    def candidate(self, category: str, draft: str, k: int) -> Candidate | None:
        for c in self.categories.get(category, []):
            if c.draft == draft and c.k == k:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "dtype": self.dtype,
            "greedy": self.greedy,
            "drafts": self.drafts,
            "ks": self.ks,
            "recommended": {c: {"draft": d, "k": k, "predicted_speedup": self.predicted[c],
                                "interval": self.intervals.get(c)}
                            for c, (d, k) in self.recommended.items()},
            "routed_overall_speedup": self.routed_overall,
            "routed_interval": self.routed_interval,
            "categories": {c: [vars(x) for x in cands] for c, cands in self.categories.items()},
            "prompts": self.prompts,
            "config": self.config,
            "validation": self.validation,
        }

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON, atomically."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the plan") -> Plan:
        """Read :meth:`to_dict`'s output; draft names are made canonical (older plans load)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source} is not a draftwise plan (a JSON {type(data).__name__}, not an object)")
        if data.get("schema") != PLAN_SCHEMA:
            raise ConfigError(f"{source} is not a draftwise plan (schema {data.get('schema')!r}, want {PLAN_SCHEMA!r})")

        def key(d: Any) -> str:
            return str(DraftSpec.parse(d))

        try:
            categories = {
                c: [Candidate(**{**x, "draft": key(x["draft"])}) for x in v] for c, v in data["categories"].items()
            }
            return cls(
                model=str(data["model"]),
                fingerprint=str(data["fingerprint"]),
                dtype=str(data["dtype"]),
                greedy=bool(data["greedy"]),
                drafts=[key(d) for d in data["drafts"]],
                ks=[int(k) for k in data["ks"]],
                categories=categories,
                recommended={c: (key(v["draft"]), int(v["k"])) for c, v in data["recommended"].items()},
                predicted={c: float(v["predicted_speedup"]) for c, v in data["recommended"].items()},
                routed_overall=float(data["routed_overall_speedup"]),
                prompts=list(data.get("prompts", [])),
                config=dict(data.get("config", {})),
                validation=data.get("validation"),
                intervals={c: [float(x) for x in v["interval"]] for c, v in data["recommended"].items()
                           if v.get("interval") is not None},
                routed_interval=data.get("routed_interval"),
            )
        except KeyError as exc:
            raise ConfigError(f"{source} is incomplete: it has no {exc} field; make it again with `draftwise plan`") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source} is malformed ({exc}); make it again with `draftwise plan`") from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by ``draftwise plan --out`` (the file, or the folder holding plan.json)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "plan.json"
    if not path.is_file():
        raise ConfigError(f"no plan at {path}; make one with `draftwise plan --out {path.parent}`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a plan: it is not UTF-8 text (binary?)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); pass a plan written by `draftwise plan --out`") from None
    return Plan.from_dict(data, source=str(path))


# -- making the plan -----------------------------------------------------------------------
def _aggregate(per_prompt: Sequence[dict[str, Any]]) -> float:
    """Spec-Bench speedup of predicted times: mean tokens/s of the method over plain's."""
    return mean_rate_speedup(
        [p["new_tokens"] / p["method_s"] for p in per_prompt],
        [p["new_tokens"] / p["plain_s"] for p in per_prompt],
    )


def as_questions(rows: Sequence[Question | dict[str, Any]]) -> list[Question]:
    """Questions as given, or Spec-Bench rows (``{"question_id", "category", "turns"}``) validated."""
    return [q if isinstance(q, Question) else parse_question(q, f"prompt {i}") for i, q in enumerate(rows, 1)]


def make_plan(
    model: Any,
    questions: Sequence[Question | dict[str, Any]],
    profile: Profile,
    *,
    drafts: Sequence[DraftSpec | str] = ("lookup", "self"),
    ks: Sequence[int] | None = None,
    k_run: int = 8,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    sure: bool = False,
    pick: str | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Plan:
    """Trace ``questions`` (already sampled: :func:`~draftwise.questions.select_questions`) with
    each draft, predict every (draft, k), recommend. Spec-Bench rows (dicts) are accepted too.

    Each prediction carries a 95% prediction interval from its binomial counts
    (:mod:`~draftwise.cost.intervals`). ``pick`` ranks the candidates of a category: ``"low"``
    by the low end of the interval (the default with sampling, where a prediction averages one
    random continuation), ``"point"`` by the prediction (the default in greedy mode, where the
    replay is exact on the traced prompts). The pick is used when its prediction beats plain
    decoding (``sure``: when even its interval's low end does)."""
    profile.check_model(model)
    cfg = sampling or SamplingConfig()
    sampled = not cfg.greedy
    pick = pick or ("low" if sampled else "point")
    if pick not in ("low", "point"):
        raise ConfigError(f"pick={pick!r} must be 'low' (the interval's low end) or 'point'")
    rows = as_questions(questions)
    if not rows:
        raise ConfigError("no prompts to plan on")
    if any(q.category == "overall" for q in rows):
        raise ConfigError("category 'overall' is reserved for the plan's whole-workload pick; rename it")
    specs = {str(s): s for s in map(DraftSpec.parse, drafts) if not s.is_none}
    drafts = list(specs)
    if not drafts:
        raise ConfigError("give at least one draft to plan for (e.g. --drafts lookup,self)")
    k_top = profile.max_n - 1
    ks = sorted(set(ks or range(1, min(k_run, k_top) + 1)))
    if ks[0] < 1:
        raise ConfigError(f"k must be >= 1, got {ks[0]}")
    if ks[-1] > k_top:
        raise ConfigError(f"the profile covers k <= {k_top}; k={ks[-1]} needs `draftwise profile --max-n {ks[-1] + 1}`")
    drafters = {d: make_drafter(spec, model, shared_cache=False) for d, spec in specs.items()}
    for d in drafts:
        profile.draft_time(d, 1)  # raises if the profile lacks this draft
    traced = [d for d in drafts if not replayable(specs[d])] or drafts[:1]
    if not cfg.greedy:
        traced = drafts  # sampled output is random: every draft needs its own run
    k_run = max(k_run, ks[-1]) if cfg.greedy else k_run

    generate(model, [1, 2, 3], max_new_tokens=2)  # warm up
    per: dict[tuple[str, int], list[dict[str, Any]]] = {}
    replays: dict[tuple[str, int], Any] = {}
    prompt_info = []
    total = len(rows) * len(traced)
    for qi, row in enumerate(rows):
        prompt_ids = model.encode_prompt(row.prompt)
        traces: dict[str, Trace] = {}
        for j, d in enumerate(traced):
            if progress:
                progress(f"{d} on q{row.question_id} ({row.category})", (qi * len(traced) + j) / total)
            traces[d] = trace_generation(
                model, prompt_ids, drafters[d], k_run, max_new_tokens, sampling=cfg,
                question_id=row.question_id, category=row.category,
            )
        ref = traces[traced[0]]
        info = {"question_id": row.question_id, "category": row.category,
                "prompt_tokens": len(prompt_ids), "new_tokens": ref.new_tokens, "equal": True}
        if cfg.greedy:
            info["equal"] = all(t.tokens == ref.tokens for t in traces.values())
        prompt_info.append(info)
        for d in drafts:
            for k in ks:
                if cfg.greedy and replayable(specs[d]):
                    if (d, k) not in replays:  # one per (draft, k), kept across prompts: a suffix
                        # draft's cache of earlier outputs grows as in a real run (a private one)
                        replays[(d, k)] = make_drafter(specs[d], model, shared_cache=False)
                    steps = replay_lookup(replays[(d, k)], prompt_ids, ref.tokens, k, max_new_tokens)
                elif cfg.greedy and not rates_only(specs[d]):
                    steps = replay_hits(traces[d].hits(), k, max_new_tokens)
                else:
                    steps = expected_steps(traces[d], k)
                tr = traces.get(d, ref)
                exact = cfg.greedy and not rates_only(specs[d])  # else: steps from the trace's rates
                method_s = predict_seconds(profile, d, steps, len(prompt_ids), tr.prefill_seconds, len(tr.tokens),
                                           sampled=sampled)
                per.setdefault((d, k), []).append({
                    "category": row.category, "new_tokens": max(tr.new_tokens, 1),
                    "plain_s": _plain_seconds(profile, tr, sampled), "method_s": method_s,
                    "fixed_s": predict_seconds(profile, d, [], len(prompt_ids), tr.prefill_seconds, len(tr.tokens)),
                    # the steps behind the interval: the replay's, or the sampled trace's cut to k
                    "trace": [(min(m, k), min(a, k)) for m, a in (steps if exact else tr.steps)],
                    "steps": len(steps) + 1, "committed": len(tr.tokens),
                    "proposed": sum(m for m, _ in steps), "accepted": sum(a for _, a in steps),
                    "proposing": sum(1 for m, _ in steps if m), "context": len(prompt_ids) + len(tr.tokens) / 2,
                })
    if progress:
        progress("predicting", 1.0)
    cats = list(dict.fromkeys(r.category for r in rows)) + ["overall"]
    # (category, draft, k) -> cost-ratio draws; every k of a draft uses the same uniform numbers
    # (one seed per category and draft), so its draws at different k move together
    draws: dict[tuple[str, str, int], Any] = {}
    for (d, k), items in per.items():
        phi = dispersion([x["trace"] for x in items])  # steps come in runs: fewer effective trials
        for c in cats[:-1]:
            mine = [x for x in items if x["category"] == c]
            pooled = sum((counts_from_steps(x["trace"], k) for x in mine), Counts())
            context = statistics.mean(x["context"] for x in mine)
            u = uniforms(zlib.crc32(f"{c}\0{d}".encode()), ks[-1])
            draws[(c, d, k)] = cost_ratio_draws(profile, d, k, pooled, context, u, phi=phi, sampled=sampled)
    categories: dict[str, list[Candidate]] = {}
    for c in cats:
        cands = []
        for (d, k), items in per.items():
            mine = [x for x in items if c == "overall" or x["category"] == c]
            cand = _candidate(profile, d, k, mine, sampled)
            values = speedup_draws(mine, [draws[(x["category"], d, k)] for x in mine])
            cand.interval = list(percentile_interval(values, cand.speedup))
            cands.append(cand)
        if pick == "low":
            categories[c] = sorted(cands, key=lambda x: (-(x.interval or [x.speedup])[0], -x.speedup))
        else:
            categories[c] = sorted(cands, key=lambda x: -x.speedup)
    recommended: dict[str, tuple[str, int]] = {}
    predicted: dict[str, float] = {}
    intervals: dict[str, list[float]] = {}
    for c in cats:
        best = categories[c][0]
        lo = (best.interval or [best.speedup])[0]
        if best.speedup > 1.0 and (lo > 1.0 or not sure):
            recommended[c], predicted[c] = (best.draft, best.k), best.speedup
            intervals[c] = list(best.interval or [best.speedup, best.speedup])
        else:
            recommended[c], predicted[c], intervals[c] = (NONE, 0), 1.0, [1.0, 1.0]
    routed, routed_draws = [], []
    for qi, row in enumerate(rows):
        d, k = recommended[row.category]
        if d == NONE:
            item = dict(per[(drafts[0], ks[0])][qi])
            item["method_s"] = item["plain_s"]
            routed_draws.append(np.ones(len(next(iter(draws.values())))))  # plain: no uncertainty
        else:
            item = per[(d, k)][qi]
            routed_draws.append(draws[(row.category, d, k)])
        routed.append(item)
    routed_overall = _aggregate(routed)
    return Plan(
        model=model.name,
        fingerprint=profile.fingerprint,
        dtype=profile.dtype,
        greedy=cfg.greedy,
        drafts=drafts,
        ks=list(ks),
        categories=categories,
        recommended=recommended,
        predicted=predicted,
        routed_overall=routed_overall,
        intervals=intervals,
        routed_interval=list(percentile_interval(speedup_draws(routed, routed_draws), routed_overall)),
        prompts=prompt_info,
        config={"max_new_tokens": max_new_tokens, "k_run": k_run, "temperature": cfg.temperature, "pick": pick,
                "profile_created": profile.created, "date": time.strftime("%Y-%m-%d %H:%M")},
    )


def _plain_seconds(profile: Profile, tr: Trace, sampled: bool) -> float:
    """Plain decoding of as many tokens as ``tr`` committed (sampled traces differ in length)."""
    steps = [(0, 0)] * (len(tr.tokens) - 1)
    return predict_seconds(profile, NONE, steps, tr.prompt_len, tr.prefill_seconds, len(tr.tokens), sampled=sampled)


def _candidate(profile: Profile, draft: str, k: int, items: Sequence[dict[str, Any]], sampled: bool) -> Candidate:
    proposed = sum(x["proposed"] for x in items)
    accepted = sum(x["accepted"] for x in items)
    proposing = sum(x["proposing"] for x in items)
    context = statistics.mean(x["context"] for x in items)
    per_step = 1 + accepted / proposing if proposing else 1.0
    ratio = profile.step_cost_ratio(draft, k, context, sampled=sampled)
    return Candidate(
        draft=draft,
        k=k,
        speedup=_aggregate(items),
        mat=sum(x["committed"] for x in items) / sum(x["steps"] for x in items),
        acceptance=accepted / proposed if proposed else None,
        effective_acceptance=effective_acceptance(min(per_step, k + 1), k) if proposing else None,
        breakeven=breakeven_acceptance(k, ratio),
    )
