"""The EAGLE drafter: drafts in the target's feature space with a trained head (``eagle:PATH``).

Each step it first feeds the head the target's features of the positions committed since its
last proposal (``runtime.features``: recorded by the verification pass that just ran, so no
extra target pass), paired with the tokens that followed them; the head's last row guesses the
target's feature at the last committed token, and the target's final norm and LM head turn the
guess into q. It then drafts on from its own guesses, one head row per token. The head keeps
its own KV cache; rows written while drafting are rolled back and rewritten from the target's
real features at the next step, so the cache never holds a guess for a committed position.

Greedy proposes each argmax; sampling draws from q and returns it, which the lossless
verification needs. With ``topk=K > 1`` (``eagle:PATH,topk=4,depth=6``) a greedy step proposes a
dynamic token tree instead, as EAGLE-2 does (Li et al., EMNLP 2024): level by level, the K most
likely children of the K best nodes of the level (best by the product of draft probabilities
along the path, a proxy for the chance the whole path is accepted) are scored in one head pass,
and the ``k`` best nodes of all levels form the tree (ancestors always score at least as well as
their descendants, so the chosen set is a tree). Sampling keeps proposing chains. The head, its files and its training live in :mod:`.eagle_head` and
``draftwise train-head``.

A drafted token reads every weight of the head and of the LM head's rows once (about 40 MB in
float32 for the default model's head), and the call's time follows those bytes. So
:func:`eagle_drafter` runs the decoder layer's matmuls and the LM head rows in per-channel int8
on a CPU where the kernel works (:func:`int8_head`): the same guesses, a call 25-31% shorter
(measured: docs/eagle.md, "What a head step costs"). Only the draft changes; verification keeps
every output exact.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from draftwise.core.draft import Capabilities, Draft, draft_autoregressive
from draftwise.core.sampling import SamplingConfig
from draftwise.core.tree import TokenTree
from draftwise.eagle.files import (
    HEAD_WEIGHTS,
    LoadedHead,
    load_head,
    target_fingerprint,
)
from draftwise.eagle.head import EagleHead, HeadCache
from draftwise.eagle.parts import TargetParts, hf_model, int8_head
from draftwise.errors import ConfigError
from draftwise.runtime.quant import kernel_works

#: heads that ship with draftwise, one folder per target (named like its converted folder)
SHIPPED_HEADS = Path(__file__).resolve().parents[1] / "heads"


def shipped_head(model: Any) -> Path | None:
    """The head that ships for ``model`` (keyed by its converted folder's name), if any."""
    folder = SHIPPED_HEADS / Path(str(getattr(model, "folder", ""))).name
    return folder if (folder / "eagle_head.safetensors").is_file() else None


def default_head_folder(model: Any) -> Path:
    """The head that ships for ``model`` (``eagle:default``), or a one-line error."""
    folder = shipped_head(model)
    if folder is None:
        raise ConfigError(
            f"no draft head ships for {getattr(model, 'name', 'this model')}; train one with "
            "`draftwise train-head --out DIR` and pass --draft eagle:DIR"
        )
    return folder


def hidden_size(runtime: Any) -> int:
    """The target's hidden size (the width of its features)."""
    config = getattr(runtime, "config", None)
    if config is None and hf_model(runtime) is not None:
        config = hf_model(runtime).config
        config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if config is None:
        raise ConfigError(f"the {type(runtime).__name__} runtime does not say its hidden size; EAGLE needs it")
    return int(config.hidden_size)


def fingerprint_of(model: Any) -> str:
    """The fingerprint a head trained for ``model`` carries (tokenizer, hidden size, head width)."""
    return target_fingerprint(model.tokenizer, hidden_size(shared_runtime(model.runtime)), int(model.runtime.vocab_size))


def shared_runtime(runtime: Any) -> Any:
    """The runtime that holds the target's weights: a batched engine's slot (its own features and
    length) borrows them from the runtime under every slot, so all slots' heads share one copy."""
    return getattr(runtime, "shared_runtime", runtime)


HeadWeights = Literal["float32", "int8"]
def default_head_weights(device: torch.device | str = "cpu") -> HeadWeights:
    """int8 on a CPU whose int8 kernel works (see the module docstring), else float32."""
    return "int8" if torch.device(device).type == "cpu" and kernel_works("int8") else "float32"


class EagleDrafter:
    """Drafts with an EAGLE head over the target runtime's features (chains of k tokens).

    ``weights``: ``int8`` drafts with :func:`int8_head` and int8 LM head rows (a CPU's int8
    kernel); ``float32`` with the head as trained."""

    name = "eagle"

    def __init__(
        self, runtime: Any, loaded: LoadedHead, *, label: str = "eagle", topk: int = 1, depth: int = 8,
        weights: HeadWeights = "float32", shared: tuple[EagleHead, TargetParts] | None = None,
    ) -> None:
        """``shared``: the drafting head and the target's parts of another drafter of the same
        head, target and ``weights`` (both read-only while drafting), so that many drafters (a
        server's slots, a bench's methods) hold one copy; see :func:`eagle_drafter`."""
        if weights not in ("float32", "int8"):
            raise ConfigError(f"head weights {weights!r}: use float32 or int8")
        capture = getattr(runtime, "capture_features", None)
        if capture is None:
            raise ConfigError(f"the {type(runtime).__name__} runtime cannot record features; EAGLE needs them")
        owner = shared_runtime(runtime)
        d = hidden_size(owner)
        layers = loaded.head.cfg.feature_layers
        num_layers = getattr(runtime, "num_layers", None)
        if layers is not None and num_layers is not None and max(layers) >= int(num_layers):
            raise ConfigError(
                f"the draft head fuses layers {list(layers)} and the target has {num_layers}: "
                "it was trained for another model"
            )
        if loaded.head.cfg.hidden_size != d:
            raise ConfigError(
                f"the draft head is {loaded.head.cfg.hidden_size} wide and the target's features {d}: "
                "it was trained for another model"
            )
        capture(loaded.head.cfg.feature_layers)
        self.rt = runtime
        self.weights = weights
        if shared is not None:
            self.head, self.parts = shared
        else:
            self.head = int8_head(loaded.head) if weights == "int8" else loaded.head
            self.parts = TargetParts.of(owner, loaded.draft_tokens, int8=weights == "int8")
        self.meta = loaded.meta
        self.name = label
        self.cache = HeadCache(loaded.head.cfg, int(runtime.max_context))
        self._sampling = SamplingConfig()
        self._generator = torch.Generator()
        self._fed = 0  # head rows (positions) computed from the target's real features
        self.topk, self.depth = int(topk), int(depth)
        # on a batched engine's slot, greedy chains' head steps are gathered across its sequences
        self._gather = getattr(runtime, "gather", None)
        self._steps = functools.partial(head_steps, self.head, self.parts)
        self._key = (id(self.head), id(self.parts))  # drafters sharing both gather together
        self.capabilities = Capabilities(trees=self.topk > 1, reads_features=True, replay="rates", cost="head")

    def start(self, prompt: Sequence[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        # before the target's prefill: make it record this head's layers (several heads may
        # share one runtime, as in a bench or a server running EAGLE-1 and EAGLE-3 heads)
        self.rt.capture_features(self.head.cfg.feature_layers)
        self._sampling, self._generator = sampling, generator
        self._fed = 0
        self.cache.rollback(0)

    def _rows(self, tokens: Sequence[int], feats: torch.Tensor, start: int) -> torch.Tensor:
        """Head rows at positions ``start ..``: ``feats[i]`` with the token that followed it."""
        positions = torch.arange(start, start + len(tokens))[None]
        out = self.head(self.parts.embed(tokens)[None], feats[None].float(), positions, self.cache)
        return out[0]  # [n, d]

    def propose(self, context: Sequence[int], k: int, *, scored: bool = False) -> Draft:
        known = int(self.rt.length)  # positions the target has features for: all but the last token
        # a prompt that began with a cached prefix has features from the copy's end on only
        recorded = int(getattr(self.rt, "feature_start", 0))
        if k < 1 or known <= recorded or known != len(context) - 1 or len(context) + k > self.cache.max_context:
            return Draft([])
        start = max(min(self._fed, known - 1), recorded)  # always re-run the last real row: it starts the draft
        with torch.inference_mode():
            self.cache.first = recorded
            self.cache.rollback(start)
            real = self.head.lift(self.rt.features(start, known).float())  # EAGLE-3: fc fuses 3 layers
            self._fed = known
        tokens = list(context[start + 1 : known + 1])
        if self._sampling.greedy and (self.topk <= 1 or k <= 1 or scored):
            # outside inference_mode: on an engine's slot the engine runs other sequences meanwhile
            return self._chain(tokens, real, start, known, k, scored)
        with torch.inference_mode():
            hidden = self._rows(tokens, real, start)[-1:]
            if self._sampling.greedy:
                return self._tree(hidden, known, k)
            state = {"hidden": hidden, "pos": known}

            def step(token: int) -> torch.Tensor:
                state["hidden"] = self._rows([token], state["hidden"], state["pos"])
                state["pos"] += 1
                return self.parts.logits(state["hidden"])[0]

            first = self.parts.logits(hidden)[0]
            if not scored:
                return draft_autoregressive(first, step, k, self._sampling, self._generator)
            seen = [first]

            def step_seen(token: int) -> torch.Tensor:
                seen.append(step(token))
                return seen[-1]

            draft = draft_autoregressive(first, step_seen, k, self._sampling, self._generator)
            top = torch.stack([torch.softmax(row, -1).max() for row in seen[: len(draft)]])
            return Draft(draft.tokens, draft.probs, None, tuple(torch.cumprod(top, 0).tolist()))

    def _chain(self, tokens: list[int], feats: torch.Tensor, start: int, known: int, k: int, scored: bool) -> Draft:
        """Greedy's chain, from the catch-up rows ``tokens`` / ``feats`` at ``start``: each step one
        :func:`head_steps` call (the head's rows, then the argmax over its own draft rows: spreading
        them over the whole vocabulary first cost more than scoring them), gathered with the other
        sequences' on an engine's slot; scored as :meth:`propose_scored` says."""
        drafted, tops = [], []
        for i in range(k):
            item = (tokens, feats, start, self.cache)
            hidden, token, top = (self._gather(self._key, item, self._steps) if self._gather is not None
                                  else self._steps([item])[0])
            drafted.append(token)
            tops.append(top)
            tokens, feats, start = [token], hidden, known + i
        return Draft(drafted, None, None, tuple(torch.cumprod(torch.tensor(tops), 0).tolist()) if scored else None)

    def propose_scored(self, context: Sequence[int], k: int) -> Draft:
        """A chain as :meth:`propose` gives, with scores: the product of the head's top
        probabilities along it (its estimate that the chain is accepted; a hybrid draft merges
        the chain into a copy draft's tree by them)."""
        return self.propose(context, k, scored=True)

    def _tree(self, hidden: torch.Tensor, known: int, budget: int) -> Draft:
        """A greedy EAGLE-2 tree of at most ``budget`` nodes (see the module docstring)."""
        K = self.topk
        tokens: list[int] = []
        parents: list[int] = []  # node index of the parent, -1 for the root
        scores: list[float] = []
        depths: list[int] = []
        slot: dict[int, int] = {}  # expanded node -> its head cache slot

        def add(token: int, parent: int, score: float, depth: int) -> int:
            tokens.append(token)
            parents.append(parent)
            scores.append(score)
            depths.append(depth)
            return len(tokens) - 1
        ids = self.parts.rows  # draft vocabulary index -> token id (None: the same)

        def best(h: torch.Tensor) -> tuple[list[list[float]], list[list[int]]]:
            """The K most likely next tokens after each predicted feature, with log q."""
            top = torch.log_softmax(self.parts.scores(h), -1).topk(min(K, self.parts.head.shape[0]))
            index = top.indices if ids is None else ids[top.indices]
            return top.values.tolist(), index.tolist()

        values, indices = best(hidden)
        level = [add(tok, -1, lp, 1) for lp, tok in zip(values[0], indices[0])]
        feats = {-1: hidden[0]}
        for d in range(1, min(self.depth, budget)):
            expand = sorted(level, key=lambda i: -scores[i])[:K]
            expand = [i for i in expand if scores[i] > float("-inf")]
            if not expand:
                break
            base = self.cache.length
            mask = torch.zeros(len(expand), base + len(expand), dtype=torch.bool)
            mask[:, :known] = True  # every real row
            for r, i in enumerate(expand):
                slot[i] = base + r
                j = i
                while j != -1:  # the node and its expanded ancestors
                    if j in slot:
                        mask[r, slot[j]] = True
                    j = parents[j]
            embeds = self.parts.embed([tokens[i] for i in expand])[None]
            inputs = torch.stack([feats[parents[i]] for i in expand])[None]
            positions = torch.full((1, len(expand)), known + d - 1)
            out = self.head(embeds, inputs, positions, self.cache, attn_mask=mask)[0]  # [e, d]
            values, indices = best(out)  # per expanded node
            level = []
            for r, i in enumerate(expand):
                feats[i] = out[r]
                level += [add(tok, i, scores[i] + lp, d + 1) for lp, tok in zip(values[r], indices[r])]
        best = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i]))[:budget]
        row: dict[int, int] = {}  # node -> its row in the tree, parents before children
        for i in sorted(best, key=lambda i: (depths[i], -scores[i])):
            if scores[i] > float("-inf") and (parents[i] == -1 or parents[i] in row):
                row[i] = len(row) + 1
        kept = list(row)
        tree = TokenTree([tokens[i] for i in kept], [row.get(parents[i], 0) for i in kept])
        return Draft(list(tree.tokens), None, tree)

    def observe(self, num_accepted: int) -> None:
        """Nothing to do: the next proposal rolls the head back to the committed positions."""

    def end(self, output: Sequence[int] | None) -> None:
        pass  # the head's cache is rolled back at the next start


