"""``draftwise bench``: a Spec-Bench-compatible benchmark of every draft against plain decoding.

What one run does, on one loaded model, in one process:

1. reads Spec-Bench questions (``{"question_id", "category", "turns": [...]}`` per line);
   multi-turn questions are conversations through the chat template, with the model's *own*
   earlier answers in the history (models without a chat template get the turns as raw text);
2. runs plain decoding (method ``none``), every draft method and the optional peers (Hugging
   Face ``generate``) on the same prompts, *interleaved* question by question with the order
   rotating, so that the noise of a shared machine hits every method alike;
3. writes one Spec-Bench answer file per method (``DIR/answers/<method>.jsonl``, flushed line
   by line), then ``summary.json``, ``summary.md`` and PNG plots.

Conventions, as in Spec-Bench (hemingkx/Spec-Bench, ``evaluation/speed.py``):

- tokens/s of a question = its new tokens over its wall time, all turns together (prefill
  included); a method's tokens/s = the mean over questions;
- speedup = mean tokens/s of the method / mean tokens/s of ``none`` over the *same* questions;
- #MAT (``mat``) = committed tokens / target passes, the recovered or bonus token included
  (so plain decoding has exactly 1);
- acceptance = accepted / proposed draft tokens; draft_time_share = draft seconds / wall time.

Greedy runs also check losslessness: every method's tokens must equal the baseline's, turn by
turn; a mismatch is reported with the first diverging position and the target's top-2 logit
margin there, so that near-ties (bf16 rounding) are told apart from bugs.

Example::

    from draftwise import load_model
    from draftwise.bench.harness import run_bench
    model = load_model("default")
    summary = run_bench(model, "question_dev.jsonl", drafts=["lookup", "self"], k=4,
                        max_new_tokens=64, limit_per_category=1, out_dir="bench-out")
    summary["groups"]["overall"]["lookup"]["speedup"]
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ..errors import ConfigError, ContextLengthError
from ..plots import pyplot, save_figure

#: Spec-Bench's 13 categories, grouped the way its tables report them.
GROUPS: dict[str, tuple[str, ...]] = {
    "mt_bench": (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
    ),
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
CATEGORIES: tuple[str, ...] = tuple(c for cats in GROUPS.values() for c in cats)
GROUP_ORDER: tuple[str, ...] = (*GROUPS, "overall")
BASELINE = "none"
PEERS = ("hf",)
#: prompt-lookup tokens for ``hf-lookup`` when ``k`` is ``"auto"``
HF_LOOKUP_DEFAULT = 10
_LLAMA_FAMILY = ("llama",)

KValue = Union[int, str]  # an int >= 1, or "auto"
DraftItem = Union[str, tuple[str, KValue]]


# -- questions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One Spec-Bench question; ``line`` is its line number in the file (1-based)."""

    question_id: Any
    category: str
    turns: tuple[str, ...]
    line: int = 0


def category_group(category: str) -> str:
    """The Spec-Bench group a category belongs to.

    >>> category_group("roleplay"), category_group("rag")
    ('mt_bench', 'rag')
    """
    for group, cats in GROUPS.items():
        if category in cats:
            return group
    raise ConfigError(f"unknown category {category!r}; Spec-Bench has: {', '.join(CATEGORIES)}")


def parse_question(row: Any, where: str) -> Question:
    """Validate one decoded JSONL row; ``where`` (``"file:line"``) goes into the error."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "question_id" not in row:
        raise ConfigError(f"{where}: missing 'question_id'")
    if "category" not in row:
        raise ConfigError(f"{where}: missing 'category' (one of: {', '.join(CATEGORIES)})")
    category = row["category"]
    if category not in CATEGORIES:
        raise ConfigError(
            f"{where}: unknown category {category!r}; Spec-Bench has: {', '.join(CATEGORIES)}"
        )
    turns = row.get("turns")
    if "turns" not in row:
        raise ConfigError(f"{where}: missing 'turns' (a list of prompt strings)")
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(t, str) and t.strip() for t in turns)
    ):
        raise ConfigError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    return Question(row["question_id"], category, tuple(turns))


def read_questions(path: str | Path) -> list[Question]:
    """The questions of a Spec-Bench JSONL file, validated; errors name the line.

    Blank lines are skipped; question ids must be unique (answers are keyed by them).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"questions file not found: {path}; pass a Spec-Bench-format .jsonl file "
            "(one {'question_id', 'category', 'turns': [...]} object per line)"
        )
    out: list[Question] = []
    seen: dict[Any, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where} is not valid JSON: {exc}") from exc
            q = parse_question(row, where)
            key = json.dumps(q.question_id)
            if key in seen:
                raise ConfigError(
                    f"{where}: question_id {q.question_id!r} repeats line {seen[key]}; "
                    "ids must be unique"
                )
            seen[key] = lineno
            out.append(Question(q.question_id, q.category, q.turns, lineno))
    if not out:
        raise ConfigError(f"questions file {path} is empty; it needs at least one question")
    return out


