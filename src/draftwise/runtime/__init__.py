"""Model runtimes: the native Llama-family runtime and the Hugging Face adapter."""

from draftwise.runtime.base import Runtime

__all__ = ["Runtime"]