def head_steps(head: EagleHead, parts: TargetParts,
               items: Sequence[tuple[list[int], torch.Tensor, int, HeadCache]]) -> list[tuple[torch.Tensor, int, float]]:
    """One head step for each of several sequences, in one call: item ``(tokens, feats, start,
    cache)`` runs the head's rows for ``tokens`` (each with its feature, ``feats`` ``[n, d]``)
    from position ``start``, appended to its own ``cache``, then the best next token after the
    last row. Returns, per item, that row's predicted feature ``[1, d]``, the token and the
    head's probability of it (a step of :meth:`EagleDrafter._chain`, one sequence or many)."""
    with torch.inference_mode():
        lengths = [len(tokens) for tokens, *_ in items]
        embeds = parts.embed([t for tokens, *_ in items for t in tokens])  # [R, d]
        feats = torch.cat([f.float() for _, f, *_ in items])  # [R, d]
        positions = torch.cat([torch.arange(start, start + n) for (_, _, start, _), n in zip(items, lengths)])
        out = head.forward_many(embeds, feats, positions, lengths, [cache for *_, cache in items])
        last = out[torch.tensor(lengths).cumsum(0) - 1]  # [B, d]
        best = parts.best_many(last)
    return [(last[i : i + 1], token, top) for i, (token, top) in enumerate(best)]