def select_questions(questions: Sequence[Question], limit_per_category: int | None) -> list[Question]:
    """The first ``limit_per_category`` questions of each category, in file order.

    >>> qs = [Question(i, c, ("q",)) for i, c in enumerate(["qa", "qa", "rag", "qa"])]
    >>> [q.question_id for q in select_questions(qs, 1)]
    [0, 2]
    """
    if limit_per_category is None:
        return list(questions)
    if isinstance(limit_per_category, bool) or not isinstance(limit_per_category, int) or limit_per_category < 1:
        raise ConfigError(f"limit_per_category={limit_per_category!r} must be an integer >= 1")
    taken: dict[str, int] = {}
    out = []
    for q in questions:
        if taken.get(q.category, 0) < limit_per_category:
            taken[q.category] = taken.get(q.category, 0) + 1
            out.append(q)
    return out


def build_prompt(model: Any, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Token ids of a conversation up to the next answer: ``turns[i]`` from the user, then
    ``answers[i]`` from the assistant, for ``len(turns) == len(answers) + 1``.

    With a chat template, the template with ``add_generation_prompt=True``; without one, the
    turns and answers joined by blank lines, as raw text.
    """
    assert len(turns) == len(answers) + 1
    tok = model.tokenizer
    if getattr(tok, "chat_template", None):
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    parts: list[str] = []
    for i, turn in enumerate(turns):
        parts.append(turn)
        if i < len(answers):
            parts.append(answers[i])
    return [int(i) for i in tok("\n\n".join(parts), add_special_tokens=True)["input_ids"]]


# -- methods ---------------------------------------------------------------------------------


@dataclass
class Method:
    """One row of the benchmark: plain decoding, a draft with its k, ``auto`` or a peer."""

    name: str
    kind: str  # "draftwise" | "auto" | "hf"
    spec: str = BASELINE  # draft spec (draftwise) or peer variant (hf)
    k: KValue = 4
    drafter: Any = None
    hf_kwargs: dict[str, Any] = field(default_factory=dict)


def parse_k(value: Any) -> KValue:
    """``4`` / ``"4"`` -> 4; ``"auto"`` -> ``"auto"``; anything else is a ConfigError.

    >>> parse_k("8"), parse_k("auto")
    (8, 'auto')
    """
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"k={text!r} must be an integer >= 1 or 'auto'") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"k={value!r} must be an integer >= 1 or 'auto'")
    return value


def parse_drafts(drafts: str | Sequence[DraftItem], k: KValue) -> list[tuple[str, str, KValue]]:
    """Draft items -> ``(method name, spec, k)``; ``none`` is dropped (it always runs).

    A plain spec takes the global ``k`` and is named by itself; a ``(spec, k)`` pair is named
    ``spec@k=K`` so one run can compare several k.

    >>> parse_drafts("none,lookup, self", 4)
    [('lookup', 'lookup', 4), ('self', 'self', 4)]
    >>> parse_drafts([("lookup", 4), ("lookup", 8)], 4)
    [('lookup@k=4', 'lookup', 4), ('lookup@k=8', 'lookup', 8)]
    >>> parse_drafts("lookup@k=8,self@2", 4)
    [('lookup@k=8', 'lookup', 8), ('self@k=2', 'self', 2)]
    """
    items: list[DraftItem]
    if isinstance(drafts, str):
        items = [d.strip() for d in drafts.split(",") if d.strip()]
    else:
        items = list(drafts)
    out: list[tuple[str, str, KValue]] = []
    for item in items:
        if isinstance(item, tuple):
            spec, item_k = str(item[0]).strip(), parse_k(item[1])
            name = f"{spec}@k={item_k}"
        elif isinstance(item, str) and "@" in item:  # "lookup@k=4" or "lookup@4"
            spec, _, k_text = item.strip().partition("@")
            item_k = parse_k(k_text.removeprefix("k="))
            spec, name = spec.strip(), f"{spec.strip()}@k={item_k}"
        elif isinstance(item, str):
            spec, item_k, name = item.strip(), k, item.strip()
        else:
            raise ConfigError(f"draft {item!r} is neither a spec string nor a (spec, k) pair")
        if spec == BASELINE:
            continue
        if any(name == n for n, _, _ in out):
            raise ConfigError(f"draft {name!r} is listed twice")
        out.append((name, spec, item_k))
    return out


def method_filename(name: str) -> str:
    """A file name for a method's answers.

    >>> method_filename("model:/models/small@k=4")
    'model_models_small@k=4.jsonl'
    """
    return re.sub(r"[^A-Za-z0-9._@=+-]+", "_", name).strip("_") + ".jsonl"


def _load_plan(plan: Any, out_dir: Path | None) -> Any:
    """A plan object with ``choose(category) -> (spec, k)``: given, read from a path, or
    ``DIR/plan.json``."""
    if plan is not None and hasattr(plan, "choose"):
        return plan
    path = Path(plan).expanduser() if plan is not None else (out_dir / "plan.json" if out_dir else None)
    if path is not None and path.is_dir():
        path = path / "plan.json"
    if path is None or not path.is_file():
        where = f" ({path} does not exist)" if path is not None else ""
        raise ConfigError(
            "--drafts auto needs a plan: run `draftwise plan ... --out DIR` first or pass "
            f"--plan FILE{where}"
        )
    try:
        from ..cost.plan import load_plan
    except ImportError as exc:
        raise ConfigError(
            f"--drafts auto needs draftwise.cost.plan, which this installation lacks ({exc})"
        ) from exc
    return load_plan(path)


def _draft_folder(spec: str) -> Path:
    """The Hugging Face folder of a ``model:PATH`` draft (GGUF files are converted, cached)."""
    from ..loaders import gguf_to_folder, resolve_model

    _, source = resolve_model(spec.partition(":")[2])
    return gguf_to_folder(source) if source.is_file() else source


def build_methods(
    model: Any,
    drafts: str | Sequence[DraftItem],
    k: KValue,
    peers: Sequence[str],
) -> list[Method]:
    """The baseline, one method per draft (drafters built once here) and the peers' methods."""
    from ..drafters import make_drafter

    methods = [Method(BASELINE, "draftwise", BASELINE, 1)]
    for name, spec, mk in parse_drafts(drafts, k):
        if spec == "auto":
            methods.append(Method(name, "auto", "auto", mk))
        else:
            methods.append(Method(name, "draftwise", spec, mk, drafter=make_drafter(spec, model)))
    for peer in peers:
        if peer not in PEERS:
            raise ConfigError(f"unknown peer {peer!r}; known peers: {', '.join(PEERS)}")
    if "hf" in peers:
        methods += _hf_methods(model, methods, k)
    return methods


def _hf_methods(model: Any, methods: Sequence[Method], k: KValue) -> list[Method]:
    """``hf``, ``hf-lookup``, and ``hf-assistant`` / ``hf-early-exit`` where they apply."""
    num_k = k if isinstance(k, int) else None
    out = [
        Method("hf", "hf", "plain"),
        Method("hf-lookup", "hf", "lookup", hf_kwargs={"prompt_lookup_num_tokens": num_k or HF_LOOKUP_DEFAULT}),
    ]
    assisted = {"num_assistant_tokens": num_k} if num_k else {}
    model_drafts = [m for m in methods if m.spec.startswith("model:")]
    if model_drafts:
        out.append(
            Method("hf-assistant", "hf", model_drafts[0].spec,
                   hf_kwargs={"assistant_folder": str(_draft_folder(model_drafts[0].spec)), **assisted})
        )
    if getattr(model.config, "model_type", None) in _LLAMA_FAMILY:
        layer = model.runtime.num_layers // 2
        for m in methods:
            layers = getattr(m.drafter, "layers", None)
            if layers and list(layers) == list(range(len(layers))):  # an early-exit self draft
                layer = len(layers)
                break
        out.append(
            Method("hf-early-exit", "hf", f"early-exit:{layer}",
                   hf_kwargs={"assistant_early_exit": layer, **assisted})
        )
    return out


# -- running ---------------------------------------------------------------------------------


@dataclass
class TurnResult:
    """What one method produced for one turn of one question."""

    text: str
    token_ids: list[int]
    seconds: float
    stats: dict[str, Any]  # target_passes, committed, proposed, accepted, draft_seconds, ...
    accept_lengths: list[int]


class HFPeer:
    """Hugging Face ``generate`` on the same weights, greedy or sampled like the run."""

    def __init__(self, model: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = model
        self.hf = AutoModelForCausalLM.from_pretrained(str(model.folder), dtype=model.dtype).eval()
        self.assistants: dict[str, Any] = {}
        self.eos = sorted(model.eos_token_ids)

    def _assistant(self, folder: str) -> Any:
        if folder not in self.assistants:
            from transformers import AutoModelForCausalLM

            self.assistants[folder] = AutoModelForCausalLM.from_pretrained(
                folder, dtype=self.model.dtype
            ).eval()
        return self.assistants[folder]

    def generate(self, method: Method, prompt_ids: list[int], max_new_tokens: int, sampling: Any) -> TurnResult:
        from transformers import GenerationConfig
        from transformers.utils import logging as hf_logging

        torch = self.torch
        kwargs = dict(method.hf_kwargs)
        assistant = None
        if "assistant_folder" in kwargs:
            assistant = self._assistant(kwargs.pop("assistant_folder"))
        if "num_assistant_tokens" in kwargs:
            kwargs["num_assistant_tokens_schedule"] = "constant"
        sample: dict[str, Any] = {"do_sample": False}
        if not sampling.greedy:
            sample = {"do_sample": True, "temperature": sampling.temperature,
                      "top_k": sampling.top_k, "top_p": sampling.top_p}
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos or None,
            pad_token_id=self.eos[0] if self.eos else 0,
            **sample,
            **kwargs,
        )
        ids = torch.tensor([prompt_ids], dtype=torch.long)  # [1, n]
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = self.hf.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=config,
                    assistant_model=assistant,
                )
                seconds = time.perf_counter() - t0
        finally:
            hf_logging.set_verbosity(verbosity)
        new = [int(t) for t in out[0, len(prompt_ids):].tolist()]
        for i, t in enumerate(new):  # stop at the first EOS (later ones are padding)
            if t in self.model.eos_token_ids:
                new = new[:i]
                break
        text = self.model.tokenizer.decode(new, skip_special_tokens=True)
        return TurnResult(text, new, seconds, {"draft": method.spec}, [])


