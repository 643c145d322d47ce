"""The draft being trained (the "student"): its shape, its initialisation, its loss.

The draft is a model of the target's own family (a Llama-style config, model_type kept) with
fewer layers, trained as a ``transformers`` model so it saves as an ordinary HF folder.

- Same hidden size as the target (default): layer i of the draft starts as target layer
  ``init_layers[i]``; the embeddings, final norm and head are the target's.
- Another hidden size: every weight is random (normal, std 0.02; norms at 1); the head keeps
  the target's head_dim and query/KV group size, the MLP the target's width ratio.

Loss: the mean over real (unpadded) positions of KL(p || q), p = softmax(z_target / T),
q = softmax(z_draft / T). With a reduced draft vocabulary both are taken over the kept ids
only (p renormalised there), which is the best the draft can do when q = 0 elsewhere.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from draftwise.errors import ConfigError
from draftwise.runtime.native import load_state_dict


def evenly_spaced_layers(n: int, total: int) -> list[int]:
    """n layer indices out of ``total``, evenly spaced, first and last included.

    >>> evenly_spaced_layers(4, 30), evenly_spaced_layers(1, 30), evenly_spaced_layers(3, 3)
    ([0, 10, 19, 29], [0], [0, 1, 2])
    """
    if n == 1:
        return [0]
    return [round(i * (total - 1) / (n - 1)) for i in range(n)]


def _head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def draft_config(target_config: Any, layers: int, *, hidden_size: int | None = None, init_layers: Sequence[int] | None = None) -> Any:
    """The target's config with ``layers`` layers (and, if given, another hidden size)."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = layers
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)):  # per-layer attention kinds (Qwen2): keep the chosen ones
        cfg.layer_types = [types[i] for i in (init_layers or range(layers))]
    cfg.initializer_range = 0.02
    if hidden_size is not None and hidden_size != target_config.hidden_size:
        hd = _head_dim(target_config)
        if hidden_size % hd:
            raise ConfigError(
                f"hidden size {hidden_size} is not a multiple of the target's head dim {hd}; "
                f"pass a multiple of {hd} (e.g. {max(hd, hidden_size // hd * hd)})"
            )
        heads = hidden_size // hd
        kv_target = getattr(target_config, "num_key_value_heads", None) or target_config.num_attention_heads
        group = target_config.num_attention_heads // kv_target
        cfg.hidden_size = hidden_size
        cfg.num_attention_heads = heads
        cfg.num_key_value_heads = heads // group if heads % group == 0 else heads
        cfg.head_dim = hd
        ratio = target_config.intermediate_size / target_config.hidden_size
        cfg.intermediate_size = max(8, 8 * round(hidden_size * ratio / 8))
    return cfg


def build_draft(
    target: Any, layers: int, *, init_layers: Sequence[int] | None, hidden_size: int | None, seed: int,
    freeze_embeddings: bool = False,
) -> Any:
    """A float32 ``transformers`` draft for ``target`` (a :class:`draftwise.Model`).

    ``init_layers`` (same hidden size only) are the target layers the draft's layers start
    from; None means a random initialisation. ``freeze_embeddings`` keeps the embeddings and
    head equal to the target's (no gradient): fewer weights to fit on little data, and a
    trained draft is then described by its layers alone, which is what ships.
    """
    from transformers import AutoModelForCausalLM

    cfg = draft_config(target.config, layers, hidden_size=hidden_size, init_layers=init_layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if init_layers is not None:
        state = load_state_dict(target.folder)
        own = dict(model.named_parameters())
        with torch.no_grad():
            for name, param in own.items():
                source = name
                if name.startswith("model.layers."):
                    index, rest = name[len("model.layers.") :].split(".", 1)
                    source = f"model.layers.{init_layers[int(index)]}.{rest}"
                elif name == "lm_head.weight" and source not in state:
                    source = "model.embed_tokens.weight"  # target tied, draft not
                if source not in state:
                    raise ConfigError(f"the target's weights lack {source!r}; pass --hidden-size to start from random")
                param.copy_(state[source].to(torch.float32))
    if freeze_embeddings:
        if init_layers is None:
            raise ConfigError("frozen embeddings need a draft started from the target's weights")
        model.get_input_embeddings().weight.requires_grad_(False)
        model.get_output_embeddings().weight.requires_grad_(False)
    model.train()
    return model


def draft_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, head_rows: torch.Tensor | None) -> torch.Tensor:
    """The draft's logits at the real positions: ``[N, V']`` (V' = len(head_rows) or vocab).

    ids, mask: [B, L]. The head is applied by hand, to the real positions and the kept rows
    only, so padding and dropped tokens cost nothing.
    """
    hidden = model.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # [B, L, d]
    weight = model.get_output_embeddings().weight  # [vocab, d]
    if head_rows is not None:
        weight = weight[head_rows]  # [V', d]
    return F.linear(hidden[mask], weight)  # [N, V']


def teacher_logits(runtime: Any, ids: torch.Tensor, mask: torch.Tensor, head_rows: torch.Tensor | None) -> torch.Tensor:
    """The target's logits at the real positions: ``[N, V']``, no gradient, one row per draft row.

    Runs each sequence through the target's own runtime (batch size 1, its KV cache reset).
    """
    rows = []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        runtime.rollback(0)
        logits = runtime.forward(ids[b, :n].tolist())  # [n, vocab]
        rows.append(logits if head_rows is None else logits[:, head_rows])
    runtime.rollback(0)
    # clone: the runtime computes under inference_mode, and autograd cannot save such tensors
    return torch.cat(rows).float().clone()  # [N, V']


def kl_loss(draft: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean over rows of KL(softmax(target / T) || softmax(draft / T)); both ``[N, V]``.

    >>> z = torch.tensor([[2.0, 0.0, -1.0]])
    >>> float(kl_loss(z, z))
    0.0
    """
    log_q = F.log_softmax(draft.float() / temperature, dim=-1)
    log_p = F.log_softmax(target.float() / temperature, dim=-1)
    return F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)
