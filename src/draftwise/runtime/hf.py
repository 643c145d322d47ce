"""The Hugging Face adapter: any ``AutoModelForCausalLM`` behind the :class:`Runtime` protocol.

Cache design (transformers 5.24). Speculative decoding rolls back to any earlier length, so the
cache must be able to forget positions exactly. transformers' own ``DynamicCache`` cannot:
its sliding-window layers (``DynamicSlidingWindowLayer``: Gemma 2/3 and other sliding-window
models) throw away keys older than the window, so ``crop`` raises once the window is full; with
``activate_past_recording`` each crop trims the layer back to the window, so a second rollback
reaching further back silently loses keys. Every layer here therefore keeps the K/V of *all*
positions, in a buffer that grows by doubling, and a rollback just shortens the buffers: O(1),
no recomputation, and the logits equal a fresh run. Memory is that of a full-attention cache.
The sliding layers stay sliding for attention: :class:`WindowLayer` reports the same
``is_sliding`` flag and mask sizes as ``DynamicSlidingWindowLayer`` and hands attention only the
last ``window - 1 + n`` positions, so transformers still builds the sliding mask from
``config.sliding_window`` and a sliding layer costs O(window) per token, not O(length).
Appending copies only the new tokens into the buffer (``DynamicLayer`` re-concatenates the
whole history on every call).

The layer kinds are taken from the cache the model builds for itself (a one-token probe at
construction). A model whose cache holds any other kind of layer (recurrent / linear-attention
state, a model-specific cache class) keeps its own cache, and a rollback there re-runs the kept
prefix: exact, but it costs a prefill.

Token trees (:mod:`.base`) go in as explicit ``position_ids`` (``length + depth``) and a 4-D
additive float mask ``[1, 1, n, length + n]``, which transformers 5.x hands to attention as it is.
``supports_trees`` is True only where that is sure to be exact: every layer is a full-attention
:class:`FullLayer` (a sliding layer sees a slice of the keys, so one mask cannot fit all layers)
and a probe (four passes of two or three tokens, on first use) shows that the model honours
the mask and the positions.

``capture_features`` (:mod:`.features`) records hidden states per position with forward hooks on
the decoder layers (registered only while capture is on; ``output_hidden_states[-1]`` would be
*after* the final norm). The hooks record only inside this adapter's own passes.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import Cache, DummyLayer, DynamicCache

from draftwise.errors import ConfigError, ContextLengthError, ModelLoadError
from draftwise.runtime.base import ancestor_mask, check_keep, check_parents
from draftwise.runtime.features import FeatureCapture
from draftwise.runtime.hf_cache import FullLayer, LayerSpec, WindowLayer, layer_specs


class HFRuntime(FeatureCapture):
    """A Hugging Face causal LM with a single-sequence, exactly rollback-able KV cache."""

    def __init__(self, model: Any, *, max_context: int | None = None) -> None:
        if max_context is not None and max_context < 1:
            raise ConfigError(f"max_context={max_context} is too small; pass at least 1")
        model.eval()
        self._model = model
        config = model.config
        if hasattr(config, "get_text_config"):  # multimodal configs nest the decoder's
            config = config.get_text_config(decoder=True)
        limits = [
            v
            for v in (getattr(config, "max_position_embeddings", None), max_context)
            if isinstance(v, int) and v > 0
        ]
        if not limits:
            raise ConfigError("the model's config has no max_position_embeddings; pass max_context")
        self._max_context = min(limits)
        self._num_layers = int(config.num_hidden_layers)
        self._feature_dim = int(config.hidden_size)
        self._unhook: Any = lambda: None  # removes feature capture's forward hooks
        self._feat_at: int | None = None  # the slot the running pass starts at, for the hooks
        head = model.get_output_embeddings()
        self._vocab_size = int(head.weight.shape[0] if head is not None else config.vocab_size)
        self._num_ids = int(model.get_input_embeddings().weight.shape[0])
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._can_keep_logits = "logits_to_keep" in params
        self._tokens: list[int] = []
        self._cache: Cache | None = None
        self._specs = self._probe()
        self._trees: bool | None = None  # supports_trees, probed on first use
        self._pass_start = 0  # the last forward's start and parents (None: a chain), for keep()
        self._pass_parents: list[int] | None = None

    @classmethod
    def from_folder(
        cls, folder: Path, *, dtype: torch.dtype, max_context: int | None, device: str | torch.device = "cpu"
    ) -> HFRuntime:
        """Load a Hugging Face model folder (config.json + safetensors) in eval mode."""
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise ModelLoadError(f"{folder} is not a Hugging Face model folder (no config.json)")
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        except Exception as exc:  # transformers raises many kinds on a bad folder
            raise ModelLoadError(f"could not load a causal LM from {folder}: {exc}") from exc
        return cls(model.to(device), max_context=max_context)

    @classmethod
    def from_model(cls, model: Any, *, max_context: int | None = None) -> HFRuntime:
        """Wrap a model object already built (and put it in eval mode)."""
        return cls(model, max_context=max_context)

    # -- properties --------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def length(self) -> int:
        return len(self._tokens)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def exact_rollback(self) -> bool:
        """True when a rollback shortens the cache; False when it re-runs the kept prefix."""
        return self._specs is not None

    @property
    def supports_trees(self) -> bool:
        if self._trees is None:
            self._trees = self._mask_works()
        return self._trees

    # -- the protocol ------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> torch.Tensor:
        tokens = self._check_ids(ids)
        if not tokens:
            raise ConfigError("prefill needs at least one token; got an empty prompt")
        if len(tokens) > self._max_context:
            raise ContextLengthError(
                f"the prompt has {len(tokens)} tokens but max_context is {self._max_context}; "
                "shorten the prompt or raise max_context"
            )
        self._reset()
        self._pass_start, self._pass_parents = 0, None
        return self._run(tokens, keep=1)[-1]

    @torch.inference_mode()
    def forward(
        self, ids: Sequence[int], *, layers: Sequence[int] | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        if layers is not None:
            raise ConfigError(
                "running a subset of layers (layers=...) needs the native runtime; "
                "the Hugging Face adapter always runs every layer"
            )
        tokens = self._check_ids(ids)
        tree = None
        if parents is not None and check_parents(parents, len(tokens)) is not None:
            if not self.supports_trees:
                raise ConfigError(
                    f"{type(self._model).__name__} on the Hugging Face adapter cannot verify a token "
                    "tree (supports_trees is False); pass a chain (parents=None)"
                )
            tree = [int(p) for p in parents]
        if not tokens:
            return torch.empty(0, self._vocab_size, dtype=torch.float32, device=self._device)
        end = self.length + len(tokens)
        if end > self._max_context:
            raise ContextLengthError(
                f"{self.length} cached + {len(tokens)} new tokens = {end} positions exceeds "
                f"max_context={self._max_context}"
            )
        self._pass_start, self._pass_parents = self.length, tree
        return self._run(tokens, keep=len(tokens), parents=tree)

    @torch.inference_mode()
    def keep(self, base: int, rows: Sequence[int]) -> None:
        held = self.length - self._pass_start
        kept = check_keep(base, rows, start=self._pass_start, held=held, parents=self._pass_parents)
        first = next((i for i, r in enumerate(kept) if r != i), len(kept))
        if first < len(kept):  # only after a tree pass, so the cache is all FullLayers
            assert self._cache is not None
            src = torch.tensor(kept[first:], device=self._device) + base  # [moved] positions
            for layer in self._cache.layers:
                if isinstance(layer, FullLayer):
                    layer.move(src, base + first)
            if self._feats is not None:
                self._feats.move(src, base + first)
            self._tokens[base + first : base + len(kept)] = [self._tokens[base + r] for r in kept[first:]]
        self.rollback(base + len(kept))
        self._pass_start, self._pass_parents = base, None  # what stays is a chain

    @torch.inference_mode()
    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ConfigError(
                f"cannot roll back to length {length}; it must be in 0..{self.length}"
            )
        if length == self.length:
            return
        if self._specs is not None:
            self._truncate(length)
            del self._tokens[length:]
            return
        # a cache kind we cannot shorten (e.g. recurrent state): rebuild it from the kept prefix
        kept = self._tokens[:length]
        self._reset()
        if kept:
            self._run(kept, keep=1)

    # -- internals ---------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        tokens = [int(t) for t in ids]
        if tokens and not (0 <= min(tokens) and max(tokens) < self._num_ids):
            bad = next(t for t in tokens if not 0 <= t < self._num_ids)
            raise ConfigError(f"token id {bad} is out of range; the model has {self._num_ids} ids")
        return tokens

    def _new_cache(self) -> Cache | None:
        if self._specs is None:
            return None  # the model builds its own on the first call
        layers: list[Any] = []
        for kind, window in self._specs:
            if kind == "full":
                layers.append(FullLayer(self._max_context))
            elif kind == "window":
                layers.append(WindowLayer(window, self._max_context))
            else:
                layers.append(DummyLayer())
        cache = DynamicCache()
        cache.layers = layers
        cache.layer_class_to_replicate = None  # every layer exists already
        return cache

    def _truncate(self, length: int) -> None:
        assert self._cache is not None
        for layer in self._cache.layers:
            if isinstance(layer, (FullLayer, WindowLayer)):
                layer.truncate(length)

    def _reset(self) -> None:
        self._tokens = []
        if self._specs is not None and self._cache is not None:
            self._cache.reset()  # keeps the grown buffers
        else:
            self._cache = self._new_cache()

    def _run(self, tokens: list[int], *, keep: int, parents: list[int] | None = None) -> torch.Tensor:
        """Append ``tokens`` (a tree when ``parents`` is given); return float32 logits of the
        last ``keep`` of them."""
        if self._cache is None and getattr(self, "_specs", None) is not None:
            # a forward before any prefill (a model draft catching up) still needs the
            # rollback-exact cache, not the stock one the model would build
            self._cache = self._new_cache()
        start = self.length
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
        kwargs: dict[str, Any] = {self._cache_arg: self._cache, "use_cache": True}
        if parents is None:
            positions = torch.arange(start, start + len(tokens), dtype=torch.long, device=self._device)
        else:  # a tree: rows at length + depth, each seeing the cache and its ancestors-or-self
            depths = check_parents(parents, len(tokens)) or list(range(len(tokens)))
            positions = torch.tensor(depths, dtype=torch.long, device=self._device) + start
            kwargs["attention_mask"] = self._tree_mask(parents, start)
        position_ids = positions.unsqueeze(0)
        if self._can_keep_logits:
            kwargs["logits_to_keep"] = keep
        try:
            self._feat_at = start
            out = self._model(input_ids=input_ids, position_ids=position_ids, **kwargs)
        except BaseException:  # e.g. Ctrl-C mid-forward: some layers may hold the new tokens
            if self._specs is not None and self._cache is not None:
                self._truncate(start)
            else:  # a cache we cannot shorten: start over empty rather than inconsistent
                self._tokens, self._cache = [], None
            raise
        finally:
            self._feat_at = None
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = getattr(out, "past_key_values", None)
        if cache is None:
            raise ModelLoadError(f"{type(self._model).__name__} returned no KV cache")
        self._cache = cache
        self._tokens.extend(tokens)
        return out.logits[0, -keep:].float()

    def _capture_changed(self) -> None:
        """Hook the decoder layers whose outputs are recorded (only those, only while on). The
        hooks hold the runtime weakly and go when it does: the model may outlive it."""
        self._unhook()
        if self._feats is not None:
            layers, me = self._decoder_layers(), weakref.ref(self)
            hooks = [layers[i].register_forward_hook(functools.partial(_record, me, i)) for i in self._feats.stops]
            self._unhook = weakref.finalize(self, _remove_hooks, hooks)

    def _decoder_layers(self) -> Sequence[Any]:
        """The decoder's layer list: a ModuleList of ``num_hidden_layers`` modules, looked for
        under ``get_decoder()`` first (a multimodal model has vision layers too)."""
        decoder = getattr(self._model, "get_decoder", lambda: self._model)()
        for root in (decoder, self._model):
            modules = root.named_modules()
            lists = [(n, m) for n, m in modules if isinstance(m, torch.nn.ModuleList) and len(m) == self._num_layers]
            lists.sort(key=lambda item: item[0].split(".")[-1] != "layers")  # prefer `...layers`
            if lists:
                return lists[0][1]
        name = type(self._model).__name__
        raise ConfigError(f"cannot find the {self._num_layers} decoder layers of {name} to record features from")

    def _tree_mask(self, parents: list[int], past: int) -> torch.Tensor:
        """The additive mask ``[1, 1, n, past + n]``: 0 where row j sees a key, the dtype's
        minimum elsewhere (the cache and row j's ancestors-or-self are seen)."""
        n = len(parents)
        seen = torch.ones(n, past, dtype=torch.bool, device=self._device)
        visible = torch.cat([seen, ancestor_mask(parents, self._device)], dim=1)  # [n, past + n]
        mask = torch.zeros(visible.shape, dtype=self._dtype, device=self._device)
        return mask.masked_fill_(~visible, torch.finfo(self._dtype).min)[None, None]

    @torch.inference_mode()
    def _mask_works(self) -> bool:
        """Whether a tree pass would be exact here: every cache layer is a FullLayer, and the
        model honours a 4-D mask and position_ids. Probe: tokens ``[0, 1, 2]`` with rows 1 and 2
        both under the root (positions 0, p, p) must score row 2 as the chain ``[0, 2]`` at
        positions 0, p does, while the causal pass and the chain at positions 0, 1 must not
        (were they equal too, the probe would show nothing)."""
        if self._specs is None or any(kind != "full" for kind, _ in self._specs):
            return False
        if self._max_context < 4 or self._num_ids < 3:
            return False
        if "attention_mask" not in inspect.signature(self._model.forward).parameters:
            return False
        p = min(50, self._max_context - 2)

        def last(ids: list[int], pos: list[int], mask: torch.Tensor | None) -> torch.Tensor:
            ids_t, pos_t = (torch.tensor([v], dtype=torch.long, device=self._device) for v in (ids, pos))
            # with a cache, as in a real pass (without one transformers reads jumps in the
            # positions as packed sequences)
            kwargs = {self._cache_arg: DynamicCache(), "use_cache": True, "attention_mask": mask}
            return self._model(input_ids=ids_t, position_ids=pos_t, **kwargs).logits[0, -1].float()

        try:
            chain = last([0, 2], [0, p], None)
            tree = last([0, 1, 2], [0, p, p], self._tree_mask([-1, 0, 0], 0))
            causal = last([0, 1, 2], [0, p, p + 1], None)  # differs from chain: the mask matters
            near = last([0, 2], [0, 1], None)  # differs from chain: the positions matter
        except Exception:  # a model that refuses the mask or the positions
            return False
        shown = min((causal - chain).abs().max(), (near - chain).abs().max())
        return bool(shown > 0 and (tree - chain).abs().max() < 0.1 * shown)

    @torch.inference_mode()
    def _probe(self) -> list[LayerSpec] | None:
        """Run one token to see which cache the model builds; return its layers' rebuild plan."""
        self._cache = None
        try:
            self._run([0], keep=1)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"{type(self._model).__name__} failed a one-token forward: {exc}"
            ) from exc
        specs = layer_specs(self._cache)
        self._tokens = []
        self._cache = None
        return specs


def _record(runtime: weakref.ref[HFRuntime], layer: int, module: Any, args: Any, out: Any) -> None:
    """A decoder layer's forward hook: record its output (inside the runtime's own passes only)."""
    rt = runtime()
    if rt is not None and rt._feat_at is not None and rt._feats is not None:
        rt._feats.write(rt._feat_at, layer, out[0] if isinstance(out, (tuple, list)) else out)  # [1, n, d]


def _remove_hooks(hooks: list[Any]) -> None:
    for hook in hooks:
        hook.remove()
