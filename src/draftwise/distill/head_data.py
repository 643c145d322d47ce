"""Training data for an EAGLE draft head: prompts, the target's answers, its features, cached.

- Prompts: the training split of the dev questions (:func:`~.data.split_questions`; the held-out
  questions are never used), plus ``magpie`` instructions the target writes itself (Magpie, Xu
  et al. 2024): sampled at temperature 1 from its chat template's user prefix alone (the text
  before a user message's content), at most :data:`MAGPIE_TOKENS` tokens, stopping at the end of
  the turn. They are deduplicated and filtered (:func:`filter_instructions`) and cached, one line
  per generated batch, in ``DATA/magpie.jsonl``.
- Answers: :func:`~.data.make_sequences` (cached in ``DATA/sequences.jsonl``).
- Features: one pass of the target's own runtime per sequence with feature capture on gives
  ``f`` ``[L, d]`` (the last decoder layer's output before the final norm; stored float16), the
  log-sum-exp of its full-vocabulary logits ``[L]`` (so p over a reduced vocabulary is exact,
  ``p(v) = exp(logit_v - lse)``) and its argmax ``[L]``. They are cached in
  ``DATA/features/chunk-NNNNN.safetensors``, listed in ``index.json`` once a chunk is whole, so
  an interrupted extraction resumes at the first sequence not listed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..fsutil import atomic_path, write_json_atomic
from ..questions import Question
from .data import GEN_BATCH, _cut_at_eos, load_hf

MAGPIE_FILE = "magpie.jsonl"
FEATURES_DIR = "features"
INDEX_FILE = "index.json"
FEATURES_FORMAT = "draftwise-head-features-1"
#: new tokens per Magpie instruction
MAGPIE_TOKENS = 64
#: shortest instruction kept, in words
MIN_WORDS = 3
#: an instruction sharing at least this fraction of its word 8-grams with a held-out question is dropped
OVERLAP_NGRAM, OVERLAP_SHARE = 8, 0.5
#: sequences per feature chunk
CHUNK_SEQUENCES = 32
_SENTINEL = "\x00DRAFTWISE-USER\x00"

Progress = Callable[[int, int], None]


def user_prefix(tokenizer: Any) -> list[int]:
    """Token ids of the chat template up to where a user's message starts (Magpie's prompt).

    The template renders one user message whose content is a sentinel; the text before the
    sentinel (e.g. ``<|im_start|>system ... <|im_end|>\\n<|im_start|>user\\n``) is the prefix.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("--magpie needs a chat model: this target's tokenizer has no chat template; pass --magpie 0")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    cut = text.find(_SENTINEL) if isinstance(text, str) else -1
    if cut <= 0:
        raise ConfigError("the target's chat template does not place a user message where --magpie can cut it; pass --magpie 0")
    return [int(i) for i in tokenizer(text[:cut], add_special_tokens=False)["input_ids"]]


def normalise(text: str) -> str:
    """Lower case, words only, single spaces.

    >>> normalise("  What's  the capital of FRANCE?\\n")
    'what s the capital of france'
    """
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def filter_instructions(texts: Sequence[str], held_out: Sequence[str], *, min_words: int = MIN_WORDS) -> list[str]:
    """``texts`` (in order) without repeats, short ones and any too close to a held-out question.

    Dropped: fewer than ``min_words`` words; the same normalised text as an earlier one or as a
    held-out question; at least :data:`OVERLAP_SHARE` of its word 8-grams found in held-out
    questions (texts of fewer than 8 words only by equality).

    >>> held = ["Write a short poem about the sea and the wind and the rain."]
    >>> filter_instructions(["Hi", "Tell me a joke.", "tell me a joke", "Write a short poem about "
    ...     "the sea and the wind and the rain please."], held)
    ['Tell me a joke.']
    """
    held_norm = {normalise(h) for h in held_out}
    held_grams: set[tuple[str, ...]] = set()
    for h in held_norm:
        held_grams |= _ngrams(h.split(), OVERLAP_NGRAM)
    seen: set[str] = set()
    out = []
    for text in texts:
        norm = normalise(text)
        words = norm.split()
        if len(words) < min_words or norm in seen or norm in held_norm:
            continue
        grams = _ngrams(words, OVERLAP_NGRAM)
        if grams and len(grams & held_grams) >= OVERLAP_SHARE * len(grams):
            continue
        seen.add(norm)
        out.append(text.strip())
    return out