class _Runner:
    """Runs methods on questions; keeps the drafters of ``auto`` and the HF peer."""

    def __init__(self, model: Any, max_new_tokens: int, sampling: Any, plan: Any) -> None:
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.plan = plan
        self.auto_drafters: dict[str, Any] = {}
        self.peer: HFPeer | None = None

    def _auto(self, category: str) -> tuple[str, Any, KValue]:
        from ..drafters import make_drafter

        spec, k = self.plan.choose(category)
        spec = str(spec)
        if spec not in self.auto_drafters:
            self.auto_drafters[spec] = make_drafter(spec, self.model)
        drafter = self.auto_drafters[spec]
        if drafter is None:  # the plan says no speculation pays here: plain decoding (k unused)
            return spec, None, 1
        return spec, drafter, k if k == "auto" else parse_k(k)

    def turn(self, method: Method, prompt_ids: list[int], category: str) -> TurnResult:
        from ..decode import generate

        if method.kind == "hf":
            if self.peer is None:
                self.peer = HFPeer(self.model)
            return self.peer.generate(method, prompt_ids, self.max_new_tokens, self.sampling)
        spec, drafter, k = method.spec, method.drafter, method.k
        if method.kind == "auto":
            spec, drafter, k = self._auto(category)
        res = generate(
            self.model, prompt_ids, max_new_tokens=self.max_new_tokens, sampling=self.sampling,
            draft=drafter, k=k if drafter is not None else 1,  # type: ignore[arg-type]
        )
        st = res.stats
        stats = {
            "draft": spec,
            "k": k if drafter is not None else 0,
            "target_passes": st.target_passes,
            "committed": st.committed,
            "proposed": st.proposed,
            "accepted": st.accepted,
            "draft_seconds": st.draft_seconds,
            "verify_seconds": st.verify_seconds,
            "tested_at": list(st.tested_at),
            "accepted_at": list(st.accepted_at),
            "finish_reason": res.finish_reason,
        }
        return TurnResult(res.text, list(res.token_ids), res.seconds, stats, list(st.accept_lengths))

    def question(self, method: Method, q: Question) -> list[TurnResult]:
        """All turns of ``q``, each answer going into the next turn's history."""
        answers: list[str] = []
        results: list[TurnResult] = []
        for i in range(len(q.turns)):
            prompt_ids = build_prompt(self.model, q.turns[: i + 1], answers)
            r = self.turn(method, prompt_ids, q.category)
            answers.append(r.text)
            results.append(r)
        return results

    def fits(self, q: Question) -> bool:
        """Whether ``q`` fits in the context whatever the answers (a conservative estimate)."""
        n = len(q.turns)
        placeholder = [""] * (n - 1)
        prompt = build_prompt(self.model, q.turns, placeholder)
        need = len(prompt) + n * (self.max_new_tokens + 8)
        return need <= self.model.runtime.max_context


