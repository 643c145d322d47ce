"""Drafts: one file per kind, one protocol (``start``, ``propose``, ``observe``), one spec
parser (:class:`DraftSpec`) and one factory (:func:`make_drafter`)."""

from .base import Draft, Drafter, draft_autoregressive
from .factory import make_drafter
from .lookup import NgramIndex, PromptLookupDrafter, find_ngram_match
from .model import ModelDrafter, check_same_tokenizer
from .self_spec import SelfSpecDrafter
from .spec import SPEC_HELP, DraftSpec, parse_draft_list, parse_k

__all__ = [
    "SPEC_HELP",
    "Draft",
    "DraftSpec",
    "Drafter",
    "ModelDrafter",
    "NgramIndex",
    "PromptLookupDrafter",
    "SelfSpecDrafter",
    "check_same_tokenizer",
    "draft_autoregressive",
    "find_ngram_match",
    "make_drafter",
    "parse_draft_list",
    "parse_k",
]
