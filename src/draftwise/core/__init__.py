"""The core of speculative decoding: the loop, and what it is made of.

- :mod:`.sampling` (logits -> probabilities, shared by draft and target), :mod:`.tree` (token
  trees), :mod:`.verify` (greedy and rejection-sampling verification), :mod:`.stats` (one stats
  object), :mod:`.text` (tokens -> text, stop strings);
- :mod:`.draft` (the drafter protocol and its declared capabilities), :mod:`.kpolicy` (how many
  tokens a draft proposes each step);
- :mod:`.passes` (one target pass), :mod:`.decode` (the loop and one generation),
  :mod:`.engine` (many generations at once, with a scheduler).

The core knows no concrete drafter, profile or planner: those sit above it.
"""