def answer_record(model: Any, method: Method, q: Question, turns: Sequence[TurnResult]) -> dict[str, Any]:
    """One Spec-Bench answer line (plus ``token_ids`` and per-turn ``stats`` for draftwise)."""
    hf = method.kind == "hf"
    return {
        "question_id": q.question_id,
        "category": q.category,
        "answer_id": uuid.uuid4().hex,
        "model_id": f"{model.name}-{method.name}",
        "method": method.name,
        "choices": [
            {
                "index": 0,
                "turns": [t.text for t in turns],
                "decoding_steps": [None if hf else t.stats["target_passes"] for t in turns],
                "new_tokens": [len(t.token_ids) for t in turns],
                "wall_time": [t.seconds for t in turns],
                "accept_lengths": [t.accept_lengths for t in turns],
                "token_ids": [t.token_ids for t in turns],
                "stats": [t.stats for t in turns],
            }
        ],
        "tstamp": time.time(),
    }


def read_answers(path: Path) -> dict[str, dict[str, Any]]:
    """Answers already in a method's file, keyed by ``json.dumps(question_id)``; a line cut
    short by an interruption (the last one) is ignored."""
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "question_id" in row and row.get("choices"):
                out[json.dumps(row["question_id"])] = row
    return out


# -- summary ---------------------------------------------------------------------------------


