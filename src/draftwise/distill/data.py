"""Training data for distillation, made locally: prompts, their split, the target's continuations.

- Prompts are the first turns of a Spec-Bench-format file (default: the dev questions).
- The split is deterministic: within each category, in file order, every 4th question
  (positions 3, 7, 11, ...) is held out for evaluation; training never sees it.
- Each training sequence is a chat-templated prompt plus the target's own continuation
  (self-distillation), cached one JSON line per prompt in ``DIR/data/sequences.jsonl`` so an
  interrupted or resumed run never generates it twice.
- A batch takes the *last* ``seq_len`` tokens of each sequence, so the continuation (what the
  draft will be asked to propose) is always inside the window, even after a long prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..bench.runtime import PromptSpec, select_prompts

HOLDOUT_EVERY = 4


def split_questions(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held_out): within each category, positions 3, 7, 11, ... are held out.

    >>> rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
    ...         for i, c in enumerate("aaaaabbbb")]
    >>> train, held = split_questions(rows)
    >>> [r["question_id"] for r in held], len(train)
    ([3, 8], 7)
    """
    seen: dict[str, int] = {}
    train: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for row in rows:
        category = str(row.get("category", "uncategorised"))
        position = seen.get(category, 0)
        seen[category] = position + 1
        (held if position % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).append(row)
    return train, held


def ordered_prompts(rows: Sequence[dict[str, Any]]) -> list[PromptSpec]:
    """All rows as prompts, round-robin over categories (so any prefix covers every category)."""
    return select_prompts(rows, len(rows)) if rows else []


def _key(target_name: str, text: str, gen_tokens: int, gen_temperature: float, seed: int) -> str:
    h = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
    return f"{target_name}|{h}|{gen_tokens}|{gen_temperature}|{seed}"


def make_sequences(
    target: Any,
    prompts: Sequence[PromptSpec],
    data_dir: Path,
    *,
    gen_tokens: int,
    gen_temperature: float = 0.0,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """prompt + target continuation token ids for each prompt, generated once and cached.

    Continuations are greedy when ``gen_temperature == 0``, else sampled with a seed derived
    from ``seed`` and the prompt's position. A prompt too long for the target's context with
    ``gen_tokens`` more tokens is used without a continuation.
    """
    from ..decode import generate
    from ..sampling import SamplingConfig

    data_dir.mkdir(parents=True, exist_ok=True)
    cache_path = data_dir / "sequences.jsonl"
    cached: dict[str, list[int]] = {}
    if cache_path.exists():
        for line in cache_path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                cached[row["key"]] = row["ids"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by an interruption: generate it again
    out: list[list[int]] = []
    with cache_path.open("a", encoding="utf-8") as f:
        for i, prompt in enumerate(prompts):
            key = _key(target.name, prompt.text, gen_tokens, gen_temperature, seed + i)
            if key not in cached:
                prompt_ids = target.encode_prompt(prompt.text)
                room = target.runtime.max_context - len(prompt_ids)
                new: list[int] = []
                if room >= 1:
                    sampling = SamplingConfig(temperature=gen_temperature, seed=seed * 1_000_003 + i)
                    new = generate(
                        target, prompt_ids, max_new_tokens=min(gen_tokens, room), sampling=sampling
                    ).token_ids
                cached[key] = list(prompt_ids) + list(new)
                f.write(json.dumps({"key": key, "question_id": prompt.question_id, "ids": cached[key]}) + "\n")
                f.flush()
            out.append(cached[key])
            if on_progress:
                on_progress(i + 1, len(prompts))
    return out


def frequent_tokens(sequences: Sequence[Sequence[int]], n: int, vocab_size: int, always: Sequence[int] = ()) -> list[int]:
    """The ``n`` token ids a reduced draft head keeps (FR-Spec), sorted ascending.

    ``always`` (the end-of-sequence ids) come first, then the most frequent ids of the
    training token stream; ties, and slots the stream cannot fill, go to the lowest ids.

    >>> frequent_tokens([[5, 5, 7, 9], [7, 5]], 3, vocab_size=10, always=[2])
    [2, 5, 7]
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        if seq:
            counts += torch.bincount(torch.as_tensor(seq, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    chosen = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size][:n]
    taken = set(chosen)
    # stable sort: equal counts keep ascending id order
    for i in torch.sort(-counts, stable=True).indices.tolist():
        if len(chosen) >= n:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    return sorted(chosen)


def batch_indices(step: int, batch: int, num_sequences: int, seed: int) -> list[int]:
    """The sequences of training step ``step`` (0-based): a seeded permutation per epoch.

    A pure function of its arguments, so a resumed run sees exactly the batches it would have.
    """
    perms: dict[int, list[int]] = {}
    out = []
    for j in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(j, num_sequences)
        if epoch not in perms:
            gen = torch.Generator().manual_seed(seed * 7919 + epoch)
            perms[epoch] = torch.randperm(num_sequences, generator=gen).tolist()
        out.append(perms[epoch][pos])
    return out


def make_batch(sequences: Sequence[Sequence[int]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both ``[B, L]``: the last ``seq_len`` tokens of each, right-padded."""
    windows = [list(s[-seq_len:]) for s in sequences]
    width = max(len(w) for w in windows)
    ids = torch.zeros(len(windows), width, dtype=torch.long)
    mask = torch.zeros(len(windows), width, dtype=torch.bool)
    for b, w in enumerate(windows):
        ids[b, : len(w)] = torch.as_tensor(w, dtype=torch.long)
        mask[b, : len(w)] = True
    return ids, mask
