"""Options every training run checks before it touches anything: numbers in range
(:func:`check_numbers`, by each run's rules), generation temperatures, and settings merged with a
checkpoint's on ``--resume`` (:func:`resolve_settings`: a resumed run trains as its first part did)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from draftwise.errors import ConfigError


def check_number(name: str, value: Any, *, minimum: float, integer: bool, strict: bool = False) -> None:
    """Refuse ``value`` unless it is None or a finite number (an int if ``integer``) >= ``minimum``
    (> with ``strict``).

    >>> check_number("steps", 0, minimum=1, integer=True)
    Traceback (most recent call last):
    ...
    draftwise.errors.ConfigError: steps=0 must be an integer >= 1
    """
    if value is None:
        return
    kind = int if integer else (int, float)
    bad = isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value)
    if bad or value < minimum or (strict and value == minimum):
        rel = ">" if strict else ">="
        what = "an integer" if integer else "a number"
        raise ConfigError(f"{name}={value!r} must be {what} {rel} {minimum}")


def check_numbers(values: dict[str, Any], rules: dict[str, tuple[float, bool, bool]]) -> None:
    """Check every numeric option by name against ``rules`` (name: (minimum, integer, strict)).

    >>> check_numbers({"lr": 0.0}, {"lr": (0, False, True)})
    Traceback (most recent call last):
    ...
    draftwise.errors.ConfigError: lr=0.0 must be a number > 0
    """
    for name, value in values.items():
        minimum, integer, strict = rules[name]
        check_number(name, value, minimum=minimum, integer=integer, strict=strict)


def check_temperatures(gen_temperatures: Sequence[float] | None) -> list[float] | None:
    """The generation temperatures as floats, each >= 0 (0 = greedy), at least one."""
    if gen_temperatures is None:
        return None
    temps = list(gen_temperatures)
    if not temps:
        raise ConfigError("gen_temperatures is empty; give at least one (0 = greedy)")
    for t in temps:
        check_number("gen_temperatures", t, minimum=0, integer=False)
    return [float(t) for t in temps]


def resolve_settings(explicit: dict[str, Any], saved: dict[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """Explicit values, else the checkpoint's (on resume), else ``defaults``.

    >>> resolve_settings({"lr": None, "seed": 3}, None, {"lr": 0.0003})
    {'lr': 0.0003, 'seed': 3}
    >>> resolve_settings({"lr": None, "seed": None}, {"lr": 0.1, "seed": 3}, {})
    {'lr': 0.1, 'seed': 3}
    """
    out: dict[str, Any] = {}
    for key, value in explicit.items():
        if saved is not None and key in saved:
            if value is not None and value != saved[key]:
                flag = "--" + key.replace("_", "-")
                raise ConfigError(
                    f"{flag} {value} differs from the checkpoint's {saved[key]}; drop {flag} to "
                    "resume that run, or start a new one with --overwrite"
                )
            out[key] = saved[key]
        else:
            out[key] = value if value is not None else defaults.get(key)
    return out