def _choice(record: Mapping[str, Any]) -> Mapping[str, Any]:
    return record["choices"][0]


def _is_peer(name: str) -> bool:
    return name == "hf" or name.startswith("hf-")


def summarise(
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    questions: Sequence[Question],
    methods: Sequence[str],
) -> tuple[dict[str, Any], dict[str, Any], list[Question]]:
    """``answers[method][qkey]`` -> (groups table, per-position acceptance, complete questions).

    Only questions that every method answered count, so each speedup compares the same
    questions. Per question, tokens/s = sum of new tokens / sum of wall time over its turns.
    """
    complete = [q for q in questions if all(json.dumps(q.question_id) in answers.get(m, {}) for m in methods)]
    groups: dict[str, Any] = {}
    for group in GROUP_ORDER:
        qs = [q for q in complete if group == "overall" or q.category in GROUPS[group]]
        if not qs:
            continue
        table: dict[str, Any] = {}
        speeds: dict[str, float] = {}
        for m in methods:
            hf = _is_peer(m)
            choices = [_choice(answers[m][json.dumps(q.question_id)]) for q in qs]
            per_q = [sum(c["new_tokens"]) / sum(c["wall_time"]) if sum(c["wall_time"]) > 0 else 0.0 for c in choices]
            speeds[m] = statistics.mean(per_q)
            wall = sum(sum(c["wall_time"]) for c in choices)
            stats = [s for c in choices for s in c.get("stats", [])]
            passes = sum(s.get("target_passes", 0) for s in stats)
            proposed = sum(s.get("proposed", 0) for s in stats)
            table[m] = {
                "tokens_per_s": speeds[m],
                "speedup": None,
                "mat": None if hf or not passes else sum(s["committed"] for s in stats) / passes,
                "acceptance": (
                    None if hf or m == BASELINE or not proposed
                    else sum(s["accepted"] for s in stats) / proposed
                ),
                "draft_time_share": (
                    None if hf or wall <= 0 else sum(s.get("draft_seconds", 0.0) for s in stats) / wall
                ),
                "questions": len(qs),
            }
        base = speeds.get(BASELINE, 0.0)
        for m in methods:
            table[m]["speedup"] = speeds[m] / base if base > 0 else None
        groups[group] = table
    by_position: dict[str, Any] = {}
    for m in methods:
        if m == BASELINE or _is_peer(m):
            continue
        tested: list[int] = []
        accepted: list[int] = []
        for q in complete:
            for s in _choice(answers[m][json.dumps(q.question_id)]).get("stats", []):
                for i, (t, a) in enumerate(zip(s.get("tested_at", []), s.get("accepted_at", []))):
                    while len(tested) <= i:
                        tested.append(0)
                        accepted.append(0)
                    tested[i] += t
                    accepted[i] += a
        by_position[m] = {
            "tested": tested,
            "accepted": accepted,
            "rate": [a / t if t else None for a, t in zip(accepted, tested)],
        }
    return groups, by_position, complete


def top2_margin(model: Any, prompt_ids: Sequence[int], prefix: Sequence[int]) -> float:
    """top-1 minus top-2 logit of the target after ``prompt_ids + prefix`` (resets its cache)."""
    import torch

    logits = model.runtime.prefill(list(prompt_ids) + list(prefix))  # [vocab]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def check_equality(
    model: Any,
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    questions: Sequence[Question],
    methods: Sequence[str],
) -> dict[str, Any]:
    """Every method's tokens against the baseline's, per turn, with top-2 margins at mismatches.

    Turn t's prompt contains the method's own earlier answers; a mismatch in a later turn of a
    question whose earlier turn already diverged is flagged ``after_earlier_mismatch`` (its
    prompt differs from the baseline's). Margins are computed on the baseline's prompt.
    """
    counts: dict[str, dict[str, int]] = {}
    mismatches: list[dict[str, Any]] = []
    for m in methods:
        if m == BASELINE:
            continue
        equal = total = 0
        for q in questions:
            key = json.dumps(q.question_id)
            base = _choice(answers[BASELINE][key])
            mine = _choice(answers[m][key])
            diverged = False
            for t, (b_ids, m_ids) in enumerate(zip(base["token_ids"], mine["token_ids"])):
                total += 1
                if b_ids == m_ids:
                    equal += 1
                    continue
                pos = next((i for i, (a, b) in enumerate(zip(b_ids, m_ids)) if a != b), min(len(b_ids), len(m_ids)))
                prompt = build_prompt(model, q.turns[: t + 1], base["turns"][:t])
                mismatches.append({
                    "question_id": q.question_id,
                    "category": q.category,
                    "method": m,
                    "turn": t,
                    "position": pos,
                    "margin": top2_margin(model, prompt, b_ids[:pos]),
                    "baseline_token": b_ids[pos] if pos < len(b_ids) else None,
                    "method_token": m_ids[pos] if pos < len(m_ids) else None,
                    "after_earlier_mismatch": diverged,
                })
                diverged = True
        counts[m] = {"equal": equal, "total": total}
    return {"checked": True, "reference": BASELINE, "methods": counts, "mismatches": mismatches}


