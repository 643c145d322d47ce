"""draftwise: lossless speculative decoding that tells you which draft pays.

Example (loads the embedded default model)::

    import draftwise
    model = draftwise.load_model("default", dtype="bfloat16")
    print(draftwise.generate(model, "Say hi.", max_new_tokens=8).text)
"""

# First, before anything imports torch: libgomp reads its wait policy once, when torch loads it.
from .threads import apply_omp_defaults

apply_omp_defaults()

from .api import generate, stream  # noqa: E402 (the imports below pull torch)
from .decode import GenerationResult, Stream
from .drafters.spec import DraftSpec
from .errors import (
    ConfigError,
    ContextLengthError,
    DraftwiseError,
    ModelLoadError,
    UnsupportedArchitectureError,
)
from .loaders import Model, load_model
from .sampling import SamplingConfig

__all__ = [
    "ConfigError",
    "ContextLengthError",
    "DraftSpec",
    "DraftwiseError",
    "GenerationResult",
    "Model",
    "ModelLoadError",
    "SamplingConfig",
    "Stream",
    "UnsupportedArchitectureError",
    "generate",
    "load_model",
    "stream",
]
__version__ = "0.1.0"