def _sample(hf: Any, prefix: list[int], count: int, *, eos: set[int], pad_id: int, seed: int) -> list[list[int]]:
    """``count`` samples (temperature 1, full distribution) after the same ``prefix``."""
    from transformers import GenerationConfig

    device = next(hf.parameters()).device
    ids = torch.tensor([prefix] * count, dtype=torch.long, device=device)  # [count, P]
    config = GenerationConfig(
        max_new_tokens=MAGPIE_TOKENS, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        pad_token_id=pad_id, eos_token_id=sorted(eos),
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return [_cut_at_eos(row[len(prefix) :].tolist(), eos) for row in out.cpu()]


def magpie_prompts(
    target: Any, n: int, data_dir: Path, *, held_out: Sequence[str], seed: int, device: torch.device,
    on_progress: Progress | None = None,
) -> list[str]:
    """``n`` instructions written by the target (fewer if it keeps repeating itself), cached.

    Batches of :data:`~.data.GEN_BATCH` are drawn with seeds ``seed * 1_000_003 + batch`` until
    ``n`` survive :func:`filter_instructions`, or ``4 n + 2 * GEN_BATCH`` have been drawn.
    ``DATA/magpie.jsonl`` keeps every batch drawn (one line each), so a resumed run draws none
    twice and keeps the same instructions.
    """
    if n <= 0:
        return []
    path = data_dir / MAGPIE_FILE
    batches: dict[int, list[str]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                if row["target"] == target.name and row["seed"] == seed:
                    batches[int(row["batch"])] = [str(t) for t in row["texts"]]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a line cut short by an interruption: that batch is drawn again

    def kept() -> list[str]:
        return filter_instructions([t for b in sorted(batches) for t in batches[b]], held_out)

    limit = -(-(4 * n + 2 * GEN_BATCH) // GEN_BATCH)  # batches
    hf, prefix = None, user_prefix(target.tokenizer)
    eos = set(int(t) for t in target.eos_token_ids)
    pad = target.tokenizer.pad_token_id
    pad_id = int(pad) if pad is not None else min(eos)
    if on_progress:
        on_progress(min(n, len(kept())), n)
    data_dir.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for b in range(limit):
            if len(kept()) >= n:
                break
            if b in batches:
                continue
            if hf is None:
                hf = load_hf(target, device)
            outs = _sample(hf, prefix, GEN_BATCH, eos=eos, pad_id=pad_id, seed=seed * 1_000_003 + b)
            texts = [target.tokenizer.decode(o, skip_special_tokens=True).strip() for o in outs]
            batches[b] = texts
            f.write(json.dumps({"target": target.name, "seed": seed, "batch": b, "texts": texts}) + "\n")
            f.flush()
            if on_progress:
                on_progress(min(n, len(kept())), n)
    return kept()[:n]


def magpie_questions(texts: Sequence[str]) -> list[Question]:
    """Magpie instructions as questions (category ``magpie``), for :func:`~.data.make_sequences`."""
    return [Question(f"magpie-{i}", "magpie", (t,)) for i, t in enumerate(texts)]


def sequence_key(target: Any, ids: Sequence[int], aux_layers: Sequence[int] | None = None) -> str:
    """What a sequence's features depend on: the target, its mode (dtype, quantisation), the ids,
    and the extra layers recorded for an EAGLE-3 head."""
    extra = "" if not aux_layers else "aux=" + ",".join(map(str, aux_layers)) + "|"
    h = hashlib.sha256(f"{target.name}|{target.mode}|{extra}".encode())
    h.update(",".join(map(str, ids)).encode())
    return h.hexdigest()[:24]


@dataclass
class FeatureStore:
    """Every sequence's tokens and target outputs, end to end (``N`` positions in all).

    ``feats`` ``[N, d]`` float16, ``lse`` ``[N]`` float32, ``top`` ``[N]`` (the target's argmax
    over its full vocabulary), ``ids`` ``[N]``; sequence ``i`` is rows ``starts[i] ..
    starts[i] + lengths[i] - 1``, its first ``prompt_lens[i]`` tokens the prompt. ``aux`` ``[N,
    3d]`` float16: an EAGLE-3 head's input, the outputs of its three layers side by side."""

    feats: torch.Tensor
    lse: torch.Tensor
    top: torch.Tensor
    ids: torch.Tensor
    starts: list[int]
    lengths: list[int]
    prompt_lens: list[int]
    aux: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.starts)


def _target_pass(runtime: Any, ids: Sequence[int], aux: int) -> dict[str, torch.Tensor]:
    """One full pass over ``ids`` from position 0 with capture on: features (the last layer's
    last, after ``aux`` other layers when asked), lse, argmax."""
    runtime.rollback(0)
    logits = runtime.forward(list(ids)).float()  # [L, vocab]
    recorded = runtime.features(0, len(ids))  # [L, (aux + 1) d]: aux layers, then the last
    runtime.rollback(0)
    if not torch.isfinite(recorded).all() or float(recorded.abs().max()) > 6e4:
        raise ConfigError("the target's features do not fit float16 (|f| > 60000); this target is not supported yet")
    d = recorded.shape[1] // (aux + 1)
    out = {
        "feats": recorded[:, -d:].to(torch.float16).cpu(), "lse": torch.logsumexp(logits, -1).cpu(),
        "top": logits.argmax(-1).to(torch.int32).cpu(),
    }
    if aux:
        out["aux"] = recorded[:, :-d].to(torch.float16).contiguous().cpu()
    return out


def _read_index(folder: Path) -> dict[str, Any]:
    path = folder / INDEX_FILE
    fresh = {"format": FEATURES_FORMAT, "chunks": 0, "sequences": {}}
    if not path.is_file():
        return fresh
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        if index.get("format") != FEATURES_FORMAT or not isinstance(index.get("sequences"), dict):
            raise ValueError(f"format is not {FEATURES_FORMAT}")
        return index
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}); delete {folder} to extract the features again") from None


