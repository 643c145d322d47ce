"""``--k auto`` from a measured profile: the cached profile of a model (measured once when
missing) and the :class:`~draftwise.kpolicy.AdaptiveK` policy built from it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..drafters.spec import DraftSpec
from ..errors import ConfigError
from ..kpolicy import AdaptiveK
from .profile import Profile, default_profile_path, measure_profile


def auto_policy(model: Any, draft: DraftSpec | str, *, status: Any = None) -> AdaptiveK:
    """The adaptive-k policy for ``draft`` on ``model``, from its profile (measured if missing)."""
    key = str(DraftSpec.parse(draft))
    return AdaptiveK(resolve_profile(model, key, status=status), key)


def resolve_profile(model: Any, draft: str | Sequence[str], *, max_n: int = 9, status: Any = None) -> Profile:
    """The model's cached profile, measured now (and cached) if missing or lacking a draft
    (``draft``: one spec or several; all missing ones are measured in one go)."""
    path = default_profile_path(model)
    profile = None
    if path.exists():
        try:
            profile = Profile.load(path)
            profile.check_model(model)
        except ConfigError:
            profile = None
    wanted = {draft} if isinstance(draft, str) else set(draft)
    wanted.discard("none")
    if profile is not None and wanted <= set(profile.drafts) and profile.max_n >= 2:
        return profile
    if status is not None:
        status(f"measuring this machine's costs for --k auto (once; cached at {path})")
    drafts = sorted({*(profile.drafts if profile else {}), *wanted})
    max_n = max(max_n, profile.max_n if profile else 0)
    room = model.runtime.max_context - max_n - 8
    contexts = sorted({min(128, room // 4), min(1024, room)})
    fresh = measure_profile(model, drafts=drafts, max_n=max_n, contexts=contexts, repeats=3, progress=False)
    fresh.save(path)
    return fresh
