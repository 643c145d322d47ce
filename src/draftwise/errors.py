"""Errors that draftwise raises for user mistakes.

Every :class:`DraftwiseError` names the bad value and how to fix it; the CLI prints its message
without a traceback. Anything else escaping the library is a bug.
"""

from __future__ import annotations


class DraftwiseError(Exception):
    """A user-facing error: bad input, a missing file, an unsupported option."""


class ConfigError(DraftwiseError, ValueError):
    """An option has a value draftwise cannot honour (e.g. ``top_p=0``)."""


class ModelLoadError(DraftwiseError):
    """A model file or folder is missing, corrupt or of an unsupported kind."""


class UnsupportedArchitectureError(ModelLoadError):
    """The native runtime does not implement this architecture (the HF adapter may)."""


class ContextLengthError(DraftwiseError, ValueError):
    """A prompt (plus the tokens asked for) does not fit in the model's context."""
