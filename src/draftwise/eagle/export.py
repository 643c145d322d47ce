"""A trained draft head written in the ``speculators`` layout (config.json + model.safetensors).

Which ``speculators`` type, and why not EAGLE-3
-----------------------------------------------
Our head is EAGLE-1 shaped (:mod:`draftwise.eagle.head`): ``fc`` mixes the token
embedding and the target's last-layer feature, then one ordinary decoder layer, then the
target's final norm and LM head. ``speculators`` describes that family with
``speculators_model_type: "eagle"`` (``EagleSpeculatorConfig``: ``fusion_fc``, a
``transformer`` decoder layer, and with ``layernorms: true`` an ``embedding_layernorm`` and a
``pre_lm_head_layernorm``). That is the type written here, with ``layernorms: true`` and
``fusion_bias: false``:

===============================  ==========================================================
``fusion_fc.weight``             ``fc.weight``, ``[d, 2d]``: embedding first, then feature
``transformer.*``                the decoder layer, its ``input_layernorm`` included (with
                                 ``layernorms: false`` speculators drops it, as EAGLE-1 did)
``pre_lm_head_layernorm.weight`` the target's final norm, which our head applies before the
                                 LM head (given by the caller; the head folder lacks it)
===============================  ==========================================================

Not represented exactly, and recorded under ``draftwise.not_represented`` in config.json:

- ``embedding_layernorm``: with ``layernorms: true`` speculators normalises the embedding
  before ``fusion_fc``; our head does not, and no weight makes an RMSNorm the identity.
- the feature: our head reads the target's last-layer output *before* the final norm; which
  hidden state a runtime feeds an ``eagle`` head is the runtime's choice, not the file's
  (vLLM's EAGLE-1 path feeds the output *after* the final norm).
- the reduced vocabulary (FR-Spec): the ``eagle`` type has none. It is written the EAGLE-3 way
  (``draft_vocab_size``; ``t2d``, a bool mask over the target's vocabulary, and ``d2t``, per
  draft id the offset to its target id, draft ids in ascending target-id order), which an
  ``eagle`` loader ignores: it then drafts from the whole vocabulary (still lossless).

Writing an EAGLE-1 head as ``eagle3`` would load in vLLM and compute something else: EAGLE-3's
layer attends over ``concat(norm(embedding), norm(fc(fused features)))`` (a ``2d``-wide attention
input), keeps only the fused feature in the residual, and ``fc`` fuses several target layers
(``eagle_aux_hidden_state_layer_ids``); our residual carries ``fc(concat(embedding, feature))``.
No choice of weights maps one onto the other. A head trained with ``train-head --arch eagle3``
*is* that layer, and is written as ``eagle3`` (:func:`eagle3_tensors`).

Where this stands (read from the sources): ``speculators`` dropped the ``eagle`` type (a
legacy converter module in 0.5-0.6, removed in 0.7), and vLLM's speculators loader accepts
``eagle3``, ``peagle``, ``dflash`` and ``dspark``. :func:`validate_speculators_config` says so
when the installed ``speculators`` does not know the type.

The EAGLE-3 layout (``--arch eagle3``)
-------------------------------------
This is the layout vLLM's speculators loader accepts (``eagle3``; ``eagle`` is gone from both).
Our EAGLE-3 head (:mod:`draftwise.drafters.eagle_head`) computes what speculators'
``Eagle3DraftModel`` computes with ``norm_before_residual: false`` and no ``fc_norm`` /
``norm_before_fc``; its tensors map one to one:

=================================  ========================================================
``fc.weight``                      ``fc.weight``, ``[d, 3d]``: low, middle, high in that order
``layers.0.hidden_norm.weight``    ``hidden_norm.weight``
``layers.0.input_layernorm.weight``  ``input_layernorm.weight`` (on the embedding)
``layers.0.self_attn.*``,          the decoder layer; q/k/v read ``[norm(embedding) |
``layers.0.mlp.*``, ...            hidden_norm(hidden)]``, ``2d`` wide
``norm.weight``                    the target's final norm (our head borrows it)
``lm_head.weight``                 the target's LM head rows of the draft vocabulary, in
                                   ascending token id (our head borrows them)
``d2t``, ``t2d``                   the reduced vocabulary (FR-Spec), as speculators maps it
=================================  ========================================================

``eagle_aux_hidden_state_layer_ids`` numbers the fused states as vLLM does, the *input* of a
layer: our output of layer i is its i + 1. ``embed_tokens`` is not written: the head uses the
target's embeddings, which speculators lists among the weights it may miss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from draftwise.eagle.files import LoadedHead, load_head
from draftwise.errors import ConfigError
from draftwise.fsutil import (
    atomic_path,
    check_output_dir,
    claim_output_dir,
    write_json_atomic,
)

EAGLE3_MODEL_TYPE = "eagle3"
#: our parameter name -> the speculators ``eagle3`` name
EAGLE3_WEIGHT_NAMES: dict[str, str] = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "layers.0.hidden_norm.weight",
    "input_layernorm.weight": "layers.0.input_layernorm.weight",
    "q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "post_attention_layernorm.weight": "layers.0.post_attention_layernorm.weight",
    "gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "up_proj.weight": "layers.0.mlp.up_proj.weight",
    "down_proj.weight": "layers.0.mlp.down_proj.weight",
}


def is_eagle3(loaded: LoadedHead) -> bool:
    return loaded.head.cfg.arch == EAGLE3_MODEL_TYPE


def algorithm_block(algorithm: str, k: int, verifier: str) -> dict[str, Any]:
    """``speculators_config``: greedy proposals of ``k`` tokens, checked by ``verifier``."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": int(k), "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
    }


