"""A head trained with ``--arch eagle3``, written in the ``speculators`` ``eagle3`` layout.

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

from typing import Any

import torch

from ..drafters.head_files import LoadedHead
from ..errors import ConfigError

MODEL_TYPE = "eagle3"
#: our parameter name -> the speculators ``eagle3`` name
WEIGHT_NAMES: dict[str, str] = {
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
    return loaded.head.cfg.arch == MODEL_TYPE


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
        "speculators_model_type": MODEL_TYPE,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": int(draft_vocab),
        "norm_before_residual": False,
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [int(i) + 1 for i in cfg.aux_layers or ()],
        "torch_dtype": dtype,
        "speculators_config": algorithm_block(MODEL_TYPE, k, verifier),
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
    tensors = {WEIGHT_NAMES[name]: t.detach().to(dtype).contiguous() for name, t in loaded.head.state_dict().items()}
    tensors["norm.weight"] = final_norm.detach().to(dtype).contiguous()
    rows = lm_head if draft_ids is None else lm_head[draft_ids]
    tensors["lm_head.weight"] = rows.detach().to(dtype).contiguous()
    return tensors
