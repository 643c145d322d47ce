"""A plan as data and as a file: for each category of a workload, every (draft, k) with its
predicted speedup and interval, and the recommended one. :func:`draftwise.planner.plan.make_plan`
makes it; ``draftwise plan --out`` writes it, ``load_plan`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.fsutil import read_json, write_json_atomic

PLAN_SCHEMA = "draftwise.plan/2"
#: plans this version reads: /1 had no continuations per prompt, no per-unit speedups and no
#: ``auto`` candidate; they load with those empty
READABLE_SCHEMAS = ("draftwise.plan/1", PLAN_SCHEMA)
NONE = "none"
AUTO = "auto"  # the k of the adaptive policy (``--k auto``), a candidate like any fixed k


@dataclass
class Candidate:
    draft: str
    k: int | str  # a fixed k, or "auto" (the adaptive policy)
    speedup: float
    mat: float
    acceptance: float | None  # accepted / proposed in the replay
    effective_acceptance: float | None  # the i.i.d. a with E(a, k) = 1 + accepted per proposing step
    breakeven: float | None  # a*(k) from the profile's costs (None: never pays)
    interval: list[float] | None = None  # 95% prediction interval of the speedup (intervals.py)
    #: each unit's predicted speedup (a prompt and one continuation of it: plain's predicted
    #: seconds over the method's for the same tokens), in the plan's order of prompts
    samples: list[float] | None = None


@dataclass
class Plan:
    model: str
    fingerprint: str
    dtype: str
    greedy: bool
    drafts: list[str]
    ks: list[int | str]  # the candidates' k: numbers, and "auto" when the plan considered it
    categories: dict[str, list[Candidate]]  # category or "overall" -> every candidate
    recommended: dict[str, tuple[str, int | str]]  # category -> (draft or "none", k or "auto")
    predicted: dict[str, float]  # category -> predicted speedup of its recommendation
    routed_overall: float  # predicted overall speedup with each category's recommendation
    prompts: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] | None = None
    intervals: dict[str, list[float]] = field(default_factory=dict)  # category -> its pick's
    routed_interval: list[float] | None = None
    #: category -> a sentence where its pick's units differ widely (plan.spread_note)
    notes: dict[str, str] = field(default_factory=dict)

    def choose(self, category: str) -> tuple[str, int | str]:
        """The recommended (draft spec, k) for a category; unknown ones get the overall pick."""
        return self.recommended.get(category, self.recommended["overall"])

    def candidate(self, category: str, draft: str, k: int | str) -> Candidate | None:
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
            "notes": self.notes,
        }

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON, atomically."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the plan") -> Plan:
        """Read :meth:`to_dict`'s output; draft names are made canonical (older plans load)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source} is not a draftwise plan (a JSON {type(data).__name__}, not an object)")
        if data.get("schema") not in READABLE_SCHEMAS:
            raise ConfigError(f"{source} is not a draftwise plan this version reads (schema {data.get('schema')!r}, "
                              f"want {PLAN_SCHEMA!r}); make it again with `draftwise plan`")

        def key(d: Any) -> str:
            return str(DraftSpec.parse(d))

        try:
            categories = {
                c: [Candidate(**{**x, "draft": key(x["draft"]), "k": _k(x["k"])}) for x in v]
                for c, v in data["categories"].items()
            }
            return cls(
                model=str(data["model"]),
                fingerprint=str(data["fingerprint"]),
                dtype=str(data["dtype"]),
                greedy=bool(data["greedy"]),
                drafts=[key(d) for d in data["drafts"]],
                ks=[_k(k) for k in data["ks"]],
                categories=categories,
                recommended={c: (key(v["draft"]), _k(v["k"])) for c, v in data["recommended"].items()},
                predicted={c: float(v["predicted_speedup"]) for c, v in data["recommended"].items()},
                routed_overall=float(data["routed_overall_speedup"]),
                prompts=list(data.get("prompts", [])),
                config=dict(data.get("config", {})),
                validation=data.get("validation"),
                intervals={c: [float(x) for x in v["interval"]] for c, v in data["recommended"].items()
                           if v.get("interval") is not None},
                routed_interval=data.get("routed_interval"),
                notes={str(c): str(v) for c, v in (data.get("notes") or {}).items()},
            )
        except KeyError as exc:
            raise ConfigError(f"{source} is incomplete: it has no {exc} field; make it again with `draftwise plan`") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source} is malformed ({exc}); make it again with `draftwise plan`") from None


def _k(value: Any) -> int | str:
    """A k as a plan file holds it: a number, or "auto"."""
    return AUTO if value == AUTO else int(value)


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by ``draftwise plan --out`` (the file, or the folder holding plan.json)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "plan.json"
    if not path.is_file():
        raise ConfigError(f"no plan at {path}; make one with `draftwise plan --out {path.parent}`")
    return Plan.from_dict(read_json(path, "plan", "draftwise plan --out"), source=str(path))
