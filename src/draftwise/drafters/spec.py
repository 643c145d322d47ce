"""Draft specs: the one parser for the strings ``--draft``, ``--drafts``, ``generate(draft=...)``,
profiles, plans, bench and export accept.

=====================  =======================================================================
``none``               no draft: plain decoding
``lookup``             prompt lookup; options ``lookup:max=4,min=2`` (n-gram sizes, 1 <= min <= max),
                       ``branches=B``: a tree of B distinct continuations (default 1, a chain)
``suffix``             suffix decoding: token trees from this generation and a cache of earlier
                       outputs; ``suffix:nodes=16,depth=8,cache=64,factor=4,min_prob=0.1`` (most
                       nodes, most levels, generations cached (0: off), nodes per matched token,
                       least path probability)
``self``               self-speculation with the calibrated layer set (``draftwise
                       calibrate-self``, or the set shipped for a built-in model), else an
                       early exit after half the layers
``self:exit=L``        early exit after layer L (runs layers 0..L-1)
``self:layers=0-9,12`` exactly these layers;  ``self:skip=10-19``: all but these
``model:PATH``         a smaller model with the same tokenizer (folder, .gguf, built-in name)
``model:default``      the distilled draft that ships for the target (SmolLM2-135M-Instruct)
``eagle:PATH``         a feature-level draft head (EAGLE) trained by ``draftwise train-head``
``eagle:default``      the head that ships for the target; ``eagle:default,topk=4,depth=6``: greedy
                       steps propose EAGLE-2 token trees (K children per expanded node)
``suffix+eagle:PATH``  a hybrid: a copy draft (``suffix`` or ``lookup``, with its options) and an
                       EAGLE head's guess in one tree (:mod:`draftwise.drafters.hybrid`);
                       ``suffix+eagle:default,fill=2,skip_from=4``: the head drafts 2 tokens
                       where the copy draft has none, and is skipped behind a copy path of 4
=====================  =======================================================================

A :class:`DraftSpec` is frozen and validated when built; ``str(spec)`` is its canonical form, the
key profiles and plans use, so ``lookup:min=1,max=3`` and ``lookup`` name the same draft.

>>> str(DraftSpec.parse(" lookup:min=2, max=4 ")), str(DraftSpec.parse("self:skip=18,11-17"))
('lookup:max=4,min=2', 'self:skip=11-18')
>>> [(str(s), k) for s, k in parse_draft_list("none,lookup:max=4,min=2@k=6,self", 4)]
[('none', 4), ('lookup:max=4,min=2', 6), ('self', 4)]
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Union

from draftwise.errors import ConfigError


def clip(text: str, limit: int = 60) -> str:
    """A user's value for an error message, cut so a huge one cannot flood the terminal."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def int_ranges(text: str) -> list[tuple[str, int, int]]:
    """``"0-3, 7"`` -> ``[("0-3", 0, 3), ("7", 7, 7)]``: each comma-separated part with its
    bounds (empty parts skipped). A part that is not ``N`` or ``N-M`` raises ``ValueError(part)``;
    callers check the bounds and word the error for their option.

    >>> int_ranges("0-3, 7")
    [('0-3', 0, 3), ('7', 7, 7)]
    """
    out: list[tuple[str, int, int]] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo_text, dash, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise ValueError(part) from None
        out.append((part, lo, hi))
    return out


def parse_layer_list(text: str) -> tuple[int, ...]:
    """``"0-3,7"`` -> ``(0, 1, 2, 3, 7)``: sorted, unique, each >= 0 (no upper bound here).

    >>> parse_layer_list("7, 0-3")
    (0, 1, 2, 3, 7)
    """
    try:
        ranges = int_ranges(text)
    except ValueError:
        raise ConfigError(f"cannot read layer list {clip(text)}; write it like '0-3,7'") from None
    out: set[int] = set()
    for part, lo, hi in ranges:
        if lo < 0 or hi < lo or hi - lo > 100_000:
            raise ConfigError(f"layer range {clip(part)} is not a range of layer numbers like '0-3'")
        out.update(range(lo, hi + 1))
    if not out:
        raise ConfigError(f"the layer list {clip(text)} is empty; write it like '0-3,7'")
    return tuple(sorted(out))


