"""The planner: run each draft on a sample of the workload, predict every (draft, k), recommend.

How a prediction is made (greedy decoding, which is deterministic):

1. The target decodes each sampled prompt once per draft, speculatively at ``k_max``. The
   committed tokens are the plain greedy output whatever the draft, so one run gives the
   exact token sequence plain decoding would produce.
2. *Which* tokens a draft gets right does not depend on k:

   - prompt lookup is a pure function of the context, so its steps at any k are replayed
     exactly, offline, on the committed tokens (no model pass at all);
   - a model or self draft proposes its own greedy chain; in the ``k_max`` run every output
     position was either accepted, rejected, or a bonus token. That per-position record
     ("did the draft, given the true prefix, predict this token?") is replayed for any
     k <= k_max, bonus positions counting as hits.

3. Each replayed step costs ``D(m) + step(m + 1, context)`` from the machine profile (m tokens
   proposed), each committed token ``token_overhead``, and the prefill what it took. Plain
   decoding is the same sum with m = 0. Predicted speedup = mean tokens/s of the method /
   mean tokens/s of plain decoding over the prompts (Spec-Bench's convention).

With sampling (temperature > 0) the output is random, so step 2 uses the measured
conditional acceptance per draft position instead: E = 1 + sum_i prod_{j<=i} a_j.

"No speculation" is always a candidate: a category whose best draft does not beat plain
decoding is told to decode plainly.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..plots import write_json
from ..sampling import SamplingConfig
from .model import breakeven_acceptance, effective_acceptance, expected_committed_by_position
from .profile import Profile

PLAN_SCHEMA = "draftwise.plan/1"
NONE = "none"


# -- one traced generation -----------------------------------------------------------------
@dataclass
class Trace:
    """One prompt decoded with one draft at k: the committed tokens and every step."""

    question_id: Any
    category: str
    prompt_len: int
    tokens: list[int]  # committed tokens, an ending EOS included
    new_tokens: int  # tokens a user sees (the ending EOS excluded)
    steps: list[tuple[int, int]]  # (proposed, accepted) per step after the prefill
    prefill_seconds: float
    seconds: float
    k: int

    def hits(self) -> list[int | None]:
        """Per output position: 1 the draft predicted it, 0 it did not, None untested."""
        out: list[int | None] = [None] * len(self.tokens)
        pos = 1  # position 0 came from the prefill
        for m, acc in self.steps:
            for i in range(min(acc, len(out) - pos)):  # an EOS may end the output mid-step
                out[pos + i] = 1
            if acc < m and pos + acc < len(out):
                out[pos + acc] = 0
            pos += acc + 1
        return out


def trace_generation(
    model: Any,
    prompt_ids: Sequence[int],
    drafter: Any,
    k: int,
    max_new_tokens: int,
    *,
    sampling: SamplingConfig | None = None,
    question_id: Any = None,
    category: str = "",
) -> Trace:
    """Decode like :func:`draftwise.generate` and record each step's (proposed, accepted)."""
    from ..decode import decode_steps

    cfg = sampling or SamplingConfig()
    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    new = 0
    start = time.perf_counter()
    prefill = 0.0
    gen = decode_steps(
        model.runtime, prompt_ids, cfg, cfg.generator(), drafter=drafter, k=k,
        max_new_tokens=max_new_tokens,
    )
    done = False
    for step in gen:
        if not prefill:
            prefill = time.perf_counter() - start
        else:
            steps.append((step.num_proposed, step.verdict.accepted))
        for token in step.verdict.tokens:
            tokens.append(token)
            if token in model.eos_token_ids:
                done = True
                break
            new += 1
            if new >= max_new_tokens:
                done = True
                break
        if done:
            break
    gen.close()
    return Trace(
        question_id=question_id,
        category=category,
        prompt_len=len(prompt_ids),
        tokens=tokens,
        new_tokens=new,
        steps=steps,
        prefill_seconds=prefill,
        seconds=time.perf_counter() - start,
        k=k,
    )


