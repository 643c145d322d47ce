"""Capacity planning: aggregate and per-request tokens/s at each concurrency N.

:mod:`.workload` (what a load sends), :mod:`.simulate` (the engine's steps, simulated, with the
batch policy), :mod:`.plan` (``draftwise plan --concurrency``), :mod:`.export` and
:mod:`.report` (its files).
"""