def format_layers(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3,7"`` (the inverse of :func:`parse_layer_list`).

    >>> format_layers([0, 1, 2, 3, 7, 9, 10])
    '0-3,7,9-10'
    """
    parts: list[list[int]] = []
    for i in sorted(set(layers)):
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


SPEC_HELP = (
    "none, lookup[:max=N,min=N,branches=B], suffix[:nodes=N,depth=D,cache=R,factor=F,min_prob=P], "
    "self[:exit=L|layers=..|skip=..], model:PATH, model:default, eagle:PATH, eagle:default, "
    "suffix+eagle:default[,fill=N,skip_from=N]"
)
#: the options after an eagle spec's path
_EAGLE_KEYS = ("topk", "depth", "fill", "skip_from")
#: where a hybrid spec's second part begins: a ``+`` before a draft kind
_PLUS = re.compile(r"\+\s*(?=(?:none|lookup|suffix|self|model|eagle)\b)")
KINDS = ("none", "lookup", "suffix", "self", "model", "eagle")
LOOKUP_MAX, LOOKUP_MIN = 3, 1  # the lookup defaults: n-grams of 3 down to 1 tokens
#: a hybrid's head tokens where the copy draft proposes nothing (``fill=``): with the 2,048-conversation
#: head, 3 beat 2 and 1 on the dev questions that chose it, measured and in the oracle; on unseen
#: questions it measured level with 1 (docs/benchmarks.md)
FILL = 3
MAX_NODES = 256  # the most tokens a draft proposes in one step (k, or a tree's nodes)
#: ``serve --max-k``'s default, the largest k a server's request may ask: twice the largest k a plan
#: or k ``auto`` tries (8), and a default suffix tree's node budget (16). A step verifies k + 1
#: rows of a sequence, so a larger k mostly lengthens the passes of every request batched with it
DEFAULT_MAX_K = 16
# suffix defaults: nodes, depth, cached generations, nodes per matched token, least path prob
SUFFIX = {"nodes": 16, "depth": 8, "cache": 64, "factor": 4.0, "min_prob": 0.1}
_OPTIONS = {
    "lookup": ("max", "min", "branches"),
    "suffix": tuple(SUFFIX),
    "self": ("exit", "layers", "skip"),
}

DraftKind = Literal["none", "lookup", "suffix", "self", "model", "eagle"]
KValue = Union[int, str]  # an int >= 1, or "auto"


def _split_options(text: str, kind: str) -> dict[str, str]:
    """``"max=4,min=2"`` -> ``{"max": "4", "min": "2"}``; layer lists keep their own commas."""
    allowed = _OPTIONS[kind]
    parts: list[str] = []
    for chunk in text.split(","):
        if "=" in chunk or not parts:
            parts.append(chunk)
        else:
            parts[-1] += "," + chunk
    out: dict[str, str] = {}
    for part in parts:
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise ConfigError(f"unknown {kind} draft option {clip(part.strip())}; allowed: {', '.join(allowed)}")
        if key in out:
            raise ConfigError(f"{kind}:{key}= is given twice")
        out[key] = value.strip()
    return out


def _whole(kind: str, key: str, value: str, *, lo: int, what: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"{kind}:{key}= takes {what}, got {clip(value)}") from None
    if n < lo:
        raise ConfigError(f"{kind}:{key}= takes {what}, got {n if len(value) <= 60 else clip(value)}")
    return n


def _positive_int(kind: str, key: str, value: str) -> int:
    return _whole(kind, key, value, lo=1, what="a whole number >= 1")


def _number(kind: str, key: str, value: str, *, lo: float, hi: float, what: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not lo <= x < hi:  # also refuses nan
        raise ConfigError(f"{kind}:{key}= takes {what}, got {clip(value)}")
    return x


def _fmt(x: float) -> str:
    """A float as short as it can be written and still read back exactly."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


@dataclass(frozen=True)
class DraftSpec:
    """A validated draft choice. Build it with :meth:`parse`; ``str()`` gives the canonical spec."""

    kind: DraftKind = "none"
    max_ngram: int = LOOKUP_MAX
    min_ngram: int = LOOKUP_MIN
    exit_layer: int | None = None
    layers: tuple[int, ...] | None = None
    skip: tuple[int, ...] | None = None
    source: str | None = None
    branches: int = 1  # lookup: distinct continuations in the tree (1 = a chain)
    nodes: int = int(SUFFIX["nodes"])  # suffix options (see SUFFIX)
    depth: int = int(SUFFIX["depth"])
    cache: int = int(SUFFIX["cache"])
    factor: float = SUFFIX["factor"]
    min_prob: float = SUFFIX["min_prob"]
    then: DraftSpec | None = None  # a hybrid's EAGLE head (``suffix+eagle:default``)
    fill: int = FILL  # a hybrid's head tokens where the copy draft proposes nothing (eagle part)
    skip_from: int = 0  # a hybrid skips its head where the copy draft's path is this long (0: never)

    def __post_init__(self) -> None:
        if self.then is not None and (
            self.kind not in ("suffix", "lookup") or self.then.kind != "eagle" or self.then.then is not None
        ):
            raise ConfigError(
                f"a hybrid draft is a copy draft (suffix or lookup) + an eagle head, e.g. "
                f"suffix+eagle:default; got {self.kind}+{self.then}"
            )
        if self.kind not in KINDS:
            raise ConfigError(f"unknown draft kind {clip(str(self.kind))}; use one of: {SPEC_HELP}")
        if self.kind == "lookup" and not 1 <= self.min_ngram <= self.max_ngram:
            raise ConfigError(
                f"lookup needs 1 <= min <= max, got min={self.min_ngram}, max={self.max_ngram}"
            )
        if self.kind in ("lookup", "eagle") and not 1 <= self.branches <= MAX_NODES:
            raise ConfigError(f"{self.kind}:{'topk' if self.kind == 'eagle' else 'branches'}={self.branches} is out of range; use 1..{MAX_NODES}")
        if self.kind == "suffix":
            from draftwise.drafters.suffix import (
                check_suffix_options,  # the memory estimate lives with the structure
            )

            check_suffix_options(self.nodes, self.depth, self.cache, self.factor, self.min_prob, MAX_NODES)
        if self.kind == "self" and sum(x is not None for x in (self.exit_layer, self.layers, self.skip)) > 1:
            raise ConfigError("give one of self:exit=, self:layers= or self:skip=, not several")
        if self.kind in ("model", "eagle") and not (self.source or "").strip():
            raise ConfigError(
                f"{self.kind}: needs a path or name, e.g. {self.kind}:default or {self.kind}:/path/to/folder"
            )

    @classmethod
    def parse(cls, spec: DraftSpec | str | None) -> DraftSpec:
        """Parse a spec string (a DraftSpec is returned as it is; None means ``none``)."""
        if spec is None:
            return cls()
        if isinstance(spec, DraftSpec):
            return spec
        if not isinstance(spec, str):
            raise ConfigError(f"draft={spec!r} is not a draft spec string ({SPEC_HELP})")
        first, *more = _PLUS.split(spec, maxsplit=1)
        if more:
            nested = len(_PLUS.split(more[0], maxsplit=1)) > 1  # a third part: refused as a hybrid's head
            return replace(cls.parse(first), then=cls.parse(more[0]) if nested else cls._part(more[0]))
        got = cls._part(spec)
        if got.kind == "eagle" and (got.fill, got.skip_from) != (FILL, 0):
            raise ConfigError(f"fill= and skip_from= steer a hybrid's head: write them after a copy draft, "
                              f"e.g. suffix+{got}")
        return got

    @classmethod
    def _part(cls, spec: str) -> DraftSpec:
        """One part of a spec (a hybrid's copy draft or head, or a whole plain spec)."""
        kind, colon, rest = spec.strip().partition(":")
        kind = kind.strip()
        if kind == "model":
            return cls(kind, source=rest.strip())
        if kind == "eagle":  # a path, then optional topk=K / depth=D (and a hybrid's fill / skip_from) parts
            parts = rest.split(",")
            opts: dict[str, int] = {}
            while len(parts) > 1 and parts[-1].strip().partition("=")[0].strip() in _EAGLE_KEYS:
                key, _, value = parts.pop().strip().partition("=")
                opts[key.strip()] = _positive_int("eagle", key.strip(), value.strip())
            return cls("eagle", source=",".join(parts).strip(), branches=opts.get("topk", 1),
                       depth=opts.get("depth", int(SUFFIX["depth"])), fill=opts.get("fill", FILL),
                       skip_from=opts.get("skip_from", 0))
        if kind == "none" and not rest.strip():
            return cls()
        if kind not in _OPTIONS:
            raise ConfigError(f"unknown draft spec {clip(spec.strip())}; use one of: {SPEC_HELP}")
        opts = _split_options(rest, kind)
        if kind == "lookup":
            return cls(
                "lookup",
                max_ngram=_positive_int("lookup", "max", opts["max"]) if "max" in opts else LOOKUP_MAX,
                min_ngram=_positive_int("lookup", "min", opts["min"]) if "min" in opts else LOOKUP_MIN,
                branches=_positive_int("lookup", "branches", opts["branches"]) if "branches" in opts else 1,
            )
        if kind == "suffix":
            number = {"factor": ("a number > 0 and below 1e6", math.ulp(0.0), 1e6), "min_prob": ("a number in [0, 1)", 0.0, 1.0)}
            got: dict[str, float] = {}
            for key, value in opts.items():
                if key in number:
                    what, lo, hi = number[key]
                    got[key] = _number("suffix", key, value, lo=lo, hi=hi, what=what)
                elif key == "cache":
                    got[key] = _whole("suffix", key, value, lo=0, what="a whole number >= 0 (0 turns the cache off)")
                else:
                    got[key] = _positive_int("suffix", key, value)
            return cls("suffix", **got)  # type: ignore[arg-type]
        return cls(
            "self",
            exit_layer=_positive_int("self", "exit", opts["exit"]) if "exit" in opts else None,
            layers=parse_layer_list(opts["layers"]) if "layers" in opts else None,
            skip=parse_layer_list(opts["skip"]) if "skip" in opts else None,
        )

    def __str__(self) -> str:
        if self.then is not None:
            return f"{replace(self, then=None)}+{self.then}"
        if self.kind == "lookup":
            opts = [f"max={self.max_ngram}"] if self.max_ngram != LOOKUP_MAX else []
            opts += [f"min={self.min_ngram}"] if self.min_ngram != LOOKUP_MIN else []
            opts += [f"branches={self.branches}"] if self.branches != 1 else []
            return "lookup" + (":" + ",".join(opts) if opts else "")
        if self.kind == "suffix":
            opts = [f"{key}={_fmt(getattr(self, key))}" for key in SUFFIX if getattr(self, key) != SUFFIX[key]]
            return "suffix" + (":" + ",".join(opts) if opts else "")
        if self.kind == "self":
            if self.exit_layer is not None:
                return f"self:exit={self.exit_layer}"
            if self.layers is not None:
                return f"self:layers={format_layers(self.layers)}"
            if self.skip is not None:
                return f"self:skip={format_layers(self.skip)}"
            return "self"
        if self.kind == "eagle":
            opts = [f"topk={self.branches}"] if self.branches > 1 else []
            opts += [f"depth={self.depth}"] if self.branches > 1 and self.depth != SUFFIX["depth"] else []
            opts += [f"fill={self.fill}"] if self.fill != FILL else []
            opts += [f"skip_from={self.skip_from}"] if self.skip_from else []
            return f"eagle:{self.source.strip() if self.source else ''}" + "".join("," + o for o in opts)
        if self.kind in ("model", "eagle"):
            return f"{self.kind}:{self.source.strip() if self.source else ''}"
        return "none"

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    def self_layers(self, num_layers: int) -> list[int] | None:
        """The layers an explicit self spec runs on a model with ``num_layers`` layers (None for
        plain ``self``, whose set comes from calibration)."""
        if self.kind != "self":
            raise ConfigError(f"{self} is not a self draft")
        if self.exit_layer is not None:
            chosen: Sequence[int] = range(self.exit_layer)
            bad = [self.exit_layer] if self.exit_layer > num_layers else []
        elif self.layers is not None or self.skip is not None:
            given = self.layers if self.layers is not None else self.skip
            assert given is not None
            bad = [i for i in given if i >= num_layers]
            chosen = given if self.layers is not None else [i for i in range(num_layers) if i not in set(given)]
        else:
            return None
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise ConfigError(f"{self}: layer {shown} does not exist; the model has layers 0..{num_layers - 1}")
        if not chosen:
            raise ConfigError(f"{self} leaves no layer to run")
        return list(chosen)

    def early_exit_layer(self) -> int | None:
        """The L of an early exit after layers 0..L-1 equal to this self spec, when there is one
        (``skip`` needs the model's depth, so it gives None)."""
        if self.exit_layer is not None:
            return self.exit_layer
        if self.layers is not None and self.layers == tuple(range(len(self.layers))):
            return len(self.layers)
        return None


def parse_k(value: object) -> KValue:
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
            raise ConfigError(f"k={clip(text)} must be a whole number >= 1 or 'auto'") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"k={value!r} must be a whole number >= 1 or 'auto'")
    if value > 256:
        raise ConfigError(f"k={value} is too large; a draft proposes at most 256 tokens a step")
    return value


