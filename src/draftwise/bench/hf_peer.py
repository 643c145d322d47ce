"""The Hugging Face peer: ``transformers`` ``generate`` on the same weights, as a reference point.

``--peers hf`` adds up to four methods, all measured against draftwise plain decoding (``none``):
``hf`` (plain), ``hf-lookup`` (prompt lookup), ``hf-assistant`` (the first ``model:`` draft as an
assistant model) and, for the Llama family, ``hf-early-exit`` (self-speculation by early exit, at
the layer of an early-exit ``self`` draft when one runs, else half the layers).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.answers import TurnResult
from draftwise.bench.methods import Method
from draftwise.core.sampling import SamplingConfig
from draftwise.drafters.factory import model_draft_source
from draftwise.drafters.spec import KValue
from draftwise.runtime.loaders import gguf_to_folder, resolve_model

#: prompt-lookup tokens for ``hf-lookup`` when ``k`` is ``"auto"``
HF_LOOKUP_DEFAULT = 10
_LLAMA_FAMILY = ("llama",)


def _draft_folder(source: str, target: Any) -> Path:
    """The Hugging Face folder of a ``model:SOURCE`` draft (a GGUF file is converted, cached)."""
    _, path = resolve_model(model_draft_source(source, target))
    return gguf_to_folder(path) if path.is_file() else path


def hf_methods(model: Any, methods: Sequence[Method], k: KValue) -> list[Method]:
    """``hf``, ``hf-lookup``, and ``hf-assistant`` / ``hf-early-exit`` where they apply."""
    num_k = k if isinstance(k, int) else None
    out = [
        Method("hf", "hf", "plain"),
        Method("hf-lookup", "hf", "lookup", hf_kwargs={"prompt_lookup_num_tokens": num_k or HF_LOOKUP_DEFAULT}),
    ]
    assisted = {"num_assistant_tokens": num_k} if num_k else {}
    model_drafts = [m for m in methods if m.spec.startswith("model:")]
    if model_drafts:
        folder = _draft_folder(model_drafts[0].spec.partition(":")[2], model)
        out.append(
            Method("hf-assistant", "hf", model_drafts[0].spec, hf_kwargs={"assistant_folder": str(folder), **assisted})
        )
    if getattr(model.config, "model_type", None) in _LLAMA_FAMILY:
        layer = model.runtime.num_layers // 2
        for m in methods:
            layers = getattr(m.drafter, "layers", None)
            if layers and list(layers) == list(range(len(layers))):  # an early-exit self draft
                layer = len(layers)
                break
        out.append(
            Method("hf-early-exit", "hf", f"early-exit:{layer}", hf_kwargs={"assistant_early_exit": layer, **assisted})
        )
    return out


class HFPeer:
    """Hugging Face ``generate`` on the same weights, greedy or sampled like the run."""

    def __init__(self, model: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.model = model
        self.hf = AutoModelForCausalLM.from_pretrained(str(model.folder), dtype=model.dtype).eval()
        self.assistants: dict[str, Any] = {}
        self.eos = sorted(model.eos_token_ids)

    def _assistant(self, folder: str) -> Any:
        if folder not in self.assistants:
            from transformers import AutoModelForCausalLM

            self.assistants[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=self.model.dtype).eval()
        return self.assistants[folder]

    def _config(self, method: Method, max_new_tokens: int, sampling: SamplingConfig) -> tuple[Any, Any]:
        """The GenerationConfig of ``method`` and its assistant model (or None)."""
        from transformers import GenerationConfig

        kwargs = dict(method.hf_kwargs)
        assistant = self._assistant(kwargs.pop("assistant_folder")) if "assistant_folder" in kwargs else None
        if "num_assistant_tokens" in kwargs:
            kwargs["num_assistant_tokens_schedule"] = "constant"
        sample: dict[str, Any] = {"do_sample": False}
        if not sampling.greedy:
            sample = {"do_sample": True, "temperature": sampling.temperature,
                      "top_k": sampling.top_k, "top_p": sampling.top_p}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos or None,
            pad_token_id=self.eos[0] if self.eos else 0,
            **sample,
            **kwargs,
        )
        return config, assistant

    def generate(self, method: Method, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig) -> TurnResult:
        from transformers.utils import logging as hf_logging

        config, assistant = self._config(method, max_new_tokens, sampling)
        if not sampling.greedy and sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        ids = torch.tensor([prompt_ids], dtype=torch.long)  # [1, n]
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = self.hf.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=config, assistant_model=assistant,
                )
                seconds = time.perf_counter() - t0
        finally:
            hf_logging.set_verbosity(verbosity)
        new = [int(t) for t in out[0, len(prompt_ids):].tolist()]
        for i, t in enumerate(new):  # stop at the first EOS (later ones are padding)
            if t in self.model.eos_token_ids:
                new = new[:i]
                break
        text = self.model.tokenizer.decode(new, skip_special_tokens=True)
        return TurnResult(text, new, seconds, {"draft": method.spec}, [])
