"""Draft specs: the strings the CLI and ``generate(draft=...)`` accept.

=====================  =======================================================================
``none``               no draft: plain decoding
``lookup``             prompt lookup; options ``lookup:max=4,min=2`` (n-gram sizes)
``self``               self-speculation with the calibrated layer set (``draftwise
                       calibrate-self``, or the set shipped for a built-in model), else an
                       early exit after half the layers
``self:exit=L``        early exit after layer L (runs layers 0..L-1)
``self:layers=0-9,12`` exactly these layers;  ``self:skip=10-19``: all but these
``model:PATH``         a smaller model with the same tokenizer (folder, .gguf, built-in name)
``model:default``      the distilled draft that ships for the target (SmolLM2-135M-Instruct)
=====================  =======================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter, check_same_tokenizer
from .self_spec import SelfSpecDrafter, parse_layers

# Layer sets `draftwise calibrate-self` found for built-in models, used by plain `self` until the
# user calibrates their own. Keyed by the converted folder's name, which includes a hash of the
# GGUF. SmolLM2-135M-Instruct Q4_1: `draftwise calibrate-self --num-prompts 3 -n 32`
# (2026-11-29) kept 22 of 30 layers, skipping 11-18.
SHIPPED_SELF_SKIPS: dict[str, frozenset[int]] = {
    "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f": frozenset(range(11, 19)),
}

SPEC_HELP = "none, lookup[:max=N,min=N], self[:exit=L|layers=..|skip=..], model:PATH, model:default"


def _options(text: str, allowed: tuple[str, ...], kind: str) -> dict[str, str]:
    out: dict[str, str] = {}
    # split on commas that start a new key=value (layer lists contain commas themselves)
    parts: list[str] = []
    for chunk in text.split(","):
        if "=" in chunk or not parts:
            parts.append(chunk)
        else:
            parts[-1] += "," + chunk
    for part in parts:
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in allowed:
            raise ConfigError(f"unknown {kind} draft option {part!r}; allowed: {', '.join(allowed)}")
        out[key.strip()] = value.strip()
    return out


def calibration_path(model: Any) -> Path:
    from ..loaders import cache_dir

    return cache_dir() / "self_spec" / f"{Path(model.folder).name}.json"


def _apply_vocab_subset(draft_model: Any) -> None:
    """A draft trained with ``draftwise distill --vocab-size-draft N`` scores only its N kept
    tokens (listed in its folder's draftwise_draft.json); verification is unaffected."""
    meta = Path(draft_model.folder) / "draftwise_draft.json"
    restrict = getattr(draft_model.runtime, "restrict_head", None)
    if restrict is None or not meta.is_file():
        return
    rows = json.loads(meta.read_text()).get("vocab_subset")
    if rows:
        restrict(rows)


def model_draft_source(rest: str, target: Any) -> str | Path:
    """What ``model:REST`` loads for ``target``: REST itself (a folder, .gguf or built-in name),
    or for ``default`` the folder of the distilled draft that ships for the target."""
    if rest.strip() == "default":
        from ..distill.pack import default_draft_folder

        return default_draft_folder(target)
    return rest


def make_drafter(spec: Drafter | str | None, model: Any) -> Drafter | None:
    """Build the drafter a spec names, for target ``model`` (a :class:`draftwise.Model`)."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        if isinstance(spec, Drafter):
            return spec
        raise ConfigError(f"draft={spec!r} is neither a drafter nor a spec ({SPEC_HELP})")
    kind, _, rest = spec.strip().partition(":")
    if kind == "none" and not rest:
        return None
    if kind == "lookup":
        opts = _options(rest, ("max", "min"), "lookup")
        try:
            return PromptLookupDrafter(
                max_ngram=int(opts.get("max", 3)), min_ngram=int(opts.get("min", 1))
            )
        except ValueError:
            raise ConfigError(f"lookup options must be integers, got {rest!r}") from None
    if kind == "self":
        rt = model.runtime
        opts = _options(rest, ("exit", "layers", "skip"), "self")
        if len(opts) > 1:
            raise ConfigError("give one of self:exit=, self:layers= or self:skip=, not several")
        if "exit" in opts:
            try:
                exit_layer = int(opts["exit"])
            except ValueError:
                raise ConfigError(f"self:exit= takes a layer number, got {opts['exit']!r}") from None
            return SelfSpecDrafter(rt, range(exit_layer))
        if "layers" in opts:
            return SelfSpecDrafter(rt, parse_layers(opts["layers"], rt.num_layers))
        if "skip" in opts:
            skipped = set(parse_layers(opts["skip"], rt.num_layers))
            return SelfSpecDrafter(rt, [i for i in range(rt.num_layers) if i not in skipped])
        saved = calibration_path(model)
        if saved.exists():
            return SelfSpecDrafter(rt, json.loads(saved.read_text())["layers"])
        shipped = SHIPPED_SELF_SKIPS.get(Path(model.folder).name)
        if shipped is not None and rt.num_layers > max(shipped):
            return SelfSpecDrafter(rt, [i for i in range(rt.num_layers) if i not in shipped])
        return SelfSpecDrafter(rt, range(rt.num_layers // 2))
    if kind == "model" and rest:
        from ..loaders import load_model

        draft_model = load_model(model_draft_source(rest, model), dtype=model.dtype)
        check_same_tokenizer(model.tokenizer, draft_model.tokenizer)
        _apply_vocab_subset(draft_model)
        return ModelDrafter(
            draft_model.runtime, vocab_size=model.runtime.vocab_size, label=f"model:{draft_model.name}"
        )
    raise ConfigError(f"unknown draft spec {spec!r}; use one of: {SPEC_HELP}")