def extract_features(
    target: Any, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int], data_dir: Path, *,
    aux_layers: Sequence[int] | None = None, on_progress: Progress | None = None,
) -> FeatureStore:
    """The target's features of every sequence, from ``DATA/features`` or one runtime pass each;
    with ``aux_layers`` (an EAGLE-3 head's), those layers' outputs too (``FeatureStore.aux``)."""
    from safetensors.torch import load_file, save_file

    runtime = target.runtime
    if not hasattr(runtime, "capture_features"):
        raise ConfigError(f"train-head needs a runtime that records features; {target.name} runs on one that does not")
    folder = data_dir / FEATURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    index = _read_index(folder)
    aux = tuple(int(i) for i in aux_layers) if aux_layers else None
    keys = [sequence_key(target, s, aux) for s in sequences]
    first_of = {k: keys.index(k) for k in dict.fromkeys(keys)}
    todo = [first_of[k] for k in dict.fromkeys(keys) if k not in index["sequences"]]
    done, total = len(set(keys)) - len(todo), len(set(keys))
    if on_progress:
        on_progress(done, total)
    if todo:
        runtime.capture_features(None if aux is None else (*aux, int(runtime.num_layers) - 1))
        try:
            for c in range(0, len(todo), CHUNK_SEQUENCES):
                part = [_target_pass(runtime, sequences[i], len(aux or ())) for i in todo[c : c + CHUNK_SEQUENCES]]
                name = f"chunk-{index['chunks']:05d}.safetensors"
                with atomic_path(folder / name) as tmp:
                    save_file({k: torch.cat([p[k] for p in part]).contiguous() for k in part[0]}, str(tmp))
                row = 0
                for i, p in zip(todo[c : c + CHUNK_SEQUENCES], part):
                    index["sequences"][keys[i]] = [name, row, len(sequences[i])]
                    row += len(sequences[i])
                index["chunks"] += 1
                write_json_atomic(folder / INDEX_FILE, index, indent=None)
                done += len(part)
                if on_progress:
                    on_progress(done, total)
        finally:
            runtime.capture_features(enabled=False)
    chunks: dict[str, dict[str, torch.Tensor]] = {}
    parts: dict[str, list[torch.Tensor]] = {"feats": [], "lse": [], "top": [], **({"aux": []} if aux else {})}
    starts, at = [], 0
    for key, seq in zip(keys, sequences):
        name, row, length = index["sequences"][key]
        if length != len(seq):
            raise ConfigError(f"{folder / INDEX_FILE} disagrees with the sequences; delete {folder} to extract again")
        if name not in chunks:
            try:
                chunks[name] = load_file(str(folder / name))
            except (OSError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"{folder / name} is damaged ({str(exc)[:80]}); delete {folder} to extract again") from None
        for k in parts:
            parts[k].append(chunks[name][k][row : row + length])
        starts.append(at)
        at += length
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)
    return FeatureStore(
        torch.cat(parts["feats"]), torch.cat(parts["lse"]), torch.cat(parts["top"]).long(), ids, starts,
        [len(s) for s in sequences], [int(p) for p in prompt_lens], torch.cat(parts["aux"]) if aux else None,
    )


def heldout_sequences(prompts: Sequence[str], percent: float) -> list[bool]:
    """Which sequences to hold out of training: ``percent`` % of the prompts, chosen by a hash of
    the prompt (every continuation of one prompt on the same side; stable under reordering).

    >>> sum(heldout_sequences([f"q{i}" for i in range(1000)], 5.0))
    50
    """
    cut = percent / 100.0 * 2**32
    return [int(hashlib.sha256(p.encode("utf-8")).hexdigest()[:8], 16) < cut for p in prompts]


def conversation_ids(tokenizer: Any, messages: Sequence[dict[str, str]], max_tokens: int) -> tuple[list[int], int]:
    """``(ids, prompt_len)`` of a whole conversation (``{"role", "content"}`` messages, a corpus's):
    rendered by the chat template (joined by blank lines without one) and cut to ``max_tokens``;
    ``prompt_len``: the ids before the first answer starts."""

    def ids(value: Any) -> list[int]:
        if isinstance(value, dict) or hasattr(value, "input_ids"):
            value = value["input_ids"]
        return [int(i) for i in value]

    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if getattr(tokenizer, "chat_template", None):
        whole = ids(tokenizer.apply_chat_template(list(messages), tokenize=True))
        prompt = ids(tokenizer.apply_chat_template(list(messages[:first]), tokenize=True, add_generation_prompt=True))
    else:
        whole = ids(tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"])
        prompt = ids(tokenizer("\n\n".join(m["content"] for m in messages[:first]) + "\n\n")["input_ids"])
    return whole[:max_tokens], min(len(prompt), max_tokens)
