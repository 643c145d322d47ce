"""Drafts: one file per kind, one protocol (``start``, ``propose``, ``observe``)."""

from .base import Draft, Drafter, draft_autoregressive
from .lookup import NgramIndex, PromptLookupDrafter, find_ngram_match
from .model import ModelDrafter, check_same_tokenizer
from .self_spec import SelfSpecDrafter
from .spec import SPEC_HELP, make_drafter

__all__ = [
    "SPEC_HELP",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "NgramIndex",
    "PromptLookupDrafter",
    "SelfSpecDrafter",
    "check_same_tokenizer",
    "draft_autoregressive",
    "find_ngram_match",
    "make_drafter",
]