# -- reports ---------------------------------------------------------------------------------


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render_markdown(summary: Mapping[str, Any]) -> str:
    """``summary.md``: one table per group (methods as rows), the equality line, the command."""
    cfg, run = summary["config"], summary["run"]
    sampling = "greedy" if cfg["temperature"] == 0 else f"temperature {cfg['temperature']}"
    lines = [
        f"# draftwise bench: {cfg['model']} ({cfg['dtype']}), {sampling}, "
        f"up to {cfg['max_new_tokens']} new tokens, k={cfg['k']}",
        "",
        f"{run['questions_finished']} of {run['questions_total']} questions finished"
        + (f" (stopped: {run['stopped']})" if run["stopped"] else "")
        + f"; methods interleaved question by question; {cfg['date']}.",
        "",
        "speedup = mean tokens/s / mean tokens/s of `none` (draftwise plain decoding) over the "
        "same questions; #MAT = committed tokens per target pass (bonus included).",
    ]
    if any(_is_peer(m) for m in cfg["methods"]):
        lines += ["", "Peers (`hf*`: Hugging Face `generate` on the same weights) are also "
                  "measured against draftwise `none`, not against `hf`."]
    for group, table in summary["groups"].items():
        lines += ["", f"## {group}", "",
                  "| method | tok/s | speedup | #MAT | acceptance | draft share | questions |",
                  "|---|---|---|---|---|---|---|"]
        for m, row in table.items():
            lines.append(
                f"| {m} | {_fmt(row['tokens_per_s'], '.1f')} | {_fmt(row['speedup'], '.2f', 'x')} | "
                f"{_fmt(row['mat'], '.2f')} | {_fmt(row['acceptance'], '.2f')} | "
                f"{_fmt(row['draft_time_share'], '.2f')} | {row['questions']} |"
            )
    eq = summary["equality"]
    lines.append("")
    if eq.get("checked"):
        parts = [f"{m}: {c['equal']}/{c['total']}" for m, c in eq["methods"].items()]
        lines.append("Turns equal to `none` token for token: " + (", ".join(parts) or "-") + ".")
        for mm in eq["mismatches"]:
            lines.append(
                f"- q{mm['question_id']} {mm['method']} turn {mm['turn']}: first differs at token "
                f"{mm['position']}, top-2 logit margin {mm['margin']:.4f}"
                + (" (after an earlier mismatch)" if mm["after_earlier_mismatch"] else "")
            )
    else:
        lines.append(f"Equality not checked: {eq.get('reason', '')}.")
    if run.get("skipped"):
        lines += ["", "Skipped (too long for the context): "
                  + ", ".join(str(s["question_id"]) for s in run["skipped"]) + "."]
    lines += ["", f"Command: `{cfg['command']}`", ""]
    return "\n".join(lines)


def write_plots(summary: Mapping[str, Any], out_dir: Path) -> list[str]:
    """``speedup.png`` (grouped bars per group) and ``acceptance_by_position.png``; returns
    the file names written (none when matplotlib is missing)."""
    try:
        plt = pyplot()
    except ImportError:
        return []
    written = []
    groups = list(summary["groups"])
    methods = [m for m in summary["config"]["methods"] if m != BASELINE]
    if groups and methods:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(methods)) ** 0.5), 4))
        width = 0.8 / len(methods)
        for j, m in enumerate(methods):
            ys = [summary["groups"][g].get(m, {}).get("speedup") or 0.0 for g in groups]
            ax.bar([i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))], ys, width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(groups)), groups, rotation=20)
        ax.set_ylabel("speedup over draftwise plain decoding")
        ax.legend(fontsize="small")
        save_figure(fig, out_dir / "speedup.png", dpi=120)
        written.append("speedup.png")
    positions = summary["acceptance_by_position"]
    if positions:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m, row in positions.items():
            xs = [i + 1 for i, r in enumerate(row["rate"]) if r is not None]
            ys = [r for r in row["rate"] if r is not None]
            ax.plot(xs, ys, marker="o", label=m)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (given earlier positions accepted)")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small")
        save_figure(fig, out_dir / "acceptance_by_position.png", dpi=120)
        written.append("acceptance_by_position.png")
    return written


# -- the entry point -------------------------------------------------------------------------


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not enabled, transient=False,
    ) as bar:
        yield bar