def eagle3_config(
    loaded: LoadedHead, *, layer: dict[str, Any], draftwise: dict[str, Any], k: int, verifier: str,
    draft_vocab: int, dtype: str,
) -> dict[str, Any]:
    """config.json of the ``eagle3`` layout (``layer``: ``transformer_layer_config``)."""
    cfg = loaded.head.cfg
    return {
        "speculators_model_type": EAGLE3_MODEL_TYPE,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": int(draft_vocab),
        "norm_before_residual": False,
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [int(i) + 1 for i in cfg.aux_layers or ()],
        "torch_dtype": dtype,
        "speculators_config": algorithm_block(EAGLE3_MODEL_TYPE, k, verifier),
        "draftwise": draftwise,
    }


def eagle3_tensors(
    loaded: LoadedHead, *, final_norm: torch.Tensor | None, lm_head: torch.Tensor | None, dtype: torch.dtype,
    draft_ids: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """The head's tensors under speculators' ``eagle3`` names, with the target's final norm and the
    LM head rows of ``draft_ids`` (ascending; None: the whole head), which the layout needs."""
    d = loaded.head.cfg.hidden_size
    if final_norm is None or lm_head is None:
        raise ConfigError("an eagle3 export needs the target's final norm and LM head; load the target (--model)")
    if tuple(final_norm.shape) != (d,) or lm_head.ndim != 2 or lm_head.shape[1] != d:
        raise ConfigError(
            f"the target's final norm {tuple(final_norm.shape)} or LM head {tuple(lm_head.shape)} do not fit a head {d} wide"
        )
    tensors = {EAGLE3_WEIGHT_NAMES[name]: t.detach().to(dtype).contiguous() for name, t in loaded.head.state_dict().items()}
    tensors["norm.weight"] = final_norm.detach().to(dtype).contiguous()
    rows = lm_head if draft_ids is None else lm_head[draft_ids]
    tensors["lm_head.weight"] = rows.detach().to(dtype).contiguous()
    return tensors


COMMAND = "export-head"
MODEL_TYPE = "eagle"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DEFAULT_K = 4  # draftwise's default draft length; vLLM reads it as num_speculative_tokens
#: what an export writes in its folder; ``--overwrite`` deletes these and nothing else
OUTPUT_FILES = (CONFIG_FILE, WEIGHTS_FILE)
#: draftwise built-in targets -> the Hugging Face id a server knows them by
VERIFIER_IDS: dict[str, str] = {
    "default": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
#: our parameter name -> the speculators ``eagle`` name
WEIGHT_NAMES: dict[str, str] = {
    "fc.weight": "fusion_fc.weight",
    "input_layernorm.weight": "transformer.input_layernorm.weight",
    "q_proj.weight": "transformer.self_attn.q_proj.weight",
    "k_proj.weight": "transformer.self_attn.k_proj.weight",
    "v_proj.weight": "transformer.self_attn.v_proj.weight",
    "o_proj.weight": "transformer.self_attn.o_proj.weight",
    "post_attention_layernorm.weight": "transformer.post_attention_layernorm.weight",
    "gate_proj.weight": "transformer.mlp.gate_proj.weight",
    "up_proj.weight": "transformer.mlp.up_proj.weight",
    "down_proj.weight": "transformer.mlp.down_proj.weight",
}
FINAL_NORM_NAME = "pre_lm_head_layernorm.weight"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def verifier_id(target_name: str | None, verifier: str | None = None) -> str:
    """The verifier's Hugging Face id: ``verifier`` if given, else the id of a built-in target."""
    if verifier is not None:
        if not verifier.strip():
            raise ConfigError("--verifier is empty; pass the target's Hugging Face id, like HuggingFaceTB/SmolLM2-135M-Instruct")
        return verifier.strip()
    if target_name in VERIFIER_IDS:
        return VERIFIER_IDS[target_name]
    raise ConfigError(
        f"the head's target {target_name!r} has no known Hugging Face id; pass --verifier with the id vLLM serves it as"
    )


def final_norm_of(model: Any) -> torch.Tensor:
    """The target's final-norm weight ``[d]`` (float32), from a :class:`draftwise.Model` on the
    native runtime (the Llama family, whose layer the ``eagle`` layout describes)."""
    weight = getattr(model.runtime, "final_norm", None)
    if not isinstance(weight, torch.Tensor):
        raise ConfigError(
            f"{model.name} runs on the transformers adapter, not the native Llama runtime; the speculators "
            "'eagle' layout describes a Llama decoder layer, so only Llama-family targets can be exported"
        )
    return weight.detach().float().cpu()


def lm_head_of(model: Any) -> torch.Tensor:
    """The target's LM head ``[vocab, d]`` (float32), which an eagle3 export writes rows of."""
    final_norm_of(model)  # the same runtime check
    return model.runtime.head.detach().float().cpu()


def vocab_maps(draft_tokens: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t2d, d2t)`` in speculators' EAGLE-3 convention for a reduced vocabulary.

    >>> t2d, d2t = vocab_maps(torch.tensor([7, 2, 5]), 8)
    >>> t2d.nonzero().flatten().tolist(), d2t.tolist()  # draft id i is target id i + d2t[i]
    ([2, 5, 7], [2, 4, 5])
    """
    ids = torch.unique(draft_tokens.long())  # sorted: t2d selects the LM head rows in this order
    if ids.numel() != draft_tokens.numel():
        raise ConfigError("the head's draft_tokens repeat a token id")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids - torch.arange(ids.numel())


def target_vocab(loaded: LoadedHead) -> int:
    """The target's vocabulary size, as the head folder records it."""
    try:
        vocab = int((loaded.meta.get("target") or {})["vocab_size"])
    except (KeyError, TypeError, ValueError):
        vocab = 0
    if vocab < 1:
        raise ConfigError("the draft head's draftwise_head.json lacks the target's vocab_size; retrain or repair the head")
    return vocab


def layer_config(loaded: LoadedHead, max_positions: int | None = None) -> dict[str, Any]:
    """``transformer_layer_config``: one Llama decoder layer of the head's shape."""
    cfg = loaded.head.cfg
    layer: dict[str, Any] = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": target_vocab(loaded),
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        # both spellings: transformers < 5 reads rope_theta, transformers 5 rope_parameters
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }
    if max_positions is not None:
        layer["max_position_embeddings"] = int(max_positions)
    return layer


def speculators_config(
    loaded: LoadedHead, *, verifier: str, k: int = DEFAULT_K, dtype: str = "float32",
    max_positions: int | None = None, has_final_norm: bool = True,
) -> dict[str, Any]:
    """The whole config.json of the ``eagle`` layout, as a dict."""
    target = loaded.meta.get("target") or {}
    vocab = target_vocab(loaded)
    draft_vocab = vocab if loaded.draft_tokens is None else int(loaded.draft_tokens.numel())
    about = {key: target.get(key) for key in ("name", "fingerprint", "hidden_size", "vocab_size", "num_layers")}
    if is_eagle3(loaded):
        return eagle3_config(
            loaded, layer=layer_config(loaded, max_positions), k=k, verifier=verifier,
            draft_vocab=draft_vocab, dtype=dtype, draftwise={"source": loaded.meta.get("format"), "target": about},
        )
    missing = [
        "embedding_layernorm: the head does not normalise the embedding; an eagle loader makes one (ones) that does",
        "hidden_states: the head reads the target's last-layer output before its final norm",
    ]
    if not has_final_norm:
        missing.append(f"{FINAL_NORM_NAME}: not written; it must be the target's final norm (model.norm.weight)")
    if draft_vocab != vocab:
        missing.append("draft_vocab_size/t2d/d2t: the eagle type has no reduced vocabulary; written as EAGLE-3 does")
    return {
        "speculators_model_type": MODEL_TYPE,
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer_config(loaded, max_positions),
        "layernorms": True,
        "fusion_bias": False,
        "draft_vocab_size": draft_vocab,
        "torch_dtype": dtype,
        "speculators_config": algorithm_block(MODEL_TYPE, k, verifier),
        "draftwise": {
            "source": loaded.meta.get("format"),
            "target": about,
            "not_represented": missing,
        },
    }


def speculators_tensors(
    loaded: LoadedHead, *, final_norm: torch.Tensor | None = None, dtype: str = "float32",
    lm_head: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The head's tensors under speculators' names (plus the final norm and vocabulary maps; an
    eagle3 head also the target's LM head rows, from ``lm_head``, the target's ``[vocab, d]``)."""
    torch_dtype = _DTYPES[dtype]
    maps = None if loaded.draft_tokens is None else vocab_maps(loaded.draft_tokens, target_vocab(loaded))
    if is_eagle3(loaded):
        tensors = eagle3_tensors(
            loaded, final_norm=final_norm, lm_head=lm_head, dtype=torch_dtype,
            draft_ids=None if maps is None else maps[0].nonzero().flatten(),
        )
        if maps is not None:
            tensors["t2d"], tensors["d2t"] = maps[0].contiguous(), maps[1].contiguous()
        return tensors
    state = loaded.head.state_dict()
    tensors = {WEIGHT_NAMES[name]: t.detach().to(torch_dtype).contiguous() for name, t in state.items()}
    if final_norm is not None:
        d = loaded.head.cfg.hidden_size
        if tuple(final_norm.shape) != (d,):
            raise ConfigError(f"the target's final norm has shape {tuple(final_norm.shape)}; the head needs ({d},)")
        tensors[FINAL_NORM_NAME] = final_norm.detach().to(torch_dtype).contiguous()
    if maps is not None:
        tensors["t2d"], tensors["d2t"] = maps[0].contiguous(), maps[1].contiguous()
    return tensors


def check_export_dir(out_dir: str | Path, *, overwrite: bool) -> Path:
    """Refuse, touching nothing, an ``out_dir`` :func:`export_speculators` would refuse: another
    command's or a user's folder, an earlier export without ``overwrite``, or one that also holds
    files the export did not write (``--overwrite`` deletes only :data:`OUTPUT_FILES`)."""
    return check_output_dir(out_dir, COMMAND, overwrite=overwrite, holds="an exported head", writes=OUTPUT_FILES)


def export_speculators(
    head_folder: str | Path,
    out_dir: str | Path,
    *,
    verifier: str,
    final_norm: torch.Tensor | None = None,
    k: int = DEFAULT_K,
    dtype: str = "float32",
    max_positions: int | None = None,
    overwrite: bool = False,
    lm_head: torch.Tensor | None = None,
) -> Path:
    """Write ``out_dir/config.json`` and ``out_dir/model.safetensors`` for the head in
    ``head_folder`` and return ``out_dir``.

    ``verifier``: the target's Hugging Face id (:func:`verifier_id`). ``final_norm``: the
    target's final-norm weight ``[d]`` (:func:`final_norm_of`); without it the file lacks
    ``pre_lm_head_layernorm.weight`` and config.json says so. A head trained with ``--arch
    eagle3`` is written as ``eagle3`` (:func:`eagle3_tensors`) and needs both ``final_norm`` and
    ``lm_head`` (:func:`lm_head_of`). ``dtype``: float32 or bfloat16.
    ``out_dir`` must be new or empty, or (``overwrite``) an earlier export that holds nothing else
    (:func:`check_export_dir`); a symbolic link to a folder is written through."""
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k {k!r} must be a whole number >= 1 (draft tokens per step)")
    loaded = load_head(head_folder)
    if not verifier or not verifier.strip():
        raise ConfigError("the verifier id is empty; pass the target's Hugging Face id")
    config = speculators_config(
        loaded, verifier=verifier.strip(), k=k, dtype=dtype, max_positions=max_positions,
        has_final_norm=final_norm is not None,
    )
    tensors = speculators_tensors(loaded, final_norm=final_norm, dtype=dtype, lm_head=lm_head)
    out = claim_output_dir(out_dir, COMMAND, overwrite=overwrite, holds="an exported head", writes=OUTPUT_FILES)
    from safetensors.torch import save_file

    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    write_json_atomic(out / CONFIG_FILE, config)
    return out


def _load_legacy_eagle() -> bool:
    """speculators 0.5-0.6 keep the ``eagle`` config in a converter module that registers it
    on import (True when it did); older ones find it themselves, newer ones have none."""
    import importlib

    try:
        importlib.import_module("speculators.convert.eagle.eagle_legacy_model")
    except Exception:  # noqa: BLE001 - absent or broken in this version: nothing to register
        return False
    return True


def validate_speculators_config(path: str | Path) -> str | None:
    """Check ``path`` (a folder with config.json, or the file) with the installed
    ``speculators``' own config classes: None when valid, else one line saying what is wrong,
    or that ``speculators`` cannot be imported here, or that it knows no such model type."""
    path = Path(path)
    file = path / CONFIG_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read {file}: {exc}"
    if not isinstance(data, dict):
        return f"{file} is not a JSON object"
    try:
        import speculators
        from pydantic import ValidationError
        from speculators import SpeculatorModelConfig, SpeculatorsConfig
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return f"speculators is not importable here ({type(exc).__name__}: {exc}); the config was not checked"
    version = getattr(speculators, "__version__", None) or _dist_version("speculators")
    kind = data.get("speculators_model_type")
    if kind == MODEL_TYPE and _load_legacy_eagle():
        reload = getattr(speculators, "reload_schemas", None)
        if callable(reload):
            reload()  # a late-registered class must be rebuilt before it validates
    registry = dict(SpeculatorModelConfig.registry or {})
    scope = "" if kind in registry else "speculators_config"
    try:
        if kind not in registry:
            SpeculatorsConfig.model_validate(data.get("speculators_config"))
            return (
                f"speculators {version} has no {kind!r} model type (it has {', '.join(sorted(registry))}); "
                "only the speculators_config block was checked, and it is valid"
            )
        registry[kind].model_validate(data)  # the type's own class (a late-registered one is not in the union)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in (scope, *first.get("loc", ())) if p != "")
        return f"speculators {version} rejects the config: {where + ': ' if where else ''}{first.get('msg', exc)}"
    except (ValueError, TypeError, KeyError) as exc:
        return f"speculators {version} rejects the config: {exc}"
    return None


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "(unknown version)"
