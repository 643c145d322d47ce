"""Drafts: one file per kind, one protocol (``start``, ``propose``, ``observe``, ``end``, and
the declared :class:`Capabilities`), one spec
parser (:class:`DraftSpec`) and one factory (:func:`make_drafter`). A draft proposes a chain or
a token tree (:class:`Draft`'s ``tree``): ``suffix`` always, ``lookup`` with ``branches > 1``."""

from draftwise.core.draft import Capabilities, Draft, Drafter, draft_autoregressive
from draftwise.drafters.factory import capabilities_of, make_drafter
from draftwise.drafters.lookup import NgramIndex, PromptLookupDrafter, find_ngram_match
from draftwise.drafters.self_spec import SelfSpecDrafter
from draftwise.drafters.small_model import ModelDrafter, check_same_tokenizer
from draftwise.drafters.spec import SPEC_HELP, DraftSpec, parse_draft_list, parse_k
from draftwise.drafters.suffix import SuffixCache, SuffixDrafter

__all__ = [
    "SPEC_HELP",
    "Capabilities",
    "Draft",
    "DraftSpec",
    "Drafter",
    "ModelDrafter",
    "NgramIndex",
    "PromptLookupDrafter",
    "SelfSpecDrafter",
    "SuffixCache",
    "SuffixDrafter",
    "check_same_tokenizer",
    "capabilities_of",
    "draft_autoregressive",
    "find_ngram_match",
    "make_drafter",
    "parse_draft_list",
    "parse_k",
]
