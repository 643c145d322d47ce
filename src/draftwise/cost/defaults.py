"""The drafts the planner considers when the user names none: one list for ``draftwise plan``,
``draftwise demo`` and the server's start-up plan.

The list holds what won when measured, so that taking the defaults can end in the best draft:

- ``lookup`` and ``suffix`` at ``--k auto`` measured 1.5-1.6x over plain decoding on the
  default model's dev questions (1.8x on held-out ones), and a plan gets them almost free (their
  steps are replayed offline for every k);
- ``suffix+eagle:default`` matched or beat them (1.58x against 1.52x on one machine, 1.60x
  against 1.61x on another), and is considered whenever a head ships for the target;
- left out: ``self`` (0.90x), the distilled ``model:default`` (0.93x at k=1) and the head on
  its own, ``eagle:default`` (1.1x at k=1, below the hybrid that contains it). Each costs a
  traced run in a plan and a column in a benchmark, and none of them paid.

>>> DEFAULT_DRAFTS, HEAD_DRAFT
(('lookup', 'suffix'), 'suffix+eagle:default')
"""

from __future__ import annotations

from typing import Any

from ..drafters.eagle import shipped_head

#: the drafts a plan considers by default, on any model
DEFAULT_DRAFTS: tuple[str, ...] = ("lookup", "suffix")
#: added to :data:`DEFAULT_DRAFTS` when an EAGLE head ships for the target (``eagle:default``)
HEAD_DRAFT = "suffix+eagle:default"


def default_drafts(model: Any) -> list[str]:
    """The drafts to consider for ``model``: :data:`DEFAULT_DRAFTS`, then :data:`HEAD_DRAFT`
    when a head ships for it (see :func:`draftwise.drafters.eagle.shipped_head`)."""
    return [*DEFAULT_DRAFTS, *([HEAD_DRAFT] if shipped_head(model) is not None else [])]


def default_drafts_text() -> str:
    """The default as a user reads it in ``--help``."""
    return f"{','.join(DEFAULT_DRAFTS)}, and {HEAD_DRAFT} when a head ships for the model"