# -- replaying a trace at another k --------------------------------------------------------
def replay_lookup(
    make: Callable[[], Any], prompt_ids: Sequence[int], tokens: Sequence[int], k: int, max_new_tokens: int
) -> list[tuple[int, int]]:
    """The (proposed, accepted) steps prompt lookup would take at this k (greedy, exact)."""
    drafter = make()
    drafter.start(list(prompt_ids), SamplingConfig(), torch.Generator())
    context = list(prompt_ids) + list(tokens[:1])
    pos, steps = 1, []
    while pos < len(tokens):
        budget = min(k, max_new_tokens - pos - 1)
        proposal = drafter.propose(context, budget).tokens if budget > 0 else []
        acc = 0
        while acc < len(proposal) and pos + acc < len(tokens) and proposal[acc] == tokens[pos + acc]:
            acc += 1
        steps.append((len(proposal), acc))
        context.extend(tokens[pos : pos + acc + 1])
        pos += acc + 1
    return steps


def replay_hits(hits: Sequence[int | None], k: int, max_new_tokens: int) -> list[tuple[int, int]]:
    """The steps a fixed-length draft takes at this k, from its per-position hit record."""
    pos, steps = 1, []
    n = len(hits)
    while pos < n:
        m = max(min(k, max_new_tokens - pos - 1), 0)
        acc = 0
        while acc < m and pos + acc < n and hits[pos + acc] != 0:
            acc += 1
        steps.append((m, acc))
        pos += acc + 1
    return steps


