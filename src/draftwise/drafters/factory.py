"""Build the drafter a :class:`~draftwise.drafters.spec.DraftSpec` names, for a target model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftwise.core.draft import Capabilities, Drafter
from draftwise.drafters.hybrid import HybridDrafter
from draftwise.drafters.lookup import PromptLookupDrafter
from draftwise.drafters.packs import META_FILE, default_draft_folder
from draftwise.drafters.self_spec import SelfSpecDrafter
from draftwise.drafters.small_model import ModelDrafter, check_same_tokenizer
from draftwise.drafters.spec import SPEC_HELP, DraftSpec
from draftwise.drafters.suffix import MAX_MATCH, SuffixCache, SuffixDrafter
from draftwise.eagle.drafter import default_head_weights, eagle_drafter
from draftwise.errors import ConfigError
from draftwise.runtime.loaders import cache_dir, load_model

# Layer sets `draftwise calibrate-self` found for built-in models, used by plain `self` until the
# user calibrates their own. Keyed by the converted folder's name, which includes a hash of the
# GGUF. SmolLM2-135M-Instruct Q4_1: `draftwise calibrate-self --num-prompts 3 -n 32` kept 22 of
# 30 layers, skipping 11-18.
SHIPPED_SELF_SKIPS: dict[str, frozenset[int]] = {
    "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f": frozenset(range(11, 19)),
}


def calibration_path(model: Any) -> Path:
    """Where ``draftwise calibrate-self`` saves the layer set plain ``self`` uses for ``model``."""
    return cache_dir() / "self_spec" / f"{Path(model.folder).name}.json"


def calibrated_layers(model: Any) -> list[int] | None:
    """The saved calibration's layer set for ``model``, if there is one; a damaged file is an
    error that says how to fix it, never a traceback."""
    path = calibration_path(model)
    if not path.exists():
        return None
    try:
        layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise TypeError
        return layers
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(
            f"the self-speculation calibration {path} is damaged; delete it or run "
            "`draftwise calibrate-self` again"
        ) from None


def _apply_vocab_subset(draft_model: Any) -> None:
    """A draft trained with ``draftwise distill --vocab-size-draft N`` scores only its N kept
    tokens (listed in its folder's draftwise_draft.json); verification is unaffected."""
    meta = Path(draft_model.folder) / META_FILE
    restrict = getattr(draft_model.runtime, "restrict_head", None)
    if restrict is None or not meta.is_file():
        return
    rows = json.loads(meta.read_text()).get("vocab_subset")
    if rows:
        restrict(rows)


def model_draft_source(source: str, target: Any) -> str | Path:
    """What ``model:SOURCE`` loads for ``target``: SOURCE itself (a folder, .gguf or built-in
    name), or for ``default`` the folder of the distilled draft that ships for the target."""
    return default_draft_folder(target) if source.strip() == "default" else source


def _self_drafter(spec: DraftSpec, model: Any) -> SelfSpecDrafter:
    rt = model.runtime
    layers = spec.self_layers(rt.num_layers)
    if layers is None:
        layers = calibrated_layers(model)
    if layers is None:
        shipped = SHIPPED_SELF_SKIPS.get(Path(model.folder).name)
        if shipped is not None and rt.num_layers > max(shipped):
            layers = [i for i in range(rt.num_layers) if i not in shipped]
        else:
            layers = list(range(rt.num_layers // 2))
    return SelfSpecDrafter(rt, layers)


def _suffix_drafter(spec: DraftSpec, model: Any) -> SuffixDrafter:
    """A suffix drafter with a cache of its own: whoever keeps the drafter (a bench method, a
    server) keeps the cache, and no other drafter ever reads it."""
    context = getattr(getattr(model, "runtime", None), "max_context", None)
    for key in ("nodes", "depth"):
        value = getattr(spec, key)
        if isinstance(context, int) and value > context:
            raise ConfigError(f"{spec}: {key}={value} is over this model's context of {context} tokens")
    depth = MAX_MATCH + spec.depth
    cache = SuffixCache(spec.cache, depth) if spec.cache else None
    return SuffixDrafter(nodes=spec.nodes, depth=spec.depth, factor=spec.factor, min_prob=spec.min_prob, cache=cache)


def _share_learned(drafter: Any, source: Any) -> None:
    """Point ``drafter`` at ``source``'s cross-generation cache (a hybrid: its copy draft's)."""
    if isinstance(drafter, HybridDrafter) and isinstance(source, HybridDrafter):
        _share_learned(drafter.copy, source.copy)
    elif isinstance(drafter, SuffixDrafter) and isinstance(source, SuffixDrafter):
        if drafter.max_depth != source.max_depth:
            raise ConfigError("share_with must be a drafter of the same spec")
        drafter.cache = source.cache  # a SuffixCache is thread-safe, and one owner keeps it
    elif drafter.capabilities.learns:
        raise ConfigError(f"{drafter.name} learns across generations but cannot share what it learns")


def capabilities_of(spec: DraftSpec | str) -> Capabilities:
    """What the drafter ``spec`` names declares (:class:`Capabilities`), without building it
    (the planner reads this before it loads any weights); ``make_drafter(spec, model)
    .capabilities`` is the same statement.

    >>> capabilities_of("suffix").tree_policy, capabilities_of("lookup:branches=3").tree_policy
    ('scored', 'unscored')
    >>> capabilities_of("self").replay, capabilities_of("eagle:default").cost
    ('hits', 'head')
    """
    spec = DraftSpec.parse(spec)
    if spec.then is not None:
        return Capabilities.hybrid(capabilities_of(replace(spec, then=None)), capabilities_of(spec.then))
    if spec.kind == "lookup":
        return Capabilities(trees=spec.branches > 1, replay="exact", cost="host")
    if spec.kind == "suffix":
        return Capabilities(trees=True, scored=True, learns=spec.cache > 0, replay="exact", cost="host")
    if spec.kind == "self":
        return Capabilities(shares_target_cache=True, replay="hits", cost="target_layers")
    if spec.kind == "model":
        return Capabilities(replay="hits", cost="model")
    if spec.kind == "eagle":
        return Capabilities(trees=spec.branches > 1, reads_features=True, replay="rates", cost="head")
    return Capabilities()  # none: plain decoding


def cost_variant(spec: DraftSpec | str) -> str:
    """What, beside its spec, decides what ``spec`` costs on this machine: ``"head int8"`` or
    ``"head float32"`` for a draft with an EAGLE head (the weight format :func:`make_drafter`
    gives the head here, :func:`~draftwise.eagle.drafter.default_head_weights`), and for a
    hybrid its head's ``fill`` as well (the spec's canonical form leaves out the default, which
    was 1 before it was 3); ``""`` for every other draft. A cached cost measured
    under another variant is stale (a profile made before heads drafted in int8 priced them ~30%
    too high).

    >>> cost_variant("suffix"), cost_variant("lookup:min=1"), cost_variant("suffix+eagle:h,fill=2").endswith(" fill 2")
    ('', '', True)
    """
    spec = DraftSpec.parse(spec)
    if spec.then is not None:  # a hybrid costs what its copy draft and its head cost, and its fill
        parts = (cost_variant(replace(spec, then=None)), cost_variant(spec.then), f"fill {spec.then.fill}")
        return " ".join(v for v in parts if v)
    return f"head {default_head_weights()}" if spec.kind == "eagle" else ""


def make_drafter(spec: Drafter | DraftSpec | str | None, model: Any, *, share_with: Drafter | None = None
                 ) -> Drafter | None:
    """The drafter ``spec`` names for target ``model`` (a :class:`draftwise.Model`); None for
    ``none``. A drafter object is returned as it is. Every call builds a new drafter with its
    own state (a suffix draft's cache included): to learn across generations, keep the object.

    ``share_with``: a drafter of the same spec whose state *across* generations (a suffix
    draft's cache of earlier answers: ``capabilities.learns``) the new one reads and teaches too,
    while everything of one generation stays its own: what several generations running at once
    (one server, many slots) need."""
    if spec is None:
        return None
    if share_with is not None:
        drafter = make_drafter(spec, model)
        if drafter is not None:
            _share_learned(drafter, share_with)
        return drafter
    if not isinstance(spec, (str, DraftSpec)):
        if isinstance(spec, Drafter):
            return spec
        raise ConfigError(f"draft={spec!r} is neither a drafter nor a spec ({SPEC_HELP})")
    spec = DraftSpec.parse(spec)
    if spec.then is not None:  # a copy draft and a head, each built as on its own
        copy = make_drafter(replace(spec, then=None), model)
        head = make_drafter(spec.then, model)
        assert copy is not None and head is not None
        return HybridDrafter(copy, head, fill=spec.then.fill, skip_from=spec.then.skip_from, label=str(spec))
    if spec.kind == "lookup":
        return PromptLookupDrafter(max_ngram=spec.max_ngram, min_ngram=spec.min_ngram, branches=spec.branches)
    if spec.kind == "suffix":
        return _suffix_drafter(spec, model)
    if spec.kind == "self":
        return _self_drafter(spec, model)
    if spec.kind == "model":
        assert spec.source is not None
        # the draft runs where the target runs (verification compares their distributions),
        # in the target's weight format (a q4 target gets a q4 draft)
        device = str(getattr(model.runtime, "device", "cpu"))
        quant = str(getattr(model.runtime, "quant", "none"))
        draft_model = load_model(
            model_draft_source(spec.source, model), dtype=model.dtype, device=device, quant=quant
        )
        check_same_tokenizer(model.tokenizer, draft_model.tokenizer)
        _apply_vocab_subset(draft_model)
        return ModelDrafter(draft_model.runtime, vocab_size=model.runtime.vocab_size, label=f"model:{draft_model.name}")
    if spec.kind == "eagle":
        assert spec.source is not None
        return eagle_drafter(spec.source, model, topk=spec.branches, depth=spec.depth)
    return None