def _open_answers(
    out: Path | None,
    methods: Sequence[Method],
    qs: Sequence[Question],
    config: Mapping[str, Any],
    resume: bool,
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, Any]]:
    """The answers already there (``resume``) and one open answer file per method.

    Resuming refuses a folder run with other settings; without ``resume`` the files of this
    run's methods start empty.
    """
    answers: dict[str, dict[str, dict[str, Any]]] = {m.name: {} for m in methods}
    files: dict[str, Any] = {}
    if out is None:
        return answers, files
    (out / "answers").mkdir(parents=True, exist_ok=True)
    run_file = out / "run.json"
    if resume and run_file.is_file():
        before = json.loads(run_file.read_text())
        keys = ("model", "dtype", "max_new_tokens", "temperature", "top_k", "top_p")
        diff = [f"{key}: {before.get(key)!r} -> {config[key]!r}" for key in keys if before.get(key) != config[key]]
        if diff:
            raise ConfigError(
                f"cannot resume {out}: it was run with other settings ({'; '.join(diff)}); "
                "use another --out or drop --resume"
            )
    run_file.write_text(json.dumps(config, indent=2))
    wanted = {json.dumps(q.question_id) for q in qs}
    for m in methods:
        path = out / "answers" / method_filename(m.name)
        if resume:
            answers[m.name] = {key: r for key, r in read_answers(path).items() if key in wanted}
            # a line cut short by a kill must not swallow the next one
            if path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
                with path.open("a", encoding="utf-8") as f:
                    f.write("\n")
        files[m.name] = path.open("a" if resume else "w", encoding="utf-8")
    return answers, files


