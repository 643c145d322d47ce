"""The offline planner: which draft and k pay on a workload, and proof that they do.

:mod:`.plan` runs each candidate draft on a sample of the workload and predicts its speedup at
every k (:mod:`.replay` replays the steps, :mod:`.pick` chooses per category, with
:mod:`.moderation`); :mod:`.validate` measures each pick against plain decoding; :mod:`.report`
writes it; :mod:`.plan_file` reads and writes ``plan.json``; :mod:`.route` turns a plan into a
policy per request; :mod:`.export` carries a plan to other engines; :mod:`.defaults` names the
default drafts.
"""
