"""The online controllers the decode loop and the engine ask every step.

- :mod:`.adaptive`: ``--k auto`` for one sequence (k, or no speculation, from a measured profile
  and the acceptance seen so far);
- :mod:`.batch`: ``--k auto`` at batch (every running sequence's k chosen together, each step,
  by the goodput model of :mod:`draftwise.cost.goodput`);
- :mod:`.outside_pass` (a sequence's measured seconds outside the batched pass) and
  :mod:`.batch_limit` (the batch size past which speculation stops).
"""
