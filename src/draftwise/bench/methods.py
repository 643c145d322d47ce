"""The rows of a benchmark: plain decoding, each draft at its k, ``auto`` and the peers.

A method's name is what the tables, the answer file and ``--resume`` know it by, so it is built
from the canonical draft spec (``str(DraftSpec)``): ``lookup:min=2,max=4`` and
``lookup:max=4,min=2`` are one method. A draft given with its own k is named ``SPEC@k=K``, so one
run can compare several k; ``auto`` is the plan's choice per category.

>>> [(name, str(spec), k) for name, spec, k in parse_methods("none,lookup:min=2,max=4, self@2", 4)]
[('lookup:max=4,min=2', 'lookup:max=4,min=2', 4), ('self@k=2', 'self', 2)]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from draftwise.drafters.spec import (
    SPEC_HELP,
    DraftSpec,
    KValue,
    parse_draft_item,
    parse_k,
    split_draft_list,
)
from draftwise.errors import ConfigError

BASELINE = "none"
AUTO = "auto"
PEERS = ("hf",)

#: a ``--drafts`` item: a spec string (``"lookup"``, ``"lookup@k=8"``, ``"auto"``) or a (spec, k) pair
DraftItem = Union[str, DraftSpec, tuple[Union[str, DraftSpec], KValue]]


@dataclass
class Method:
    """One row of the benchmark.

    ``kind`` is ``"draftwise"`` (plain decoding or a draft), ``"auto"`` (the plan's choice per
    category) or ``"hf"`` (Hugging Face ``generate``); ``spec`` is the canonical draft spec, or
    the peer's variant; ``drafter`` is built once, before the run.
    """

    name: str
    kind: str
    spec: str = BASELINE
    k: KValue = 1
    drafter: Any = None
    hf_kwargs: dict[str, Any] = field(default_factory=dict)


def _item(item: DraftItem, k: KValue) -> tuple[str, DraftSpec | str, KValue]:
    """One draft item -> (method name, DraftSpec or ``"auto"``, k)."""
    if isinstance(item, tuple):
        if len(item) != 2:
            raise ConfigError(f"draft {item!r} is neither a spec string nor a (spec, k) pair")
        text, item_k = item
        spec: DraftSpec | str = AUTO if str(text).strip() == AUTO else DraftSpec.parse(text)
        item_k = parse_k(item_k)
        return f"{spec}@k={item_k}", spec, item_k
    if isinstance(item, DraftSpec):
        return str(item), item, k
    if not isinstance(item, str):
        raise ConfigError(f"draft {item!r} is neither a spec string nor a (spec, k) pair ({SPEC_HELP})")
    spec, item_k = parse_draft_item(item, k)
    name = f"{spec}@k={item_k}" if "@" in item else str(spec)
    return name, spec, item_k


def parse_methods(drafts: str | Sequence[DraftItem], k: KValue) -> list[tuple[str, DraftSpec | str, KValue]]:
    """``--drafts`` -> ``(method name, DraftSpec or "auto", k)``, validated; ``none`` is dropped
    (plain decoding always runs). A plain spec takes the global ``k``; ``SPEC@k=K`` or a
    ``(spec, K)`` pair has its own and is named ``SPEC@k=K``.

    >>> [name for name, _, _ in parse_methods([("lookup", 4), ("lookup", 8), "auto"], 4)]
    ['lookup@k=4', 'lookup@k=8', 'auto']
    """
    k = parse_k(k)
    items: Sequence[DraftItem] = split_draft_list(drafts) if isinstance(drafts, str) else drafts
    out: list[tuple[str, DraftSpec | str, KValue]] = []
    for item in items:
        name, spec, item_k = _item(item, k)
        if isinstance(spec, DraftSpec) and spec.is_none:
            continue
        if any(name == n for n, _, _ in out):
            raise ConfigError(f"draft {name!r} is listed twice")
        out.append((name, spec, item_k))
    return out


def parse_peers(peers: str | Sequence[str]) -> tuple[str, ...]:
    """``"hf"`` / ``["hf"]`` -> ``("hf",)``; an unknown peer is a ConfigError."""
    items = peers.split(",") if isinstance(peers, str) else list(peers)
    out = tuple(p.strip() for p in items if p.strip())
    for p in out:
        if p not in PEERS:
            raise ConfigError(f"unknown peer {p!r}; known peers: {', '.join(PEERS)}")
    return out


def is_peer(name: str) -> bool:
    """Whether a method name is a peer's (``hf``, ``hf-lookup``, ...)."""
    return name == "hf" or name.startswith("hf-")


def method_filename(name: str) -> str:
    """A file name for a method's answers.

    >>> method_filename("model:/models/small@k=4")
    'model_models_small@k=4.jsonl'
    """
    return re.sub(r"[^A-Za-z0-9._@=+-]+", "_", name).strip("_") + ".jsonl"
