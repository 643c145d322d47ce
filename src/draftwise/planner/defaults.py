"""The drafts the planner considers when the user names none: one list for ``draftwise plan``
and ``draftwise demo``; the server's start-up plan takes :data:`DEFAULT_DRAFTS` alone (below).

The list holds what won when measured, so that taking the defaults can end in the best draft:

- ``lookup`` and ``suffix`` at ``--k auto`` measured 1.5-1.6x over plain decoding on the
  default model's dev questions (1.8x on held-out ones), and a plan gets them almost free (their
  steps are replayed offline for every k, and for the adaptive k);
- left out: ``self`` (0.90x), the distilled ``model:default`` (0.93x at k=1) and the head on
  its own, ``eagle:default`` (1.1x at k=1). Each costs a traced run in a plan and a column in a
  benchmark, and none of them paid;
- added in greedy plans where a head ships for the model: the hybrid ``suffix+eagle:default``
  (:data:`HEAD_DRAFT`). With the head trained on 512 ShareGPT conversations (drafting 0.410 at
  k=1 on held-out MT-bench, against 0.327 for the head before it; the one on 1,024 that replaced
  it drafts at 0.465), a plan that weighs it picked it in every category, and its pick
  (``auto``) beat the better of ``lookup`` and ``suffix`` on questions the plan had not seen,
  in each run (docs/benchmarks.md#the-planners-pick). With the earlier head it measured below ``suffix``
  (1.79x against 1.87x), which is why it was offered by name only before;
- not in sampled plans (temperature > 0): there every candidate that proposes distributions
  costs a traced run per continuation (8 a prompt by default, against a free replay for the
  copy drafts), and the temperature-0.7 checks of the planner were run without it;
- not in the server's start-up plan (``serve --draft auto`` without ``--plan``): it would add a
  traced run per question to the start, and the head's cost inside a batched pass (a head copy
  per slot) has not been measured against the copy drafts'.

>>> DEFAULT_DRAFTS, HEAD_DRAFT
(('lookup', 'suffix'), 'suffix+eagle:default')
"""

from __future__ import annotations

from typing import Any

from draftwise.eagle.drafter import shipped_head

#: the drafts a plan considers by default, on any model
DEFAULT_DRAFTS: tuple[str, ...] = ("lookup", "suffix")
#: the hybrid with the head that ships for a target (``eagle:default``): greedy plans add it
HEAD_DRAFT = "suffix+eagle:default"


def default_drafts(model: Any, temperature: float = 0.0) -> list[str]:
    """The drafts to consider for ``model``: :data:`DEFAULT_DRAFTS`, and in a greedy plan
    (``temperature`` 0) :data:`HEAD_DRAFT` as well when a head ships for the model."""
    head = head_draft(model) if temperature == 0 else None
    return [*DEFAULT_DRAFTS, *([head] if head else [])]


def head_draft(model: Any) -> str | None:
    """:data:`HEAD_DRAFT` when a head ships for ``model`` (see
    :func:`draftwise.eagle.drafter.shipped_head`), else None."""
    return HEAD_DRAFT if shipped_head(model) is not None else None


def default_drafts_text() -> str:
    """The default as a user reads it in ``--help``."""
    return f"{','.join(DEFAULT_DRAFTS)}, and {HEAD_DRAFT} at temperature 0 when a head ships for the model"