def split_draft_list(text: str) -> list[str]:
    """Split a comma-separated list of specs; a draft's own options use commas too
    (``lookup:max=4,min=2``, ``self:skip=1,3``), so a piece that has no ``:`` and is an option
    or a layer number continues the previous spec.

    >>> split_draft_list("lookup:max=4,min=2, self:skip=1,3,model:default")
    ['lookup:max=4,min=2', 'self:skip=1,3', 'model:default']
    """
    specs: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        head = _PLUS.split(piece.partition("@")[0], maxsplit=1)[0]
        continues = ":" not in head and ("=" in head or head.replace("-", "").isdigit())
        if specs and continues and ":" in specs[-1]:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def parse_draft_item(item: str, default_k: KValue) -> tuple[DraftSpec | str, KValue]:
    """``"lookup@k=8"`` or ``"lookup@8"`` -> (lookup, 8); ``"lookup"`` -> (lookup, default_k).
    ``"auto"`` (the plan's choice, for bench) is returned as the string ``"auto"``."""
    spec_text, at, k_text = item.strip().partition("@")
    k = parse_k(k_text.strip().removeprefix("k=")) if at else default_k
    if spec_text.strip() == "auto":
        return "auto", k
    return DraftSpec.parse(spec_text), k


def parse_draft_list(text: str | Sequence[str], default_k: KValue = 4) -> list[tuple[DraftSpec, KValue]]:
    """Parse ``--drafts``: specs, each optionally ``@k=K``; see :func:`split_draft_list`.
    Raises on an empty list and on a draft listed twice with the same k. (``auto`` is not a
    spec: bench handles it before calling this.)"""
    items = split_draft_list(text) if isinstance(text, str) else [str(t) for t in text]
    if not items:
        raise ConfigError(f"give at least one draft, e.g. lookup,self ({SPEC_HELP})")
    out: list[tuple[DraftSpec, KValue]] = []
    for item in items:
        spec, k = parse_draft_item(item, default_k)
        if isinstance(spec, str):
            raise ConfigError("'auto' is not a draft here; it is bench's plan-driven method")
        if (spec, k) in out:
            raise ConfigError(f"draft {str(spec)!r} with k={k} is listed twice")
        out.append((spec, k))
    return out
