"""EAGLE heads: feature-level drafts that read the target's hidden states.

- :mod:`.head` (the head's layers, EAGLE-1 and EAGLE-3), :mod:`.parts` (the target's parts it
  borrows), :mod:`.files` (a head's files on disk), :mod:`.drafter` (the head as a draft);
- :mod:`.export` (the ``speculators`` layout vLLM loads);
- training: :mod:`.corpus` (ShareGPT conversations), :mod:`.data` (sequences and held-out
  questions), :mod:`.features` (the target's features, extracted once and stored),
  :mod:`.train` (the steps), :mod:`.run` (``draftwise train-head`` from start to end).
"""
