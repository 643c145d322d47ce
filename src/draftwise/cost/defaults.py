"""The drafts the planner considers when the user names none: one list for ``draftwise plan``,
``draftwise demo`` and the server's start-up plan.

The list holds what won when measured, so that taking the defaults can end in the best draft:

- ``lookup`` and ``suffix`` at ``--k auto`` measured 1.5-1.6x over plain decoding on the
  default model's dev questions (1.8x on held-out ones), and a plan gets them almost free (their
  steps are replayed offline for every k, and for the adaptive k);
- left out: ``self`` (0.90x), the distilled ``model:default`` (0.93x at k=1) and the head on
  its own, ``eagle:default`` (1.1x at k=1). Each costs a traced run in a plan and a column in a
  benchmark, and none of them paid;
- also left out, and offered by name: the hybrid ``suffix+eagle:default`` (:data:`HEAD_DRAFT`).
  It measured below ``suffix`` on questions the plan had not seen, in two runs on the 2-core
  AMD EPYC (1.79x against 1.87x, and in the demo 1.32x against 1.37x), while the plan rated it
  above (1.89x against 1.83x): its in-loop cost is higher than the profile measures (the head
  catches up on every accepted token), so a plan that weighs it routes categories to it and
  loses (``auto`` 1.80x against ``suffix`` 1.85x; docs/benchmarks.md#the-planners-pick).

>>> DEFAULT_DRAFTS, HEAD_DRAFT
(('lookup', 'suffix'), 'suffix+eagle:default')
"""

from __future__ import annotations

from typing import Any

from ..drafters.eagle import shipped_head

#: the drafts a plan considers by default, on any model
DEFAULT_DRAFTS: tuple[str, ...] = ("lookup", "suffix")
#: the hybrid with the head that ships for a target (``eagle:default``): by name only (see above)
HEAD_DRAFT = "suffix+eagle:default"


def default_drafts(model: Any) -> list[str]:
    """The drafts to consider for ``model``: :data:`DEFAULT_DRAFTS` (the same on every model;
    the hybrid with a shipped head, :data:`HEAD_DRAFT`, is asked for by name)."""
    return list(DEFAULT_DRAFTS)


def head_draft(model: Any) -> str | None:
    """:data:`HEAD_DRAFT` when a head ships for ``model`` (see
    :func:`draftwise.drafters.eagle.shipped_head`), else None."""
    return HEAD_DRAFT if shipped_head(model) is not None else None


def default_drafts_text() -> str:
    """The default as a user reads it in ``--help``."""
    return f"{','.join(DEFAULT_DRAFTS)} (add {HEAD_DRAFT} by name when a head ships for the model)"
