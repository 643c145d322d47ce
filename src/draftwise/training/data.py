"""Training data for distillation, made locally: prompts, their split, the target's continuations.

- Prompts are the first turns of the questions of a workload file
  (:func:`draftwise.questions.read_questions`; default: the dev questions shipped with draftwise).
- The split is deterministic: within each category, in file order, every 4th question
  (positions 3, 7, 11, ...) is held out for evaluation; training never sees it.
- Each training sequence is a chat-templated prompt plus one of the target's own continuations
  (self-distillation): greedy, or sampled at a given temperature, several per prompt if asked.
  They are cached one JSON line per sequence in ``DIR/data/sequences.jsonl`` so an
  interrupted or resumed run never generates them twice.
- A batch takes the *last* ``seq_len`` tokens of each sequence, so the continuation (what the
  draft will be asked to propose) is always inside the window, even after a long prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from draftwise.errors import ConfigError
from draftwise.questions import Question, spread_questions

HOLDOUT_EVERY = 4
Item = TypeVar("Item")


def _category(item: Any) -> str:
    if isinstance(item, Question):
        return item.category
    return str(item.get("category", "uncategorised"))


def split_questions(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    """(train, held_out): within each category, positions 3, 7, 11, ... are held out.

    ``items`` are :class:`~draftwise.questions.Question` objects or rows with a ``"category"``.

    >>> qs = [Question(i, c, (f"q{i}",)) for i, c in enumerate("aaaaabbbb")]
    >>> train, held = split_questions(qs)
    >>> [q.question_id for q in held], len(train)
    ([3, 8], 7)
    """
    seen: dict[str, int] = {}
    train: list[Item] = []
    held: list[Item] = []
    for item in items:
        category = _category(item)
        position = seen.get(category, 0)
        seen[category] = position + 1
        (held if position % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).append(item)
    return train, held


def ordered_prompts(questions: Sequence[Question]) -> list[Question]:
    """All questions, round-robin over categories (so any prefix covers every category)."""
    return spread_questions(questions, len(questions)) if questions else []


def _key(target_name: str, text: str, gen_tokens: int, gen_temperature: float, seed: int) -> str:
    h = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
    return f"{target_name}|{h}|{gen_tokens}|{gen_temperature}|{seed}"


#: prompts per batched ``generate`` call: on 2 CPU cores, 32 short prompts decode about 4x as many
#: tokens per second as one (119 against 28 tok/s, SmolLM2-135M float32; 46 tok/s on average over
#: the dev set's training split, whose RAG and summarization prompts are long)
GEN_BATCH = 32


def _cut_at_eos(ids: Sequence[int], eos: set[int]) -> list[int]:
    """``ids`` up to and including the first end-of-sequence token.

    >>> _cut_at_eos([5, 6, 2, 2, 2], {2}), _cut_at_eos([5, 6], {2})
    ([5, 6, 2], [5, 6])
    """
    out: list[int] = []
    for t in ids:
        out.append(int(t))
        if t in eos:
            break
    return out


def _generate_batch(
    hf_model: Any, prompts: Sequence[Sequence[int]], *, gen_tokens: int, temperature: float, seed: int,
    eos: set[int], pad_id: int,
) -> list[list[int]]:
    """The continuations of several prompts in one left-padded ``transformers`` generate call."""
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[b, width - len(p):] = 1
    sample = temperature > 0
    config = GenerationConfig(
        max_new_tokens=gen_tokens, do_sample=sample, temperature=temperature if sample else None,
        top_k=0 if sample else None, top_p=1.0 if sample else None,
        pad_token_id=pad_id, eos_token_id=sorted(eos),
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=ids.to(hf_model.device), attention_mask=mask.to(hf_model.device), generation_config=config
        )
    return [_cut_at_eos(row[width:].tolist(), eos) for row in out]


#: sequences decoding together when the batched engine makes the continuations (native runtime),
#: and the prompt tokens each feeds per pass: throughput, not latency, is what counts here
ENGINE_BATCH = 32
ENGINE_PREFILL_CHUNK = 128
BACKENDS = ("auto", "engine", "hf")

Job = tuple[str, list[int], float, int, int]  # key, prompt ids, temperature, question id, seed


def _generate_engine(target: Any, jobs: Sequence[Job], *, gen_tokens: int,
                     save: Callable[[Job, list[int]], None]) -> None:
    """Every job's continuation on the batched engine, each a generation of its own seeded as
    its key says: the tokens it gets alone (:mod:`draftwise.core.engine`), whatever shares its pass.
    ``save(job, continuation)`` as each one ends; the runtime is back to one sequence after."""
    from draftwise.core.engine import Engine, memory_available
    from draftwise.core.sampling import SamplingConfig

    rt = target.runtime
    context = min(rt.max_context, max(len(job[1]) for job in jobs) + gen_tokens)
    batch, have = min(ENGINE_BATCH, len(jobs)), memory_available()
    if have is not None:  # a batch whose cache takes at most half of what is free
        batch = max(1, min(batch, int(have * 0.5 // rt.cache_bytes(1, context))))
    engine = Engine(target, max_batch=batch, context=context, prefill_chunk=ENGINE_PREFILL_CHUNK)
    try:
        engine.generate_all(
            [job[1] for job in jobs], max_new_tokens=gen_tokens,
            sampling=[SamplingConfig(temperature=job[2], seed=job[4]) for job in jobs],
            on_result=lambda i, r: save(jobs[i], r.token_ids + ([] if r.eos_token is None else [r.eos_token])),
        )
    finally:
        rt.allocate_slots(1)


def _generate_hf(target: Any, jobs: Sequence[Job], *, gen_tokens: int, seed: int,
                 save: Callable[[Job, list[int]], None], hf_model: Any = None) -> None:
    """Every job's continuation with ``transformers``, :data:`GEN_BATCH` left-padded prompts of
    one temperature a call, seeded per call (``jobs`` sorted by temperature and length), on
    ``hf_model`` (default: the target's weights, loaded now)."""
    eos = set(int(t) for t in target.eos_token_ids)
    pad_id = target.tokenizer.pad_token_id
    pad_id = int(pad_id) if pad_id is not None else min(eos)
    if hf_model is None:
        hf_model = load_hf(target, getattr(target.runtime, "device", "cpu"))
    for start in range(0, len(jobs), GEN_BATCH):
        groups: dict[float, list[Job]] = {}
        for job in jobs[start : start + GEN_BATCH]:
            groups.setdefault(job[2], []).append(job)
        for temp, group in groups.items():
            outs = _generate_batch(hf_model, [job[1] for job in group], gen_tokens=gen_tokens, temperature=temp,
                                   seed=seed * 1_000_003 + start, eos=eos, pad_id=pad_id)
            for job, out in zip(group, outs):
                save(job, out)


def make_sequences(
    target: Any,
    prompts: Sequence[Question],
    data_dir: Path,
    *,
    gen_tokens: int,
    gen_temperatures: Sequence[float] = (0.0,),
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
    backend: str = "auto",
) -> list[list[int]]:
    """prompt + target continuation token ids, one per prompt and temperature, cached.

    For each prompt there is one continuation per entry of ``gen_temperatures``: greedy for
    0, else sampled (full distribution at that temperature) with a seed derived from ``seed``.
    ``backend`` "engine" decodes them on the batched engine (:data:`ENGINE_BATCH` at a time,
    each exactly what it gets alone, sampled with its own seed); "hf" in left-padded batches of
    :data:`GEN_BATCH` with ``transformers`` on the target's weights; "auto" (the default) the
    engine where the target's runtime batches (the native one), else ``transformers``. Both are
    several times faster on a CPU than one at a time (docs/eagle.md gives the rates). They stop
    after an end-of-sequence token, which they keep. A prompt with no room in the target's
    context for ``gen_tokens`` more tokens is used without a continuation. The result is ordered
    prompt by prompt, temperatures inner; sequences already in ``DIR/sequences.jsonl`` (by
    either backend) are not generated again, and each is saved as soon as it is made.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} must be one of {', '.join(BACKENDS)}")
    if backend == "engine" and not hasattr(target.runtime, "forward_batch"):
        raise ConfigError(f"backend='engine' needs the native runtime; {target.name} runs on "
                          f"{type(target.runtime).__name__}: use backend='hf'")
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
    jobs: list[Job] = []
    for i, prompt in enumerate(prompts):
        prompt_ids = list(target.encode_prompt(prompt.prompt))
        for j, temp in enumerate(gen_temperatures):
            job_seed = seed + i + 100_003 * j
            key = _key(target.name, prompt.prompt, gen_tokens, float(temp), job_seed)
            jobs.append((key, prompt_ids, float(temp), prompt.question_id, job_seed))
    todo = [job for job in jobs if job[0] not in cached]
    total, done = len(jobs), len(jobs) - len(todo)
    if on_progress:
        on_progress(done, total)
    if todo:
        room = target.runtime.max_context - gen_tokens
        # same temperature together, similar lengths together (less padding, fewer attention groups)
        todo.sort(key=lambda job: (job[2], len(job[1])))
        with cache_path.open("a", encoding="utf-8") as f:

            def save(job: Job, continuation: list[int]) -> None:
                nonlocal done
                cached[job[0]] = job[1] + list(continuation)
                f.write(json.dumps({"key": job[0], "question_id": job[3], "ids": cached[job[0]]}) + "\n")
                f.flush()
                done += 1
                if on_progress:
                    on_progress(done, total)

            fits = [job for job in todo if len(job[1]) <= room]
            for job in todo:
                if len(job[1]) > room:
                    save(job, [])
            if fits and (backend == "engine" or (backend == "auto" and hasattr(target.runtime, "forward_batch"))):
                _generate_engine(target, fits, gen_tokens=gen_tokens, save=save)
            elif fits:
                _generate_hf(target, fits, gen_tokens=gen_tokens, seed=seed, save=save)
    return [cached[job[0]] for job in jobs]


def load_hf(target: Any, device: torch.device | str = "cpu") -> Any:
    """The target's weights as a float32 ``transformers`` model on ``device``, for batched
    generation (distillation data, train-head's answers and Magpie instructions)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(target.folder), dtype=torch.float32)
    finally:
        hf_logging.enable_progress_bar()
    return model.to(device).eval()


def token_ranking(sequences: Sequence[Sequence[int]], vocab_size: int, always: Sequence[int] = ()) -> list[int]:
    """Every token id, in the order a reduced draft vocabulary takes them: ``always`` (the
    end-of-sequence ids) first, then by descending frequency in the token stream, ties to the
    lowest id.

    >>> token_ranking([[5, 5, 7, 9], [7, 5]], vocab_size=10, always=[2])
    [2, 5, 7, 9, 0, 1, 3, 4, 6, 8]
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        if seq:
            counts += torch.bincount(torch.as_tensor(seq, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    chosen = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size]
    taken = set(chosen)
    # stable sort: equal counts keep ascending id order
    return chosen + [i for i in torch.sort(-counts, stable=True).indices.tolist() if i not in taken]


def frequent_tokens(sequences: Sequence[Sequence[int]], n: int, vocab_size: int, always: Sequence[int] = ()) -> list[int]:
    """The ``n`` token ids a reduced draft head keeps (FR-Spec), sorted ascending: the first ``n``
    of :func:`token_ranking`.

    >>> frequent_tokens([[5, 5, 7, 9], [7, 5]], 3, vocab_size=10, always=[2])
    [2, 5, 7]
    """
    return sorted(token_ranking(sequences, vocab_size, always)[:n])


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