#: per target runtime: (head folder, its weights file's size and mtime, weights) -> the loaded
#: head, the drafting head and the target's parts that every drafter of that head shares
_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[LoadedHead, EagleHead, TargetParts]]] = (
    weakref.WeakKeyDictionary()
)


def eagle_drafter(source: str, model: Any, *, topk: int = 1, depth: int = 8) -> EagleDrafter:
    """The drafter ``eagle:SOURCE`` names for target ``model`` (a :class:`draftwise.Model`), with
    :func:`default_head_weights` for the device the head drafts on (the CPU).

    Drafters of one head on one target share the drafting head (its int8 copy) and the target's
    parts it borrows (the LM head rows and, on a bfloat16 target, a float32 copy of the
    embedding table: 113 MB for the default model): a server builds a drafter per slot and a
    bench one per method, and each used to hold its own copies. A head file changed on disk
    (another size or mtime) is loaded afresh."""
    folder = default_head_folder(model) if source.strip() == "default" else Path(source.strip()).expanduser()
    weights = default_head_weights()
    label = "eagle:default" if source.strip() == "default" else f"eagle:{folder.name}"
    try:
        stat = (folder / HEAD_WEIGHTS).stat()
        key: tuple[Any, ...] | None = (str(folder.resolve()), stat.st_size, stat.st_mtime_ns, weights)
        cache = _SHARED.setdefault(shared_runtime(model.runtime), {})
    except (OSError, TypeError):  # no such file (load_head says so in one line), or a runtime without weakrefs
        key, cache = None, {}
    if key in cache:
        loaded, head, parts = cache[key]
        return EagleDrafter(model.runtime, loaded, label=label, topk=topk, depth=depth, weights=weights,
                            shared=(head, parts))
    loaded = load_head(folder, fingerprint=fingerprint_of(model))
    drafter = EagleDrafter(model.runtime, loaded, label=label, topk=topk, depth=depth, weights=weights)
    if key is not None:
        cache[key] = (loaded, drafter.head, drafter.parts)
    return drafter