def run_bench(
    model: Any,
    questions: str | Path | Sequence[Question | Mapping[str, Any]],
    *,
    drafts: str | Sequence[DraftItem] = ("lookup", "self"),
    k: KValue = 4,
    max_new_tokens: int = 128,
    limit_per_category: int | None = None,
    sampling: Any = None,
    peers: Sequence[str] = (),
    out_dir: str | Path | None = None,
    resume: bool = False,
    time_budget: float | None = None,
    progress: bool = True,
    plan: Any = None,
    dtype: str = "float32",
    warmup: bool = True,
) -> dict[str, Any]:
    """Benchmark plain decoding (``none``), each draft and each peer on Spec-Bench questions.

    ``model`` is a loaded :class:`draftwise.Model` or a spec (``"default"``, a folder, a
    .gguf; loaded with ``dtype``). ``questions`` is a JSONL path or a list of
    :class:`Question` (or of dicts shaped like its lines). ``drafts`` are specs (``"lookup"``, ``"self"``, ``"model:PATH"``,
    ``"auto"`` = the plan's choice per category) or ``(spec, k)`` pairs; ``k`` is an int or
    ``"auto"``. ``peers=("hf",)`` adds Hugging Face ``generate`` (plain, prompt lookup,
    assistant model, early exit). ``plan`` is a plan object or path (default
    ``out_dir/plan.json``; only ``drafts`` with ``auto`` need one).

    With ``out_dir``: answer files, ``summary.json``, ``summary.md`` and plots are written
    there; ``resume=True`` keeps the answers already there and runs only what is missing.
    ``time_budget`` (seconds) stops after the question during which it ran out. On Ctrl-C the
    summary of the finished questions is written and KeyboardInterrupt re-raised.

    Returns the summary: ``{"groups": {group: {method: {"tokens_per_s", "speedup", "mat",
    "acceptance", "draft_time_share", "questions"}}}, "equality": ..., "config": ...,
    "acceptance_by_position": ..., "run": ...}``.

    Example::

        summary = run_bench("default", "question_dev.jsonl", drafts="lookup,self",
                            max_new_tokens=32, limit_per_category=1, progress=False)
        print(render_markdown(summary))
    """
    from ..loaders import load_model
    from ..sampling import SamplingConfig

    started = time.perf_counter()
    sampling = sampling or SamplingConfig()
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
    if time_budget is not None and not time_budget >= 0:
        raise ConfigError(f"time_budget={time_budget!r} must be a number of seconds >= 0")
    k = parse_k(k)
    peers = tuple(p.strip() for p in ([peers] if isinstance(peers, str) else peers) if p.strip())
    for p in peers:
        if p not in PEERS:
            raise ConfigError(f"unknown peer {p!r}; known peers: {', '.join(PEERS)}")
    out = Path(out_dir).expanduser() if out_dir is not None else None
    if resume and out is None:
        raise ConfigError("resume=True needs out_dir, the folder of the run to resume")
    if isinstance(questions, (str, Path)):
        all_qs = read_questions(questions)
    else:  # Question objects, or rows as they appear in the JSONL
        all_qs = [
            q if isinstance(q, Question) else parse_question(q, f"questions[{i}]")
            for i, q in enumerate(questions)
        ]
    if not all_qs:
        raise ConfigError("no questions to run")
    qs = select_questions(all_qs, limit_per_category)
    parsed = parse_drafts(drafts, k)  # validate before loading anything
    plan_obj = _load_plan(plan, out) if any(spec == "auto" for _, spec, _ in parsed) else None
    if isinstance(model, (str, Path)):
        model = load_model(model, dtype=dtype)  # type: ignore[arg-type]
    methods = build_methods(model, drafts, k, peers)
    names = [m.name for m in methods]
    runner = _Runner(model, max_new_tokens, sampling, plan_obj)

    config = {
        "model": model.name,
        "folder": str(model.folder),
        "dtype": str(model.dtype).replace("torch.", ""),
        "runtime": type(model.runtime).__name__,
        "max_new_tokens": max_new_tokens,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "k": k,
        "methods": names,
        "drafts": {m.name: {"spec": m.spec, "k": m.k} for m in methods if m.kind != "hf"},
        "peers": list(peers),
        "limit_per_category": limit_per_category,
        "questions": str(questions) if isinstance(questions, (str, Path)) else f"{len(all_qs)} given",
        "plan": str(plan) if plan is not None and not hasattr(plan, "choose") else None,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }

    answers, files = _open_answers(out, methods, qs, config, resume)
    reused = sum(len(a) for a in answers.values())

    skipped: list[dict[str, Any]] = []
    stopped: str | None = None
    todo = sum(1 for q in qs for m in names if json.dumps(q.question_id) not in answers[m])
    try:
        if warmup and todo:  # first calls pay for lazy initialisation; keep that out of the timing
            saved, runner.max_new_tokens = runner.max_new_tokens, min(4, runner.max_new_tokens)
            try:
                for m in methods:
                    if m.kind != "auto" and any(json.dumps(q.question_id) not in answers[m.name] for q in qs):
                        runner.turn(m, build_prompt(model, ["Say hello."], []), "qa")
            finally:
                runner.max_new_tokens = saved
        with _progress(progress) as bar:
            task = bar.add_task("bench", total=todo)
            for qi, q in enumerate(qs):
                key = json.dumps(q.question_id)
                pending = [m for m in methods if key not in answers[m.name]]
                if pending and not runner.fits(q):
                    skipped.append({"question_id": q.question_id, "reason": "context"})
                    bar.update(task, advance=len(pending))
                    continue
                shift = qi % len(methods)
                for m in methods[shift:] + methods[:shift]:  # rotate the order per question
                    if key in answers[m.name]:
                        continue
                    try:
                        turns = runner.question(m, q)
                    except ContextLengthError:
                        skipped.append({"question_id": q.question_id, "reason": "context"})
                        break
                    record = answer_record(model, m, q, turns)
                    answers[m.name][key] = record
                    if m.name in files:
                        files[m.name].write(json.dumps(record, ensure_ascii=False) + "\n")
                        files[m.name].flush()
                    tps = sum(len(t.token_ids) for t in turns) / max(sum(t.seconds for t in turns), 1e-9)
                    bar.update(task, advance=1, description=f"{m.name:>14} q{q.question_id} {tps:7.1f} tok/s")
                if time_budget is not None and time.perf_counter() - started > time_budget:
                    if qi + 1 < len(qs):
                        stopped = "time_budget"
                    break
    except KeyboardInterrupt:
        for f in files.values():
            f.close()
        _finish(model, answers, qs, names, config, out, sampling, "interrupted", skipped, reused, started)
        raise
    finally:
        for f in files.values():
            f.close()
    return _finish(model, answers, qs, names, config, out, sampling, stopped, skipped, reused, started)


def _finish(
    model: Any,
    answers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    qs: Sequence[Question],
    names: Sequence[str],
    config: dict[str, Any],
    out: Path | None,
    sampling: Any,
    stopped: str | None,
    skipped: list[dict[str, Any]],
    reused: int,
    started: float,
) -> dict[str, Any]:
    """Summarise what finished; write summary.json, summary.md and plots when ``out`` is set."""
    groups, by_position, complete = summarise(answers, qs, names)
    if sampling.greedy:
        equality = check_equality(model, answers, complete, names)
    else:
        equality = {"checked": False, "reason": "sampling (temperature > 0): outputs are equal "
                    "only in distribution"}
    summary: dict[str, Any] = {
        "groups": groups,
        "equality": equality,
        "config": config,
        "acceptance_by_position": by_position,
        "run": {
            "questions_total": len(qs),
            "questions_finished": len(complete),
            "stopped": stopped,
            "skipped": skipped,
            "answers_reused": reused,
            "elapsed_s": time.perf_counter() - started,
        },
    }
    if out is not None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        (out / "summary.md").write_text(render_markdown(summary))
        summary["run"]["plots"] = write_plots(summary, out)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    return summary
