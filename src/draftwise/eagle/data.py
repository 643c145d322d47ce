"""Training data for an EAGLE draft head: prompts, the target's answers, its features, cached.

- Prompts: the training split of the dev questions (:func:`~.data.split_questions`; the held-out
  questions are never used), plus ``magpie`` instructions the target writes itself (Magpie, Xu
  et al. 2024): sampled at temperature 1 from its chat template's user prefix alone (the text
  before a user message's content), at most :data:`MAGPIE_TOKENS` tokens, stopping at the end of
  the turn. They are deduplicated and filtered (:func:`filter_instructions`) and cached, one line
  per generated batch, in ``DATA/magpie.jsonl``.
- Answers: :func:`~.data.make_sequences` (cached in ``DATA/sequences.jsonl``).
- Features: :mod:`.feature_store`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import ConfigError
from draftwise.questions import Question
from draftwise.training.data import GEN_BATCH, _cut_at_eos, load_hf

MAGPIE_FILE = "magpie.jsonl"
#: new tokens per Magpie instruction
MAGPIE_TOKENS = 64
#: shortest instruction kept, in words
MIN_WORDS = 3
#: an instruction sharing at least this fraction of its word 8-grams with a held-out question is dropped
OVERLAP_NGRAM, OVERLAP_SHARE = 8, 0.5
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
