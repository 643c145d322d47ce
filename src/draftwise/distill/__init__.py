"""``draftwise distill``: train a small draft that shares the target's tokenizer.

The draft (fewer layers of the target's own family, started from chosen target layers) is
trained by self-distillation: the target writes continuations of local training prompts, and
the draft learns to match the target's next-token distribution at every position,
minimising KL(p_target || q_draft) at a temperature T. Optionally its head keeps only the N
most frequent tokens (FR-Spec), which makes each draft step cheaper; verification is lossless
whatever the draft.

Example::

    from draftwise import generate, load_model
    from draftwise.distill import distill
    target = load_model("default")
    result = distill(target, "drafts/smol4", layers=4, steps=300, vocab_size_draft=8192)
    print(result.eval.acceptance, result.eval.speedup)
    generate(target, "Tell me a story.", draft="model:drafts/smol4", k=4)

Rooms: :mod:`.data` (prompts, split, cached continuations, token counts), :mod:`.student`
(the draft's shape, initialisation and loss), :mod:`.options` (checking and merging the options),
:mod:`.loop` (the training steps, and resuming them), :mod:`.checkpoint` (saving and safely loading ``.pt`` files),
:mod:`.outputs` (the output folder: claimed safely, files without machine paths), :mod:`.train`
(the run from start to end), :mod:`.evaluate` (speculative vs plain on held-out prompts),
:mod:`.pack` (a draft's trained layers alone, the form in which a draft ships).
"""

from draftwise.distill.evaluate import EvalReport, breakeven_for_cost, evaluate_draft
from draftwise.distill.pack import pack_draft
from draftwise.distill.student import build_draft, evenly_spaced_layers, kl_loss
from draftwise.distill.train import DistillResult, StepLog, distill
from draftwise.drafters.packs import default_draft_folder, unpack_draft
from draftwise.training.data import split_questions

__all__ = [
    "DistillResult",
    "EvalReport",
    "StepLog",
    "breakeven_for_cost",
    "build_draft",
    "default_draft_folder",
    "distill",
    "evaluate_draft",
    "evenly_spaced_layers",
    "kl_loss",
    "pack_draft",
    "split_questions",
    "unpack_draft",
]
