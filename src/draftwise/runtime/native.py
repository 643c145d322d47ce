"""The native runtime: a Llama-family decoder in plain PyTorch with a preallocated KV cache.

Covers Llama 2/3, SmolLM2, Mistral and Qwen2-style models: RMSNorm, rotary embeddings with the
model's theta and scaling, grouped-query attention, SwiGLU, tied or untied head.

Why it is faster than ``transformers`` at batch size 1 on a CPU:

- the KV cache is allocated once, ``[layers][slots, kv_heads, context, head_dim]``, and written
  at token positions; ``rollback`` only moves ``length``; q/k/v and gate/up are one matmul each;
- grouped-query attention folds a group's query heads into the row axis instead of repeating K/V;
  no ``nn.Module`` machinery, hooks or mask objects on the hot path.

``forward(ids, layers=...)`` runs a chosen subset of the decoder layers, then the final norm and
the shared head: the self-speculation draft. It writes the cache of those layers only; the
target's verification pass later rewrites every layer at those positions.

``forward(ids, parents=...)`` feeds a token tree (:mod:`.base`): row j is written at slot
``length + j`` but rotated to position ``length + depth(j)`` and masked to its ancestors.
``keep(base, rows)`` then copies the kept path's K/V down (only the rows not already in place).

Batching: the cache holds ``slots`` sequences (``allocate_slots``); ``forward_batch`` runs several
slots' rows in one pass (:mod:`.batch_plan`), and every kernel is row-invariant
(:mod:`.attention`), so a row's logits never depend on what else is in its pass.

``capture_features`` (:mod:`.features`) records hidden states per position for an EAGLE head,
in slot 0; ``capture_slot_features`` / ``slot_features`` do it per slot, each slot its own buffer
and its own layers, so EAGLE sequences batch: a pass records only its rows' slots that capture,
and cutting the layers at the recorded ones changes no bit (:func:`.features.run_recorded`).
Loading (context length, quantization, fused matmuls) is :mod:`.native_weights`.

Prefix caching (:mod:`.prefix_cache`): each slot knows the token ids its cached positions hold
(every full pass records them; ``keep`` moves them with the K/V, a rollback or a draft pass on a
subset of layers forgets them), so ``save_prefix`` puts a slot's K/V into a
:class:`~.prefix_cache.PrefixCache` under the right ids whoever calls it, and ``reuse_prefix``
copies a cached prefix into a slot, after which ``prefill(ids, start=...)`` runs only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from draftwise.errors import ConfigError, UnsupportedArchitectureError
from draftwise.runtime import kernels
from draftwise.runtime.attention import padded_keys
from draftwise.runtime.base import Rows, check_keep, check_parents
from draftwise.runtime.batch_plan import Plan, attend_groups, make_plan
from draftwise.runtime.features import (
    FeatureBuffer,
    FeatureCapture,
    Writer,
    run_recorded,
)
from draftwise.runtime.llama import (
    DEFAULT_MAX_CONTEXT,
    SUPPORTED_MODEL_TYPES,
    check_supported,
    load_state_dict,
    rope,
    rope_tables,
)
from draftwise.runtime.native_weights import WeightLoader, context_length, quant_modes
from draftwise.runtime.prefix_cache import PrefixCache
from draftwise.runtime.quant import Q4Weight

__all__ = ["DEFAULT_MAX_CONTEXT", "SUPPORTED_MODEL_TYPES", "NativeRuntime", "check_supported", "load_state_dict"]

#: positions of K/V copied between a slot and the prefix cache at a time: one copy per layer's K and
#: V per run instead of per 16-position block (a second turn's 146 positions: 4.6 -> 2.2 ms to reuse)
REUSE_RUN = 256


class NativeRuntime(FeatureCapture):
    """A Llama-family decoder with a position-indexed KV cache (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        state: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
        pack: bool = True,
        quant: str = "none",
        blocks: dict[str, Q4Weight] | None = None,
        block_sources: dict[str, str] | None = None,
        device: str | torch.device = "cpu",
        head_quant: str | None = None,
    ) -> None:
        problem = check_supported(config)
        if problem:
            raise UnsupportedArchitectureError(
                f"{problem}; load it with runtime='hf' (CLI: --runtime hf), the Hugging Face adapter"
            )
        self.config = config
        self._dtype = dtype
        self.n_heads: int = config.num_attention_heads
        self.n_kv: int = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.group = self.n_heads // self.n_kv
        self.eps: float = config.rms_norm_eps
        self._max_context = context_length(config, max_context)
        self.device = torch.device(device)
        self.quant, head_quant = quant_modes(quant, head_quant, self.device)
        weights = WeightLoader(
            state, dtype=dtype, device=self.device, pack=pack, blocks=blocks, block_sources=block_sources
        )
        self.weight_sources = weights.sources  # see WeightLoader.sources
        self.embed = weights.get("model.embed_tokens.weight")  # [vocab, d]
        self.final_norm = weights.get("model.norm.weight")
        self._load_layers(weights)
        self._load_head(weights, head_quant)
        self._allocate(dtype)
        self._all_layers = tuple(range(self.num_layers))
        self.compiled = False
        self._compiled_layers: Any = None  # torch.compile's _layers_impl (see enable_compile)
        self.head_rows: torch.Tensor | None = None  # see restrict_head
        self._head_sub: torch.Tensor | None = None
        self._feature_dim = int(self.embed.shape[1])  # see capture_features
        self.scale = self.head_dim ** -0.5  # attention's 1 / sqrt(head_dim)
        # the compiled attention kernel where this machine builds it (.kernels), else .attention's
        # torch path; set it before the first pass and keep it (the two differ in the last bits)
        self.kernel_attention = self.device.type == "cpu" and kernels.available(self.head_dim, dtype)

    def _load_layers(self, weights: WeightLoader) -> None:
        """Each decoder layer's two norms and four fused matmuls: q/k/v, o, gate/up, down."""
        self.ln_attn: list[torch.Tensor] = []
        self.ln_mlp: list[torch.Tensor] = []
        self._qkv, self._o, self._gate_up, self._down = [], [], [], []  # type: ignore[var-annotated]
        linear, maybe, mode = weights.linear, weights.maybe, self.quant
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            biases = [maybe(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
            bqkv = torch.cat(biases) if all(b is not None for b in biases) else None  # type: ignore[misc]
            self._qkv.append(linear([p + f"self_attn.{x}_proj.weight" for x in "qkv"], bqkv, mode))
            self._o.append(linear([p + "self_attn.o_proj.weight"], maybe(p + "self_attn.o_proj.bias"), mode))
            self._gate_up.append(linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], None, mode))
            self._down.append(linear([p + "mlp.down_proj.weight"], None, mode))
            self.ln_attn.append(weights.get(p + "input_layernorm.weight"))
            self.ln_mlp.append(weights.get(p + "post_attention_layernorm.weight"))

    def _load_head(self, weights: WeightLoader, head_quant: str) -> None:
        """The output head: the embedding when tied (or when the weights have no head of their
        own), kept in ``dtype`` as :attr:`head` and as a matmul in ``head_quant``."""
        head_name = "lm_head.weight"
        state = weights.state
        tied = getattr(self.config, "tie_word_embeddings", head_name not in state) or head_name not in state
        self.head = self.embed if tied else weights.get(head_name)  # [vocab, d], in `dtype`
        self._head = weights.linear(["model.embed_tokens.weight" if tied else head_name], None, head_quant)

    def _allocate(self, dtype: torch.dtype) -> None:
        """The rotary tables for all ``max_context`` positions and the KV cache of one slot."""
        cos, sin = rope_tables(self.config, self._max_context)
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)])
        self.cos = cos.to(self.device, dtype)  # [max_context, hd]
        self.sin_signed = (sin * sign).to(self.device, dtype)  # sin with rotate_half's sign folded in
        self.allocate_slots(1)

    def allocate_slots(self, slots: int, context: int | None = None) -> None:
        """(Re)allocate the KV cache for ``slots`` sequences of up to ``context`` positions each
        (default: ``max_context``); everything cached is forgotten. Slot 0 is the one the
        single-sequence methods (``prefill``, ``forward``, ``keep``...) use.

        One ``[slots, kv_heads, context, head_dim]`` buffer per layer for K and for V, padded to
        a multiple of :data:`.attention.CHUNK` positions and zeroed: the batched attention reads
        whole blocks, and a masked key must hold a finite value (its weight is exactly 0)."""
        context = self._max_context if context is None else int(context)
        if slots < 1 or not 1 <= context <= self._max_context:
            raise ConfigError(f"allocate_slots({slots}, {context}): need slots >= 1 and 1 <= context <= {self._max_context}")
        shape = (slots, self.n_kv, padded_keys(context), self.head_dim)
        self._k = [torch.zeros(shape, dtype=self._dtype, device=self.device) for _ in range(self.num_layers)]
        self._v = [torch.zeros(shape, dtype=self._dtype, device=self.device) for _ in range(self.num_layers)]
        self._context = context
        self._lengths = [0] * slots
        self._tokens: list[list[int]] = [[] for _ in range(slots)]  # the ids at each slot's first positions
        # each slot's last pass: where it started and its parents (None: a chain), for keep()
        self._pass_starts = [0] * slots
        self._pass_parents: list[list[int] | None] = [None] * slots
        # each slot's recorded features (None: capture off); slot 0's is ``_feats``, kept across
        # a reallocation as it was before slots existed
        first = getattr(self, "_slot_feats", [None])[0]
        self._slot_feats: list[FeatureBuffer | None] = [first] + [None] * (slots - 1)

    @property  # type: ignore[override]
    def _feats(self) -> FeatureBuffer | None:
        """Slot 0's feature buffer, what :class:`.features.FeatureCapture` reads and writes."""
        return self._slot_feats[0]

    @_feats.setter
    def _feats(self, buf: FeatureBuffer | None) -> None:
        self._slot_feats[0] = buf

    def capture_slot_features(self, slot: int, layers: Sequence[int] | None = None, *, enabled: bool = True) -> None:
        """``capture_features`` for slot ``slot`` (each slot records its own layers, or none)."""
        if slot == 0:
            self.capture_features(layers, enabled=enabled)
            return
        self._slot_feats[slot] = None if not enabled else FeatureBuffer.for_layers(
            self._slot_feats[slot], layers, num_layers=self.num_layers, dim=self._feature_dim, limit=self._context)

    def slot_features(self, slot: int, start: int, end: int) -> torch.Tensor:
        """``features`` of slot ``slot``: ``[end - start, width]`` float32."""
        buf = self._slot_feats[slot]
        if buf is None:
            raise ConfigError(f"features are off in slot {slot}: capture them before the passes that need them")
        return buf.features(start, end, self._lengths[slot])

    def slot_feature_width(self, slot: int) -> int:
        buf = self._slot_feats[slot]
        return 0 if buf is None else buf.width

    def slot_feature_start(self, slot: int) -> int:
        buf = self._slot_feats[slot]
        return 0 if buf is None else buf.first

    def cache_bytes(self, slots: int, context: int) -> int:
        """Bytes of KV cache ``allocate_slots(slots, context)`` takes."""
        return slots * padded_keys(context) * self.position_bytes

    @property
    def position_bytes(self) -> int:
        """Bytes of K/V one position takes, every layer's K and V."""
        return 2 * self.num_layers * self.n_kv * self.head_dim * self._dtype.itemsize

    @property
    def slots(self) -> int:
        return len(self._lengths)

    @property
    def slot_context(self) -> int:
        """Positions one slot holds (``max_context`` unless ``allocate_slots`` said fewer)."""
        return self._context

    k_cache = property(lambda self: [k[0] for k in self._k], doc="Slot 0's K cache per layer: [KV, ctx, hd] views")
    v_cache = property(lambda self: [v[0] for v in self._v], doc="Slot 0's V cache per layer: [KV, ctx, hd] views")

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        config: Any | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        max_context: int | None = None,
        **options: Any,
    ) -> NativeRuntime:
        """Load a Hugging Face folder; ``options`` go to the constructor (quant, blocks, device)."""
        if config is None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(folder))
        return cls(config, load_state_dict(Path(folder)), dtype=dtype, max_context=max_context, **options)

    def matmuls(self, layer: int) -> tuple[Any, Any, Any, Any]:
        """Layer ``layer``'s fused q/k/v, o, fused gate/up and down matmuls (each has ``nbytes``)."""
        return self._qkv[layer], self._o[layer], self._gate_up[layer], self._down[layer]

    @property
    def head_matmul(self) -> Any:
        """The output head's matmul (it has ``nbytes``)."""
        return self._head

    # -- the Runtime protocol -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.head.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def length(self) -> int:
        return self._lengths[0]

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def supports_trees(self) -> bool:
        return True

    runs_layer_subsets = True  # forward(layers=...): what a self-speculation draft needs

    def rollback(self, length: int) -> None:
        self.rollback_slot(0, length)

    def rollback_slot(self, slot: int, length: int) -> None:
        """Forget slot ``slot``'s positions ``>= length``."""
        if not 0 <= length <= self._lengths[slot]:
            raise ConfigError(f"cannot roll back to {length}: the cache holds {self._lengths[slot]} positions")
        self._lengths[slot] = length
        del self._tokens[slot][length:]

    def slot_length(self, slot: int) -> int:
        return self._lengths[slot]

    def prefill(self, ids: Sequence[int], *, start: int = 0) -> torch.Tensor:
        """The protocol's prefill; ``start``: the first ``start`` positions already hold
        ``ids[:start]`` (``reuse_prefix`` put them there) and only the rest runs."""
        ids = list(ids)
        self.resume_prompt(0, ids, start)
        return self._run([Rows(0, ids[start:], None, last_only=True)], self._all_layers)[0][0]

    def forward(
        self, ids: Sequence[int], *, layers: Sequence[int] | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        chosen = self._all_layers
        if layers is not None:
            chosen = tuple(layers)
            if not chosen or any(not 0 <= i < self.num_layers for i in chosen):
                raise ConfigError(
                    f"layers={list(chosen)} must be a non-empty list of indices in [0, {self.num_layers})"
                )
        tree = None
        if parents is not None and check_parents(parents, len(ids)) is not None:
            tree = [int(x) for x in parents]  # a chain (None) takes the plain causal mask
        return self._run([Rows(0, list(ids), tree)], chosen)[0]

    def forward_batch(self, passes: Sequence[Rows], *, layers: Sequence[int] | None = None) -> list[torch.Tensor]:
        """One pass over several slots' new rows (each :class:`Rows`): their logits, in order,
        ``[n, vocab]`` each (``[1, vocab]`` for ``last_only``, ``[0, vocab]`` for ``logits=False``).
        A row's logits are bit-identical to what the same slot's rows give in a pass of their
        own: the batch only shares the matmuls (see :mod:`.attention`). ``layers``: a subset,
        as ``forward`` takes it (a self-speculation draft pass). Slots that capture features
        record their rows (``capture_slot_features``)."""
        return self._run(list(passes), self._all_layers if layers is None else tuple(layers))

    def keep(self, base: int, rows: Sequence[int]) -> None:
        self.keep_slot(0, base, rows)

    def keep_slot(self, slot: int, base: int, rows: Sequence[int]) -> None:
        """``keep`` for slot ``slot``'s last pass."""
        start, parents = self._pass_starts[slot], self._pass_parents[slot]
        kept = check_keep(base, rows, start=start, held=self._lengths[slot] - start, parents=parents)
        # rows[i] >= i; the leading rows with rows[i] == i are in place already
        first = next((i for i, r in enumerate(kept) if r != i), len(kept))
        if first < len(kept):
            src = torch.tensor(kept[first:], device=self.device) + base  # [moved] slots
            dst = slice(base + first, base + len(kept))
            with torch.inference_mode():
                for cache in (*self._k, *self._v):
                    # gathered first: src and dst may overlap
                    cache[slot, :, dst] = cache[slot].index_select(1, src)
                feats = self._slot_feats[slot]
                if feats is not None:
                    feats.move(src, base + first)
        held = self._tokens[slot]
        path = [held[base + r] for r in kept] if len(held) > base + kept[-1] else []
        del held[base:]
        held.extend(path)  # nothing where the pass's ids were not recorded (a gap before it)
        self._lengths[slot] = base + len(kept)
        self._pass_parents[slot] = None  # what stays is a chain

    # -- the prefix cache -----------------------------------------------------------------
    @property
    def reuses_prefixes(self) -> bool:
        """Whether a copied prefix is bit for bit its prefill: the eager passes are row-invariant,
        a compiled one is not promised to be (``enable_compile``), so a compiled runtime reuses none."""
        return not self.compiled

    def resume_prompt(self, slot: int, ids: Sequence[int], start: int) -> None:
        """Roll slot ``slot`` back to its first ``start`` positions, which must hold ``ids[:start]``
        with a token of ``ids`` left to run (0: an empty slot)."""
        if start and not (0 < start < len(ids) and start <= self._lengths[slot]
                          and self._tokens[slot][:start] == list(ids[:start])):
            raise ConfigError(f"prefill(start={start}): slot {slot} does not hold the prompt's first {start} tokens "
                              "with one left to run; reuse_prefix says how many it copied")
        self.rollback_slot(slot, start)

    def _chain_tokens(self, slot: int) -> list[int]:
        """The ids of slot ``slot``'s first positions whose K/V are a chain's on every layer (a draft
        pass on some layers leaves its rows out already): not a tree pass's rows not kept yet."""
        held = self._tokens[slot]
        return held[: self._pass_starts[slot]] if self._pass_parents[slot] is not None else held

    def held_prefix(self, slot: int, ids: Sequence[int]) -> int:
        """How many of ``ids``' first positions slot ``slot`` holds already (its last sequence
        started the same way), all but the last token at most: K/V at a position depend only on
        the tokens up to it, so they are the ones a prefill of ``ids`` would write. 0 on a
        compiled runtime (``reuses_prefixes``)."""
        if not self.reuses_prefixes:
            return 0
        held, ids = self._chain_tokens(slot), ids if isinstance(ids, list) else list(ids)
        end = max(min(len(held), len(ids) - 1), 0)
        if held[:end] == ids[:end]:
            return end
        lo, hi = 0, end - 1  # the longest common prefix, by slices (compared in C), in log steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if held[:mid] == ids[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def reuse_prefix(self, ids: Sequence[int], cache: PrefixCache, slot: int = 0) -> int:
        """Keep the longest prefix of ``ids`` that slot ``slot`` holds already (``held_prefix``),
        forget the rest, and copy into it what ``cache`` holds beyond that, all but the last
        token at most; return the positions reused (0: none, and on a compiled runtime). A slot
        that records features records them from the reused prefix's end on (a reused prefix
        has none: ``feature_start``)."""
        ids = list(ids)
        held = self.held_prefix(slot, ids)
        self.rollback_slot(slot, held)
        feats = self._slot_feats[slot]
        if feats is not None:
            feats.restart(0)
        if not self.reuses_prefixes:
            return 0
        cache.bind(self)
        with cache.lookup(ids, usable=len(ids) - 1, held=held) as lease:
            n = max(lease.tokens, held)
            with torch.inference_mode():
                # a few blocks a copy (few ops, a small temporary), from the first position not held
                for start, kv in lease.runs(REUSE_RUN, skip=held) if lease.tokens > held else ():
                    end = start + kv.shape[2]
                    for cache_tensor, rows in zip((*self._k, *self._v), kv):  # rows: [KV, end - start, hd]
                        cache_tensor[slot, :, start:end] = rows
        self._lengths[slot], self._tokens[slot] = n, ids[:n]
        self._pass_starts[slot], self._pass_parents[slot] = 0, None
        if feats is not None:
            feats.restart(n)
        return n

    def save_prefix(self, cache: PrefixCache, slot: int = 0) -> int:
        """Put slot ``slot``'s blocks of known tokens into ``cache``, the positions after the last
        full one as a tail block; return how many were new."""
        if not self.reuses_prefixes:
            return 0
        cache.bind(self)
        held = self._chain_tokens(slot)
        layers = (*self._k, *self._v)

        first, run = 0, None  # the K/V of positions first.., read up to REUSE_RUN positions at once

        def read(start: int, end: int) -> torch.Tensor:  # [2 * layers, KV, end - start, hd]
            nonlocal first, run
            if run is None or start < first or end > first + run.shape[2]:
                stop = max(end, min(start + REUSE_RUN, len(held)))
                with torch.inference_mode():
                    run = torch.stack([c[slot, :, start:stop] for c in layers])
                first = start
            return run[:, :, start - first : end - first]

        return cache.insert(held, read, block_bytes=cache.block_tokens * self.position_bytes, tail=True)

    def restrict_head(self, rows: Sequence[int] | torch.Tensor | None) -> None:
        """Score only the token ids ``rows`` (a reduced-vocabulary draft head, as in FR-Spec);
        every other id gets logit -inf, so q = 0 there. ``None`` restores the full head.

        The head's cost shrinks to ``len(rows) / vocab`` of itself; the logits keep their
        ``[n, vocab]`` shape, so a drafter and the verifier need not know.
        """
        if rows is None:
            self.head_rows, self._head_sub = None, None
            return
        index = torch.as_tensor(rows, dtype=torch.long, device=self.device).flatten()
        if index.numel() == 0 or int(index.min()) < 0 or int(index.max()) >= self.vocab_size:
            raise ConfigError(f"head rows must be a non-empty list of token ids in [0, {self.vocab_size})")
        if index.unique().numel() != index.numel():
            raise ConfigError("head rows must not repeat a token id")
        self.head_rows = index
        self._head_sub = self.head[index].contiguous()  # [rows, d]

    # -- the model ------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # one fused kernel (it accumulates in float32, as transformers' RMSNorm does)
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _layers_impl(self, x: torch.Tensor, plan: Plan, layers: tuple[int, ...]) -> torch.Tensor:
        """The decoder layers ``layers`` over ``x`` (``[R, d]``, this pass's own tensor: it is
        updated in place), writing each row's K/V at its slot and position (``plan``)."""
        R = x.shape[0]
        H, KV, hd = self.n_heads, self.n_kv, self.head_dim
        cos, sin = self.cos[plan.positions, None, :], self.sin_signed[plan.positions, None, :]  # [R, 1, hd]
        lo, start = plan.first_slot, plan.starts[0]
        for i in layers:
            h = self._norm(x, self.ln_attn[i])
            qkv = self._qkv[i](h)  # [R, (H + 2 KV) * hd]
            qk = rope(qkv[:, : (H + KV) * hd].view(R, H + KV, hd), cos, sin)  # q and k at once
            k, v = qk[:, H:], qkv[:, (H + KV) * hd :].view(R, KV, hd)  # [R, KV, hd]
            if plan.single:  # one slot's consecutive positions
                self._k[i][lo, :, start : start + R] = k.transpose(0, 1)
                self._v[i][lo, :, start : start + R] = v.transpose(0, 1)
            else:  # into [slots, KV, ctx, hd] at each row's slot and position
                self._k[i][plan.slot_of, :, plan.at] = k
                self._v[i][plan.slot_of, :, plan.at] = v
            x.add_(self._o[i](attend_groups(plan, qk[:, :H], self._k[i], self._v[i], self.scale, x.dtype)))
            h = self._norm(x, self.ln_mlp[i])
            gate, up = self._gate_up[i](h).chunk(2, dim=-1)  # [R, ffn] each
            x.add_(self._down[i](F.silu(gate).mul_(up)))
        return x

    def _layers(self, x: torch.Tensor, plan: Plan, layers: tuple[int, ...]) -> torch.Tensor:
        """The decoder layers ``layers`` over ``x``: compiled by torch (enable_compile), else with the
        compiled kernels between the matmuls where attention runs the kernel (the same library),
        else in torch."""
        if self._compiled_layers is not None:
            return self._compiled_layers(x, plan, layers)
        if self.kernel_attention:
            return self._layers_fused(x, plan, layers)
        return self._layers_impl(x, plan, layers)

    def _layers_fused(self, x: torch.Tensor, plan: Plan, layers: tuple[int, ...]) -> torch.Tensor:
        """:meth:`_layers_impl` with the compiled kernels between the matmuls: one call for the
        rotation, the cache writes and attention's queries, one for attention, one for each residual
        add with the norm after it, one for SwiGLU (``kernels/layer.c`` says why). Row-invariant as
        the torch path is, and different from it in the last bits (its own norm and exp)."""
        threads, eps, H = plan.threads, self.eps, self.n_heads
        assert plan.seq is not None and plan.trees is not None
        h = kernels.add_norm(x, None, self.ln_attn[layers[0]], eps, threads) if layers else None
        for n, i in enumerate(layers):
            assert h is not None
            k_cache, v_cache = self._k[i], self._v[i]
            q = kernels.rope_store(self._qkv[i](h), self.cos, self.sin_signed, plan.positions, plan.slot_of, plan.at,
                                   k_cache, v_cache, H, threads)
            att = kernels.attend(q, k_cache, v_cache, plan.seq, plan.trees, self.scale, threads, x.dtype)
            h = kernels.add_norm(x, self._o[i](att), self.ln_mlp[i], eps, threads)
            up = kernels.silu_mul(self._gate_up[i](h), threads)
            following = self.ln_attn[layers[n + 1]] if n + 1 < len(layers) else None
            h = kernels.add_norm(x, self._down[i](up), following, eps, threads)
        return x

    def enable_compile(self) -> str | None:
        """Run the decoder layers through ``torch.compile`` (inductor: it fuses the norms, rope,
        reshapes and SwiGLU between the matmuls). Returns why not, in a few words, where this
        machine cannot (no C++ compiler, a device inductor does not cover), and stays eager.
        A compiled pass is not promised row-invariant: inductor picks its own reductions."""
        import shutil

        if self.device.type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
            return "no C++ compiler on PATH"
        try:
            self._compiled_layers = torch.compile(self._layers_impl, dynamic=True)
            with torch.no_grad():  # warm up the shapes a decode uses: n = 1 and n > 1
                saved = list(self._lengths), list(self._pass_starts), list(self._pass_parents), list(self._tokens[0])
                self._run([Rows(0, [0, 0], None)], self._all_layers)
                self._run([Rows(0, [0], None)], self._all_layers)
                self._lengths, self._pass_starts, self._pass_parents, self._tokens[0] = saved
        except Exception as exc:  # inductor raises many kinds; any of them means eager
            self._compiled_layers = None
            return f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        self.compiled = True
        return None

    def _run(self, passes: list[Rows], layers: Sequence[int]) -> list[torch.Tensor]:
        # inference_mode is faster, but tensors made under it cannot enter a compiled graph
        with torch.no_grad() if self.compiled else torch.inference_mode():
            return self._run_impl(passes, tuple(layers))

    def _run_impl(self, passes: list[Rows], layers: tuple[int, ...]) -> list[torch.Tensor]:
        plan = make_plan(passes, self._lengths, self._context, kv_heads=self.n_kv, group=self.group,
                         head_dim=self.head_dim, device=self.device, compiled=self.kernel_attention)
        tokens = torch.as_tensor([t for p in passes for t in p.ids], dtype=torch.long, device=self.device)
        x = F.embedding(tokens, self.embed)  # [R, d]
        writers: list[Writer] = []  # the passes whose slots record features, and their rows
        offset = 0
        for p, start in zip(passes, plan.starts):
            buf = self._slot_feats[p.slot]
            if buf is not None:
                writers.append((buf, offset, offset + len(p.ids), start))
            offset += len(p.ids)
        if writers and layers == self._all_layers:  # record (see .features)
            x = run_recorded(lambda part, x: self._layers(x, plan, part), x, writers, self.num_layers)
        else:
            x = self._layers(x, plan, layers)
            for buf, _, _, start in writers:
                buf.forget(start)  # a draft pass: its slots hold no target features
        wanted: list[int] = []  # the rows whose logits are returned
        offset = 0
        for p, start in zip(passes, plan.starts):
            n = len(p.ids)
            self._lengths[p.slot] = start + n
            self._pass_starts[p.slot], self._pass_parents[p.slot] = start, p.tree
            held = self._tokens[p.slot]
            if len(held) >= start:  # else a gap before the pass: its positions stay unknown
                del held[start:]
                if layers == self._all_layers:  # a draft pass on some layers leaves the others stale
                    held.extend(p.ids)
            if p.logits:
                wanted.extend(range(offset + n - 1, offset + n) if p.last_only else range(offset, offset + n))
            offset += n
        logits = self._logits(x[wanted] if len(wanted) < x.shape[0] else x)
        out, used = [], 0
        for p in passes:
            n = 0 if not p.logits else 1 if p.last_only else len(p.ids)
            out.append(logits[used : used + n])
            used += n
        return out

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the head: ``[n, vocab]`` float32."""
        if self.kernel_attention and not self.compiled:  # the layers' own norm (see _layers_fused)
            x = kernels.add_norm(x.contiguous(), None, self.final_norm, self.eps, torch.get_num_threads())
        else:
            x = self._norm(x, self.final_norm)
        if self.head_rows is None:
            return self._head(x).float()
        assert self._head_sub is not None
        out = torch.full((x.shape[0], self.vocab_size), float("-inf"), device=self.device)  # [n, vocab]
        return out.index_copy_(1, self.head_rows, F.linear(x, self._head_sub).float())
