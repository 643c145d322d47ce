"""The options of a distillation run: checked before anything is touched, merged with a checkpoint's.

Options fall in three kinds:

- numbers that must be in range (``steps``, ``lr``, ...): :func:`check_numbers`;
- the draft's shape (layers, init layers, hidden size, reduced head): :func:`resolve_shape`
  against the target, or taken from the checkpoint on ``--resume``;
- the training settings (:data:`DEFAULTS`): :func:`resolve_settings` keeps an explicit value,
  else the checkpoint's, else the default, and refuses an explicit value that differs from the
  checkpoint's (a resumed run must train as the first part did).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.distill.student import draft_config, evenly_spaced_layers
from draftwise.errors import ConfigError

#: settings that define a run; ``--resume`` keeps the checkpoint's values and refuses others
DEFAULTS: dict[str, Any] = {
    "batch": 4,
    "seq_len": 256,
    "lr": 3e-4,
    "temperature": 1.0,
    "seed": 0,
    "prompts": None,  # None: the dev questions shipped with draftwise
    "gen_tokens": 128,
    "gen_temperatures": [0.0],
    "train_embeddings": False,
}
DEFAULT_STEPS = 300


#: distill's numeric options, name: (minimum, integer, strict)
NUMBER_RULES: dict[str, tuple[float, bool, bool]] = {
    "layers": (1, True, False), "hidden_size": (1, True, False), "vocab_size_draft": (1, True, False),
    "steps": (1, True, False), "batch": (1, True, False), "seq_len": (2, True, False),
    "lr": (0, False, True), "temperature": (0, False, True), "time_budget": (0, False, True),
    "seed": (0, True, False), "gen_tokens": (1, True, False), "checkpoint_every": (1, True, False),
    "snapshot_every": (1, True, False), "eval_prompts": (0, True, False), "eval_k": (1, True, False),
    "eval_max_new_tokens": (1, True, False),
}


def default_layers(target_layers: int) -> int:
    """4 layers, or half the target's when it has fewer than 8 (at least 1)."""
    return max(1, min(4, target_layers // 2))


@dataclass(frozen=True)
class DraftShape:
    """The draft's layers, the target layers they start from (None: random) and its head."""

    layers: int
    init_layers: list[int] | None
    hidden_size: int
    vocab_size_draft: int | None  # None: the full vocabulary


def _shape_from_checkpoint(saved: dict[str, Any], asked: dict[str, Any]) -> DraftShape:
    for key, value in asked.items():
        if value is not None and value != saved[key]:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {value} differs from the checkpoint's {saved[key]}; drop {flag} to resume")
    return DraftShape(saved["layers"], saved["init_layers"], saved["hidden_size"], saved["vocab_size_draft"])


def resolve_shape(
    target: Any,
    saved: dict[str, Any] | None,
    *,
    layers: int | None,
    init_layers: Sequence[int] | None,
    hidden_size: int | None,
    vocab_size_draft: int | None,
) -> DraftShape:
    """The draft's shape: the options checked against ``target``, or the checkpoint's ``saved``
    settings (an option given too must agree with them)."""
    init_list = None if init_layers is None else [int(i) for i in init_layers]
    if saved is not None:
        asked = {"layers": layers, "init_layers": init_list, "hidden_size": hidden_size, "vocab_size_draft": vocab_size_draft}
        return _shape_from_checkpoint(saved, asked)
    n_target = target.runtime.num_layers
    t_hidden = int(target.config.hidden_size)
    t_vocab = int(target.runtime.vocab_size)
    if init_list is not None and layers is not None and len(init_list) != layers:
        raise ConfigError(f"--init-layers lists {len(init_list)} layers but --layers is {layers}; give one per draft layer")
    n_layers = layers if layers is not None else (len(init_list) if init_list else default_layers(n_target))
    if n_layers > n_target:
        raise ConfigError(f"--layers {n_layers} is more than the target's {n_target} layers; a draft must be smaller")
    d_hidden = hidden_size if hidden_size is not None else t_hidden
    if d_hidden != t_hidden:
        if init_list is not None:
            raise ConfigError(
                f"--init-layers needs the target's hidden size ({t_hidden}); with --hidden-size "
                f"{d_hidden} the draft starts random: drop one of them"
            )
        draft_config(target.config, n_layers, hidden_size=d_hidden)  # raises on a bad hidden size
    else:
        if init_list is None:
            init_list = evenly_spaced_layers(n_layers, n_target)
        bad = [i for i in init_list if not 0 <= i < n_target]
        if bad:
            raise ConfigError(f"--init-layers {bad} out of range: the target has layers 0..{n_target - 1}")
    if vocab_size_draft is not None and vocab_size_draft > t_vocab:
        raise ConfigError(f"--vocab-size-draft {vocab_size_draft} is larger than the target's vocabulary ({t_vocab})")
    if vocab_size_draft == t_vocab:
        vocab_size_draft = None  # the full head: nothing to reduce
    return DraftShape(n_layers, init_list, d_hidden, vocab_size_draft)


