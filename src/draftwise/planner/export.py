"""Turn a draftwise choice (a draft spec and k) into a serving engine's options.

draftwise measures which draft pays on this machine; production serving then runs in vLLM,
SGLang or Hugging Face ``generate``. The mapping, engine by engine:

- ``lookup[:max=N,min=M]``: vLLM ``{"method": "ngram", "prompt_lookup_max": N,
  "prompt_lookup_min": M, "num_speculative_tokens": k}``; SGLang ``--speculative-algorithm NGRAM``
  with the n-gram match-window flags; HF ``prompt_lookup_num_tokens=k``,
  ``max_matching_ngram_size=N``.
- ``model:PATH``: vLLM ``{"method": "draft_model", "model": PATH, ...}``; SGLang
  ``--speculative-algorithm STANDALONE --speculative-draft-model-path PATH``; HF
  ``assistant_model=<the loaded draft>``.
- ``self:exit=L`` (or a layer set that is a prefix 0..L-1): HF ``assistant_early_exit=L``; no
  equivalent in vLLM or SGLang (see below).
- ``none``: no speculative options at all.

Neither vLLM nor SGLang has layer-skip self-speculation. Their closest options are a trained
draft head on the same model (EAGLE / EAGLE-3), or the model's own multi-token-prediction
layers when the checkpoint has them (vLLM ``method: mtp``, SGLang ``NEXTN``), or n-gram
lookup, which needs no weights.

Option names were checked against the engines' documentation and source: vLLM's
``SpeculativeConfig`` (``method`` values ``ngram`` and ``draft_model``), SGLang's ``ServerArgs``
(``speculative_*`` fields) and transformers' ``GenerationConfig`` (whose tests here construct
and validate the exported keyword arguments). Counting conventions differ: SGLang's
``--speculative-num-draft-tokens`` counts the verified tree's root, so k proposals are k + 1
draft tokens (with ``--speculative-num-steps`` k); transformers reads the draft length of an
assistant from the assistant's own ``generation_config``, not from ``generate``'s arguments.

>>> print(export_config("lookup:max=4,min=2", 4, "vllm", model="Qwen/Qwen3-8B"))
vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from typing import Any

from draftwise.drafters.spec import DraftSpec
from draftwise.errors import ConfigError

ENGINES = ("vllm", "sglang", "hf")

_NO_PAY = "draftwise predicts that speculation does not pay here: serve without speculative options"


def _early_exit_layer(spec: DraftSpec, num_layers: int | None) -> int | None:
    """The L of an early exit after layers 0..L-1 equal to this self spec, or None."""
    if spec.exit_layer is None and spec.layers is None and spec.skip is None:
        return num_layers // 2 if num_layers else None  # draftwise's uncalibrated default
    if num_layers is None:
        return spec.early_exit_layer()  # self:skip= needs the depth to tell
    kept = spec.self_layers(num_layers)  # also checks the layers exist
    return len(kept) if kept and kept == list(range(len(kept))) else None


# -- the engines --------------------------------------------------------------------------
def _no_layer_skip(engine: str, k: int) -> dict[str, Any]:
    if engine == "vllm":
        closest = (
            'vLLM has no layer-skip self-speculation. Closest: a trained EAGLE-3 head for this model, '
            '--speculative-config \'{"method": "eagle3", "model": "<EAGLE-3 head>", '
            f'"num_speculative_tokens": {k}}}\'; or, when the checkpoint has multi-token-prediction '
            f'layers, {{"method": "mtp", "num_speculative_tokens": {k}}}; or n-gram lookup '
            '(draftwise --draft lookup), which needs no weights.'
        )
    else:
        closest = (
            "SGLang has no layer-skip self-speculation. Closest: a trained EAGLE-3 head, "
            "--speculative-algorithm EAGLE3 --speculative-draft-model-path <EAGLE-3 head> "
            f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}; "
            "NEXTN for checkpoints with multi-token-prediction layers; or NGRAM lookup "
            "(draftwise --draft lookup), which needs no weights."
        )
    return {"supported": False, "options": {}, "note": closest}


def _suffix(engine: str, spec: DraftSpec, k: int) -> dict[str, Any]:
    """vLLM's ``suffix`` method (Arctic Inference's implementation) verifies one chain of the
    tree per step; SGLang and transformers have no suffix decoding."""
    if engine == "vllm":
        cfg = {
            "method": "suffix",
            "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": spec.depth,
            "suffix_decoding_max_spec_factor": spec.factor,
            "suffix_decoding_min_token_prob": spec.min_prob,
            "suffix_decoding_max_cached_requests": spec.cache,
        }
        note = "needs `pip install arctic-inference`; vLLM verifies a chain, where draftwise verifies the tree"
        return {"supported": True, "options": cfg, "note": note}
    return {
        "supported": False,
        "options": {},
        "note": f"{engine} has no suffix decoding; closest: n-gram lookup (draftwise --draft lookup)",
    }


def _vllm(spec: DraftSpec, k: int) -> dict[str, Any]:
    if spec.kind == "lookup":
        cfg = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": spec.max_ngram,
            "prompt_lookup_min": spec.min_ngram,
        }
        note = "vLLM's ngram proposes one chain; branches is not exported" if spec.branches > 1 else ""
        return {"supported": True, "options": cfg, "note": note}
    if spec.kind == "model":
        cfg = {"method": "draft_model", "model": spec.source, "num_speculative_tokens": k}
        return {
            "supported": True,
            "options": cfg,
            "note": "the draft must share the target's tokenizer; vLLM loads it by name or local folder "
            "(a .gguf or a draftwise built-in name may need converting first)",
        }
    if spec.kind == "eagle":
        cfg = {"method": "eagle3", "model": "<HEAD_DIR>", "num_speculative_tokens": k}
        return {
            "supported": True,
            "options": cfg,
            "note": f"write the head for vLLM first: `draftwise export-head {spec.source} --out HEAD_DIR` (an "
            "--arch eagle3 head, as the shipped one is; another is written as 'eagle'); vLLM proposes one "
            "chain, where draftwise may verify the head's tree (topk > 1)",
        }
    return _no_layer_skip("vllm", k)


def _sglang(spec: DraftSpec, k: int) -> dict[str, Any]:
    if spec.kind == "lookup":
        flags: dict[str, Any] = {
            "--speculative-algorithm": "NGRAM",
            "--speculative-num-draft-tokens": k + 1,
            "--speculative-ngram-min-match-window-size": spec.min_ngram,
            "--speculative-ngram-max-match-window-size": spec.max_ngram,
            "--speculative-ngram-max-bfs-breadth": spec.branches,
        }
        note = (
            "--speculative-num-draft-tokens counts the tree's root, so k proposals are k+1; "
            "the BFS breadth is draftwise's branches (1: one chain) (NGRAM is CUDA-only)"
        )
        return {"supported": True, "options": flags, "note": note}
    if spec.kind == "model":
        flags = {
            "--speculative-algorithm": "STANDALONE",
            "--speculative-draft-model-path": spec.source,
            "--speculative-num-steps": k,
            "--speculative-eagle-topk": 1,
            "--speculative-num-draft-tokens": k + 1,
        }
        note = "a chain of k proposals: k draft steps, top-1, k+1 draft tokens counting the root"
        return {"supported": True, "options": flags, "note": note}
    return _no_layer_skip("sglang", k)


def _hf(spec: DraftSpec, k: int, num_layers: int | None) -> dict[str, Any]:
    # transformers reads an assistant's draft length from the assistant's own generation_config
    # (AssistedCandidateGenerator), so k goes there; a confidence threshold of 0 makes it propose
    # all k, as draftwise does, instead of stopping early (its default is 0.4).
    assistant_config = {
        "num_assistant_tokens": k,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    if spec.kind == "lookup":
        kwargs = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": spec.max_ngram}
        note = ""
        if spec.min_ngram != 1:
            note = "transformers' prompt lookup always tries n-grams down to 1 token; min is not exported"
        return {"supported": True, "options": kwargs, "note": note}
    if spec.kind == "model":
        return {
            "supported": True,
            "options": {"assistant_model": spec.source},
            "assistant_generation_config": assistant_config,
            "note": "assistant_model is the loaded draft model (same tokenizer as the target)",
        }
    plain_self = str(spec) == "self"
    layer = _early_exit_layer(spec, num_layers)
    if layer is None:
        if plain_self:
            note = (
                "draftwise's plain `self` is the calibrated layer set (else the first half of the "
                "layers), which is not known here: export self:exit=L, or pass num_layers"
            )
        else:
            note = (
                f"transformers' early exit runs layers 0..L-1 only, which {spec} is not (and "
                "self:skip= needs num_layers to tell); closest: assistant_early_exit=L for a prefix "
                "of the layers your draft keeps"
            )
        return {"supported": False, "options": {}, "note": note}
    note = (
        "early exit reads the LM head after layer L; it pays only on models trained for it "
        "(e.g. LayerSkip checkpoints)"
    )
    if plain_self:
        note += "; plain `self` exported as the uncalibrated default, the first half of the layers"
    return {
        "supported": True,
        "options": {"assistant_early_exit": layer},
        "assistant_generation_config": assistant_config,
        "note": note,
    }


def export_dict(
    draft: DraftSpec | str, k: int, engine: str, *, model: str | None = None, num_layers: int | None = None
) -> dict[str, Any]:
    """The engine options for draft spec ``draft`` proposing ``k`` tokens, as data.

    Keys: ``engine``, ``draft``, ``k``, ``model``; ``supported`` (False when the engine has no
    equivalent, with the closest option in ``note``); ``options`` (vllm: the
    ``--speculative-config`` object; sglang: flag -> value; hf: ``generate`` keyword
    arguments, ``assistant_model`` given as the draft's path); for an hf assistant,
    ``assistant_generation_config`` (attributes to set on the assistant's generation config);
    and ``note``. ``num_layers`` (the target's layer count) resolves ``self`` and
    ``self:skip=`` for transformers' early exit.

    >>> export_dict("lookup", 4, "hf")["options"]
    {'prompt_lookup_num_tokens': 4, 'max_matching_ngram_size': 3}
    >>> export_dict("self", 4, "vllm")["supported"]
    False
    """
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
    spec = DraftSpec.parse(draft)
    kind = spec.kind
    if kind != "none" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(f"k={k!r} must be an integer >= 1 (tokens proposed per step)")
    if num_layers is not None and (isinstance(num_layers, bool) or num_layers < 1):
        raise ConfigError(f"num_layers={num_layers!r} must be an integer >= 1")
    body: dict[str, Any]
    if spec.then is not None:  # no engine pairs a copy draft with an EAGLE head in one tree
        body = dict(export_dict(replace(spec, then=None), k, eng, num_layers=num_layers))
        body = {key: body[key] for key in ("options", "note")} | {"supported": False}
        body["note"] = (f"{eng} has no hybrid of a copy draft and an EAGLE head; the options are its "
                        f"copy part's ({replace(spec, then=None)}). " + body["note"]).strip()
    elif kind == "none":
        body = {"supported": True, "options": {}, "note": _NO_PAY}
    elif kind == "suffix":
        body = _suffix(eng, spec, k)
    elif eng == "vllm":
        body = _vllm(spec, k)
    elif eng == "sglang":
        body = _sglang(spec, k)
    else:
        body = _hf(spec, k, num_layers)
    return {"engine": eng, "draft": str(spec), "k": k, "model": model, **body}


def _comment(note: str) -> list[str]:
    return [f"# {note}"] if note else []


def export_config(
    draft: DraftSpec | str, k: int, engine: str, *, model: str | None = None, num_layers: int | None = None
) -> str:
    """Text to paste: a command line for vllm and sglang, Python for hf (``# `` lines are notes).

    ``model`` (the target) completes the command (``vllm serve MODEL``, ``--model-path MODEL``,
    ``AutoModelForCausalLM.from_pretrained(MODEL)``); without it only the speculative options
    are printed.

    >>> print(export_config("model:Qwen/Qwen3-0.6B", 4, "sglang"))
    # a chain of k proposals: k draft steps, top-1, k+1 draft tokens counting the root
    --speculative-algorithm STANDALONE --speculative-draft-model-path Qwen/Qwen3-0.6B --speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5
    >>> print(export_config("lookup", 4, "hf"))
    {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 3}
    """
    d = export_dict(draft, k, engine, model=model, num_layers=num_layers)
    lines = _comment(d["note"])
    if not d["supported"]:
        return "\n".join(lines)
    opts = d["options"]
    if d["engine"] == "vllm":
        cmd = [f"vllm serve {shlex.quote(model)}"] if model else []
        if opts:
            cmd.append("--speculative-config " + shlex.quote(json.dumps(opts)))
        if cmd:
            lines.append(" ".join(cmd))
    elif d["engine"] == "sglang":
        cmd = [f"python -m sglang.launch_server --model-path {shlex.quote(model)}"] if model else []
        cmd += [f"{flag} {shlex.quote(str(value))}" for flag, value in opts.items()]
        if cmd:
            lines.append(" ".join(cmd))
    else:
        lines += _hf_python(d, model)
    return "\n".join(lines)


def _hf_python(d: dict[str, Any], model: str | None) -> list[str]:
    opts = dict(d["options"])
    lines: list[str] = []
    if model is not None or "assistant_model" in opts:
        lines.append("from transformers import AutoModelForCausalLM")
    if model is not None:
        lines.append(f"model = AutoModelForCausalLM.from_pretrained({json.dumps(model)})")
    if "assistant_model" in opts:
        lines.append(f"assistant = AutoModelForCausalLM.from_pretrained({json.dumps(opts['assistant_model'])})")
        target = "assistant"
    else:
        target = "model"  # early exit: the target drafts for itself
        if model is None and "assistant_generation_config" in d:
            lines.append("# model: your loaded target model")
    for key, value in d.get("assistant_generation_config", {}).items():
        lines.append(f"{target}.generation_config.{key} = {json.dumps(value)}")
    body = ", ".join(
        f"{json.dumps(key)}: assistant" if key == "assistant_model" else f"{json.dumps(key)}: {json.dumps(value)}"
        for key, value in opts.items()
    )
    lines.append("generate_kwargs = {" + body + "}" if lines else "{" + body + "}")
    return lines
