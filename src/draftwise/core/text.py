"""Token ids -> text, incrementally: what streaming and stop strings are built on.

Two things make this harder than ``tokenizer.decode`` per token:

- a multi-byte character can be split across tokens; decoding a lone piece gives U+FFFD, so a
  piece whose text ends in U+FFFD is held back until the character is whole;
- some tokenizers (SentencePiece) drop a leading space when a token is decoded alone, so each new
  piece is decoded together with the previous tokens and only the difference is emitted.

Stop strings: text that could still become a stop string is held back, and the text ends right
before the first stop string that appears.

>>> from types import SimpleNamespace
>>> pieces = {1: "Hel", 2: "lo", 3: " wor", 4: "ld"}
>>> tok = SimpleNamespace(decode=lambda ids, **kw: "".join(pieces[i] for i in ids))
>>> asm = TextAssembler(tok, stop=("wor",))
>>> asm.push([1, 2]), asm.push([3]), asm.stopped, asm.text
('Hello', ' ', True, 'Hello ')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftwise.errors import ConfigError

_REPLACEMENT = "\ufffd"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def decode_escapes(text: str) -> str:
    r"""``\n``, ``\t``, ``\r`` and ``\\`` -> newline, tab, carriage return and one backslash.

    A shell passes ``--stop "\n\n"`` as backslash-n twice, not as newlines; this is how the CLI
    reads it. Any other backslash is kept as it is (so a Windows path survives), and non-ASCII
    text is untouched (unlike the ``unicode_escape`` codec).

    >>> decode_escapes(r"\n\n"), decode_escapes(r"a\tb\\n"), decode_escapes(r"C:\x é")
    ('\n\n', 'a\tb\\n', 'C:\\x é')
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class TextAssembler:
    """Accumulates generated token ids and hands out text that is safe to show."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        if any(not s for s in stop):
            raise ConfigError("stop strings must be non-empty; drop the empty one")
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._prefix_off = 0  # decode window: ids[prefix_off:] gives context for the next piece
        self._read_off = 0  # ids before this offset are already turned into text
        self._pending = ""  # decoded text held back because it may start a stop string
        self.text = ""  # text emitted so far
        self.stopped = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(
            list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def push(self, ids: Sequence[int]) -> str:
        """Add generated ids; return the new text that is safe to emit (may be '')."""
        if self.stopped:
            return ""
        self._ids.extend(ids)
        prefix = self._decode(self._ids[self._prefix_off : self._read_off])
        full = self._decode(self._ids[self._prefix_off :])
        if full.endswith(_REPLACEMENT) or len(full) < len(prefix):
            return ""  # an incomplete character: wait for the next token
        self._pending += full[len(prefix) :]
        self._prefix_off, self._read_off = self._read_off, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """Flush whatever is held back (generation ended)."""
        if self.stopped:
            return ""
        if self._read_off < len(self._ids):
            prefix = self._decode(self._ids[self._prefix_off : self._read_off])
            full = self._decode(self._ids[self._prefix_off :])
            self._pending += full[len(prefix) :]
            self._read_off = len(self._ids)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if not self._stop:
            out, self._pending = self._pending, ""
            self.text += out
            return out
        # a stop string may straddle emitted text and pending text
        longest = max(len(s) for s in self._stop)
        window_start = max(0, len(self.text) - longest + 1)
        window = self.text[window_start:] + self._pending
        hits = [window.find(s) for s in self._stop]
        hits = [h for h in hits if h >= 0]
        if hits:
            cut = window_start + min(hits)  # index of the stop string in the whole text
            out = (self.text + self._pending)[len(self.text) : cut] if cut > len(self.text) else ""
            self.text += out
            self._pending = ""
            self.stopped = True
            return out
        keep = 0 if final else _held_suffix(self._pending, self._stop)
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        self.text += out
        return out


def _held_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
