"""draftwise: lossless speculative decoding that tells you which draft pays.

Example (loads the embedded default model)::

    import draftwise
    model = draftwise.load_model("default", dtype="bfloat16")
    print(draftwise.generate(model, "Say hi.", max_new_tokens=8).text)

Importing draftwise changes nothing in the process (no environment variable, no thread count)
and loads torch only when a name below is first used. The command line sets OpenMP's defaults
before torch loads and shares the cores with other draftwise processes
(:func:`draftwise.threads.apply_omp_defaults`, :func:`share_cores_while_decoding`); a library
user opts in to either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors; at run time they load on first use
    from draftwise.api import Conversation, generate, share_cores_while_decoding, stream
    from draftwise.core.decode import Stream
    from draftwise.core.generation import GenerationResult
    from draftwise.core.sampling import SamplingConfig
    from draftwise.drafters.spec import DraftSpec
    from draftwise.errors import (
        ConfigError,
        ContextLengthError,
        DraftwiseError,
        ModelLoadError,
        UnsupportedArchitectureError,
    )
    from draftwise.runtime.loaders import Model, load_model
    from draftwise.runtime.prefix_cache import PrefixCache

_WHERE = {
    "generate": ".api", "stream": ".api", "share_cores_while_decoding": ".api", "Conversation": ".api",
    "PrefixCache": ".runtime.prefix_cache",
    "GenerationResult": ".core.generation", "Stream": ".core.decode", "DraftSpec": ".drafters.spec",
    "ConfigError": ".errors", "ContextLengthError": ".errors", "DraftwiseError": ".errors",
    "ModelLoadError": ".errors", "UnsupportedArchitectureError": ".errors",
    "Model": ".runtime.loaders", "load_model": ".runtime.loaders", "SamplingConfig": ".core.sampling",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'draftwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "ConfigError",
    "ContextLengthError",
    "Conversation",
    "DraftSpec",
    "DraftwiseError",
    "GenerationResult",
    "Model",
    "ModelLoadError",
    "PrefixCache",
    "SamplingConfig",
    "Stream",
    "UnsupportedArchitectureError",
    "generate",
    "load_model",
    "share_cores_while_decoding",
    "stream",
]
__version__ = "0.1.0"