def predict_seconds(
    profile: Profile,
    draft: str,
    steps: Sequence[tuple[int, int]],
    prompt_len: int,
    prefill_seconds: float,
    committed: int,
) -> float:
    """Wall time of a generation taking ``steps``, from the profile's costs."""
    total = prefill_seconds + committed * profile.token_overhead
    pos = prompt_len + 1
    for m, acc in steps:
        d = profile.draft_time(draft, m) if draft != NONE else 0.0
        if draft.startswith("lookup") and m == 0:
            d = profile.draft_time(draft, 1)  # the look-up ran and found nothing
        total += d + profile.step_time(m + 1, pos)
        pos += acc + 1
    return total


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
            "recommended": {c: {"draft": d, "k": k, "predicted_speedup": self.predicted[c]}
                            for c, (d, k) in self.recommended.items()},
            "routed_overall_speedup": self.routed_overall,
            "categories": {c: [vars(x) for x in cands] for c, cands in self.categories.items()},
            "prompts": self.prompts,
            "config": self.config,
            "validation": self.validation,
        }

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        if data.get("schema") != PLAN_SCHEMA:
            raise ConfigError(f"not a draftwise plan (schema {data.get('schema')!r}, want {PLAN_SCHEMA!r})")
        try:
            return cls(
                model=data["model"],
                fingerprint=data["fingerprint"],
                dtype=data["dtype"],
                greedy=data["greedy"],
                drafts=list(data["drafts"]),
                ks=list(data["ks"]),
                categories={c: [Candidate(**x) for x in v] for c, v in data["categories"].items()},
                recommended={c: (v["draft"], int(v["k"])) for c, v in data["recommended"].items()},
                predicted={c: float(v["predicted_speedup"]) for c, v in data["recommended"].items()},
                routed_overall=float(data["routed_overall_speedup"]),
                prompts=list(data.get("prompts", [])),
                config=dict(data.get("config", {})),
                validation=data.get("validation"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"the plan is incomplete or malformed: {exc!r}") from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by ``draftwise plan --out``."""
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    if not path.is_file():
        raise ConfigError(f"no plan at {path}; make one with `draftwise plan --out {path.parent}`")
    try:
        return Plan.from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None


# -- reading a workload --------------------------------------------------------------------
def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """Spec-Bench JSONL (``{"question_id", "category", "turns": [...]}``) or plain text with one
    prompt a line (category ``prompts``). Empty files and malformed lines are errors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not any(line.strip() for line in lines):
        raise ConfigError(f"prompt file {path} is empty; give one prompt a line or Spec-Bench JSONL")
    if path.suffix == ".jsonl" or lines[0].lstrip().startswith("{"):
        from ..bench.runtime import load_questions

        return [
            {"question_id": r.get("question_id", i), "category": str(r.get("category", "prompts")),
             "turns": r["turns"]}
            for i, r in enumerate(load_questions(path), 1)
        ]
    return [
        {"question_id": i, "category": "prompts", "turns": [line.strip()]}
        for i, line in enumerate(lines, 1)
        if line.strip()
    ]


def sample_prompts(rows: Sequence[dict[str, Any]], per_category: int) -> list[dict[str, Any]]:
    """The first ``per_category`` prompts of each category, in file order."""
    taken: dict[str, int] = {}
    out = []
    for row in rows:
        c = row["category"]
        if taken.get(c, 0) < per_category:
            taken[c] = taken.get(c, 0) + 1
            out.append(row)
    return out


# -- making the plan -----------------------------------------------------------------------
def _aggregate(per_prompt: Sequence[dict[str, Any]]) -> float:
    """Spec-Bench speedup: mean tokens/s of the method over mean tokens/s of plain decoding."""
    plain = statistics.mean(p["new_tokens"] / p["plain_s"] for p in per_prompt)
    mine = statistics.mean(p["new_tokens"] / p["method_s"] for p in per_prompt)
    return mine / plain


def make_plan(
    model: Any,
    rows: Sequence[dict[str, Any]],
    profile: Profile,
    *,
    drafts: Sequence[str] = ("lookup", "self"),
    ks: Sequence[int] | None = None,
    k_run: int = 8,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> Plan:
    """Trace ``rows`` (already sampled) with each draft, predict every (draft, k), recommend."""
    from ..drafters import make_drafter

    profile.check_model(model)
    cfg = sampling or SamplingConfig()
    if not rows:
        raise ConfigError("no prompts to plan on")
    drafts = [d for d in dict.fromkeys(drafts) if d != NONE]
    if not drafts:
        raise ConfigError("give at least one draft to plan for (e.g. --drafts lookup,self)")
    k_top = profile.max_n - 1
    ks = sorted(set(ks or range(1, min(k_run, k_top) + 1)))
    if ks[0] < 1:
        raise ConfigError(f"k must be >= 1, got {ks[0]}")
    if ks[-1] > k_top:
        raise ConfigError(f"the profile covers k <= {k_top}; k={ks[-1]} needs `draftwise profile --max-n {ks[-1] + 1}`")
    drafters = {d: make_drafter(d, model) for d in drafts}
    for d in drafts:
        profile.draft_time(d, 1)  # raises if the profile lacks this draft
    traced = [d for d in drafts if not d.startswith("lookup")] or drafts[:1]
    if not cfg.greedy:
        traced = drafts  # sampled output is random: every draft needs its own run
    k_run = max(k_run, ks[-1]) if cfg.greedy else k_run

    from ..decode import generate

    generate(model, [1, 2, 3], max_new_tokens=2)  # warm up
    per: dict[tuple[str, int], list[dict[str, Any]]] = {}
    prompt_info = []
    total = len(rows) * len(traced)
    for qi, row in enumerate(rows):
        prompt_ids = model.encode_prompt(row["turns"][0])
        traces: dict[str, Trace] = {}
        for j, d in enumerate(traced):
            if progress:
                progress(f"{d} on q{row['question_id']} ({row['category']})", (qi * len(traced) + j) / total)
            traces[d] = trace_generation(
                model, prompt_ids, drafters[d], k_run, max_new_tokens, sampling=cfg,
                question_id=row["question_id"], category=row["category"],
            )
        ref = traces[traced[0]]
        info = {"question_id": row["question_id"], "category": row["category"],
                "prompt_tokens": len(prompt_ids), "new_tokens": ref.new_tokens, "equal": True}
        if cfg.greedy:
            info["equal"] = all(t.tokens == ref.tokens for t in traces.values())
        prompt_info.append(info)
        plain_steps = [(0, 0)] * (len(ref.tokens) - 1)
        plain_s = predict_seconds(profile, NONE, plain_steps, len(prompt_ids), ref.prefill_seconds, len(ref.tokens))
        for d in drafts:
            for k in ks:
                if cfg.greedy and d.startswith("lookup"):
                    steps = replay_lookup(lambda d=d: make_drafter(d, model), prompt_ids, ref.tokens, k, max_new_tokens)
                elif cfg.greedy:
                    steps = replay_hits(traces[d].hits(), k, max_new_tokens)
                else:
                    steps = _expected_steps(traces[d], k)
                tr = traces.get(d, ref)
                method_s = predict_seconds(profile, d, steps, len(prompt_ids), tr.prefill_seconds, len(tr.tokens))
                per.setdefault((d, k), []).append({
                    "category": row["category"], "new_tokens": max(tr.new_tokens, 1),
                    "plain_s": plain_s, "method_s": method_s,
                    "steps": len(steps) + 1, "committed": len(tr.tokens),
                    "proposed": sum(m for m, _ in steps), "accepted": sum(a for _, a in steps),
                    "proposing": sum(1 for m, _ in steps if m), "context": len(prompt_ids) + len(tr.tokens) / 2,
                })
    if progress:
        progress("predicting", 1.0)
    cats = list(dict.fromkeys(r["category"] for r in rows)) + ["overall"]
    categories: dict[str, list[Candidate]] = {}
    for c in cats:
        cands = []
        for (d, k), items in per.items():
            mine = [x for x in items if c == "overall" or x["category"] == c]
            cands.append(_candidate(profile, d, k, mine))
        categories[c] = sorted(cands, key=lambda x: -x.speedup)
    recommended: dict[str, tuple[str, int]] = {}
    predicted: dict[str, float] = {}
    for c in cats:
        best = categories[c][0]
        if best.speedup > 1.0:
            recommended[c], predicted[c] = (best.draft, best.k), best.speedup
        else:
            recommended[c], predicted[c] = (NONE, 0), 1.0
    routed = []
    for qi, row in enumerate(rows):
        d, k = recommended[row["category"]]
        if d == NONE:
            item = dict(per[(drafts[0], ks[0])][qi])
            item["method_s"] = item["plain_s"]
        else:
            item = per[(d, k)][qi]
        routed.append(item)
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
        routed_overall=_aggregate(routed),
        prompts=prompt_info,
        config={"max_new_tokens": max_new_tokens, "k_run": k_run, "temperature": cfg.temperature,
                "profile_created": profile.created, "date": time.strftime("%Y-%m-%d %H:%M")},
    )


def _expected_steps(trace: Trace, k: int) -> list[tuple[int, int]]:
    """Sampling: steps at k as the measured conditional rates predict them (fractional)."""
    tested = [0] * trace.k
    accepted = [0] * trace.k
    proposing = [m for m, _ in trace.steps if m]
    for m, acc in trace.steps:
        for i in range(min(acc + 1, m)):
            tested[i] += 1
        for i in range(acc):
            accepted[i] += 1
    rates = [a / t if t else 0.0 for a, t in zip(accepted, tested)] or [0.0]
    share = len(proposing) / max(len(trace.steps), 1)  # steps where the draft proposed at all
    e = expected_committed_by_position(rates, k)
    per_step = share * e + (1 - share)
    n_steps = max(round((len(trace.tokens) - 1) / per_step), 1)
    n_prop = round(n_steps * share)
    acc_each = round(e - 1)
    return [(k, acc_each)] * n_prop + [(0, 0)] * (n_steps - n_prop)


def _candidate(profile: Profile, draft: str, k: int, items: Sequence[dict[str, Any]]) -> Candidate:
    proposed = sum(x["proposed"] for x in items)
    accepted = sum(x["accepted"] for x in items)
    proposing = sum(x["proposing"] for x in items)
    context = statistics.mean(x["context"] for x in items)
    per_step = 1 + accepted / proposing if proposing else 1.0
    ratio = profile.step_cost_ratio(draft, k, context)
    return Candidate(
        draft=draft,
        k=k,
        speedup=_aggregate(items),
        mat=sum(x["committed"] for x in items) / sum(x["steps"] for x in items),
        acceptance=accepted / proposed if proposed else None,
        effective_acceptance=effective_acceptance(min(per_step, k + 1), k) if proposing else None,
        breakeven=breakeven_acceptance(k, ratio),
    )
