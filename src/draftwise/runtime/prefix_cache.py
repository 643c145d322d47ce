"""The prefix cache: K/V that earlier sequences computed, kept so a new prompt that starts the same
way prefills only the rest (vLLM's automatic prefix caching, SGLang's RadixAttention).

What is kept: copies of *blocks*, the K/V of :data:`BLOCK_TOKENS` consecutive positions of one
sequence, every layer (``[2 * layers, kv_heads, B, head_dim]``: layer i's K at row i, its V at row
``layers + i``), each in a place of one pool tensor of ``max_bytes`` made on the first insert, so
an evicted block's place is reused and the process never holds more than the bound for the cache
(blocks allocated one by one left the allocator's freed pieces resident: 2.4x the bound in RSS). A block is keyed by its parent block (the one before it, None for position 0) and
its own token ids, so a chain of blocks from position 0 names a prefix exactly. The K/V at a
position depend only on the tokens up to it (every kernel of the native runtime is row-invariant:
``runtime/attention.py``), so a block is valid for any sequence that starts with its chain's
tokens, and a reused prefix gives bit for bit the logits its prefill would.

Why blocks in a hash chain (vLLM) and not a radix tree (SGLang), for this runtime: each
sequence's K/V lives contiguously in its own slot (``[slots, kv_heads, context, head_dim]`` per
layer; attention reads a slot as one view), so a cached prefix cannot be shared in place, as
SGLang's tree points requests at pages of one token pool and vLLM's block tables point them at
shared physical blocks: reuse here is a copy into the slot, and the cache is a store of copies
beside the slots. What a slot holds already is not copied: a slot keeps its last sequence's K/V
until it is reused, a runtime's ``reuse_prefix`` keeps the positions a new prompt shares with them
(``held_prefix``) and copies only the cached ones after those, and the batched engine starts a
prompt in the free slot that holds most of it (llama.cpp's slot reuse): a chat's next turn, or a
prompt after another with its system prompt, copies nothing it shares (at 1,100 float32 positions,
about 50 MB and 18-36 ms). For a store of copies, fixed-size blocks are the simpler index: every entry has
the same size, so the byte bound is a block count and LRU evicts whole entries (a radix tree's
edges have any length, are split on insert and cut on eviction); a prompt's match is one dict
probe per block; and the token granularity a radix tree gives is kept where it matters, since
the block after the matched chain is copied as far as its tokens agree (see the rules). The key
holds the parent's id and the tokens themselves, so a probe compares the tokens, and two prefixes
never share a block by a hash collision.

Rules: a lookup matches the longest chain of cached blocks that the prompt starts with, then the
first positions of a cached block after it that the prompt's next tokens begin (a prompt that
ends, or leaves an earlier one, inside a block: a repeated prompt, the next turn of a chat), but
reuses at most ``len(prompt) - 1`` positions, so the first token's logits always come from a pass
(a prompt that is exactly a cached prefix copies all but its last position). A sequence's positions
after its last full block are kept too, as a *tail* block of fewer tokens (``insert(tail=True)``,
what a runtime's ``save_prefix`` does): a chat's next turn starts with the whole answer before it,
and without its tail would prefill up to a block's tokens of it again. A :class:`Lease` pins
its blocks (a reference count) until the copy is done; eviction takes the least recently used
block that is unpinned and has no cached child, so a chain is cut from its end, never orphaned
(a lookup or insert touches the chain leaf first, so a parent is always more recent than its
children). The bytes held never exceed ``max_bytes``: a block that cannot be made room for is not
kept (nor are the blocks after it).

Example, 2 tokens a block::

    >>> cache = PrefixCache(max_bytes=1 << 20, block_tokens=2)
    >>> read = lambda start, end: torch.zeros(2, 1, end - start, 4)   # a runtime's K/V of positions
    >>> cache.insert([5, 6, 7, 8, 9], read, block_bytes=64)          # blocks [5, 6] and [7, 8]
    2
    >>> with cache.lookup([5, 6, 7, 8, 1], usable=4) as lease:      # [5, 6, 7, 8] cached
    ...     lease.tokens, tuple(lease.kv().shape)
    (4, (2, 1, 4, 4))
    >>> with cache.lookup([5, 6, 7, 8], usable=3) as lease:         # all of it: keep one to prefill
    ...     lease.tokens
    3
    >>> with cache.lookup([5, 6, 7, 1, 1], usable=4) as lease:      # [7, 8] shares its first token
    ...     lease.tokens
    3
    >>> cache.queries, cache.hits
    (14, 10)
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from draftwise.errors import ConfigError

BLOCK_TOKENS = 16  # positions per block (vLLM's default); a sequence's last, shorter block is its tail
#: ``serve --prefix-cache-mb`` by default: ~23,000 positions of the default model in float32 (45 KiB
#: each), ~46,000 in bfloat16. Chosen by measurement (ShareGPT chat replayed by 16 users at once at
#: a 4,096-position context): hit rate 0.04 at 256 MiB, 0.09 at 512, 0.87 at 1,024 and beyond (tails cached);
#: docs/serving.md has the table and how it was measured
DEFAULT_PREFIX_CACHE_MB = 1024

#: ``read(start, end)``: the K/V of positions ``start .. end - 1``, ``[2 * layers, kv_heads, end - start, hd]``
Reader = Callable[[int, int], torch.Tensor]


@dataclass(eq=False)
class _Block:
    key: tuple[int, tuple[int, ...]]  # (the parent's id, -1 at position 0; this block's token ids)
    id: int
    kv: torch.Tensor  # [2 * layers, kv_heads, B, head_dim]: a view of the cache's pool
    nbytes: int
    slot: int  # its place in the pool
    refs: int = 0  # leases and inserts holding it: never evicted while > 0


@dataclass(eq=False)
class Lease:
    """The cached blocks a prompt starts with, pinned until :meth:`release` (or the ``with``
    block's end); ``tokens``: the positions to reuse (at most the blocks' and ``usable``)."""

    blocks: list[_Block]
    tokens: int
    _released: bool = field(default=False, repr=False)

    def pieces(self, skip: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
        """The K/V of positions ``skip .. tokens - 1`` block by block, without a copy: ``(start,
        kv)`` with ``kv`` ``[2 * layers, kv_heads, n, hd]`` for positions ``start .. start + n - 1``."""
        if self._released or not self.tokens:
            raise ConfigError("this lease was released or holds no tokens: take the K/V inside its with block")
        start = 0
        for b in self.blocks:
            n = min(b.kv.shape[2], self.tokens - start)
            if n <= 0:
                break
            if start + n > skip:
                cut = max(skip - start, 0)
                yield start + cut, b.kv[:, :, cut:n]
            start += n

    def runs(self, positions: int, skip: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
        """:meth:`pieces` (from position ``skip``) joined into runs of at most ``positions``
        positions (a block is never split): fewer, larger copies for a caller that writes each
        run to its own tensors, with a temporary of ``positions`` positions at most."""
        parts: list[torch.Tensor] = []
        start = held = 0
        for at, kv in self.pieces(skip):
            if parts and held + kv.shape[2] > positions:
                yield start, parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
                parts, held = [], 0
            if not parts:
                start = at
            parts.append(kv)
            held += kv.shape[2]
        if parts:
            yield start, parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    def kv(self) -> torch.Tensor:
        """The K/V of positions ``0 .. tokens - 1`` as one tensor (a copy where it spans blocks):
        ``[2 * layers, kv_heads, tokens, hd]``."""
        parts = [kv for _, kv in self.pieces()]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    def release(self) -> None:
        if not self._released:
            self._released = True
            for b in self.blocks:
                b.refs -= 1

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PrefixRuntime(Protocol):
    """A runtime that reuses prefixes (the native one and its engine slots, where
    ``reuses_prefixes``): ``reuse_prefix`` keeps the prefix of ``ids`` the sequence's cache holds
    already (an earlier sequence in the same slot, such as a chat's last turn), forgets the rest
    and copies the longest cached prefix of ``ids`` beyond it (all but the last token at most),
    returning the positions reused;
    ``prefill(ids, start=n)`` then runs ``ids[n:]``; ``save_prefix`` puts its blocks (and its tail)
    in ``cache``."""

    reuses_prefixes: bool

    def reuse_prefix(self, ids: Sequence[int], cache: PrefixCache) -> int: ...

    def prefill(self, ids: Sequence[int], *, start: int = 0) -> torch.Tensor: ...

    def save_prefix(self, cache: PrefixCache) -> int: ...


class PrefixCache:
    """Blocks of K/V keyed by their prefix, LRU-evicted under ``max_bytes`` (module docstring).

    One cache serves one runtime (the first to use it: :meth:`bind`), on the thread that runs it.
    ``queries`` and ``hits`` count prompt tokens looked up and reused (vLLM's
    ``prefix_cache_queries`` and ``prefix_cache_hits``)."""

    def __init__(self, max_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        for name, value, low in (("max_bytes", max_bytes, 0), ("block_tokens", block_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"PrefixCache {name}={value!r} must be a whole number >= {low}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self.bytes = 0
        self.queries = self.hits = self.evictions = 0
        self._blocks: OrderedDict[tuple[int, tuple[int, ...]], _Block] = OrderedDict()  # oldest use first
        self._kids: dict[int, list[_Block]] = {}  # by parent id (-1: the blocks at position 0)
        self._next_id = 0
        self._owner: weakref.ReferenceType[Any] | None = None
        # the blocks' storage: one tensor of max_bytes // block_bytes blocks, made on the first insert
        # (its pages are touched only as blocks fill them), and the places no block holds
        self._pool: torch.Tensor | None = None
        self._free: list[int] = []
        self._block_bytes = 0
        #: prompts being prefilled now (by ticket): a prompt that shares more with one of them than
        #: the cache holds waits for it (:meth:`in_flight`) instead of prefilling the same tokens
        self._prefilling: dict[int, tuple[int, ...]] = {}
        self._tickets = 0

    @classmethod
    def of_megabytes(cls, megabytes: int, **options: Any) -> PrefixCache | None:
        """A cache of ``megabytes`` MiB, or None for 0 (off); ConfigError below 0."""
        if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 0:
            raise ConfigError(f"prefix cache size {megabytes!r} MB must be a whole number >= 0 (0 turns it off)")
        return cls(megabytes << 20, **options) if megabytes else None

    def __len__(self) -> int:
        return len(self._blocks)

    def bind(self, owner: Any) -> None:
        """Tie the cache to the runtime whose K/V it holds; ConfigError for another one (its
        K/V would be another model's, or another layout)."""
        held = self._owner() if self._owner is not None else None
        if held is None:
            self._owner = weakref.ref(owner)
            if self._blocks:  # the runtime it held K/V for is gone
                self.clear()
        elif held is not owner:
            raise ConfigError("this prefix cache holds another runtime's K/V; give each model its own PrefixCache")

    def clear(self) -> None:
        """Drop every block not pinned by a lease (all of them, between generations); with none
        left, free the pool too."""
        for key in [k for k, b in self._blocks.items() if b.refs == 0]:
            self._drop(self._blocks[key])
        if not self._blocks:
            self._pool, self._free = None, []

    def _chain(self, ids: Sequence[int], usable: int) -> tuple[list[_Block], int, int]:
        """The cached blocks ``ids`` starts with, whole blocks below ``usable`` tokens: the chain,
        the last block's id (-1: none) and the tokens they hold."""
        B, chain, parent, start = self.block_tokens, [], -1, 0
        while start < usable and start + B <= len(ids):
            block = self._blocks.get((parent, tuple(ids[start : start + B])))
            if block is None:
                break
            chain.append(block)
            parent, start = block.id, start + B
        return chain, parent, start

    def cached(self, ids: Sequence[int]) -> int:
        """How many leading tokens of ``ids`` whole cached blocks hold (no pin, nothing counted)."""
        return self._chain(ids, len(ids))[2]

    def prefilling(self, ids: Sequence[int]) -> int:
        """Register ``ids`` as a prompt being prefilled now; returns its ticket (:meth:`done`)."""
        self._tickets += 1
        self._prefilling[self._tickets] = tuple(ids)
        return self._tickets

    def done(self, ticket: int) -> None:
        """The prompt of ``ticket`` is prefilled (its blocks are in the cache) or abandoned."""
        self._prefilling.pop(ticket, None)

    def in_flight(self, ids: Sequence[int]) -> bool:
        """Whether a prompt being prefilled shares at least two whole blocks more of ``ids`` than the
        cache holds: then waiting for it beats prefilling those tokens again."""
        if not self._prefilling:
            return False
        have, key = self.cached(ids), tuple(ids)
        for other in self._prefilling.values():
            shared = next((i for i, (a, b) in enumerate(zip(other, key)) if a != b), min(len(other), len(key)))
            shared = min(shared, len(key) - 1) // self.block_tokens * self.block_tokens  # whole blocks, one left
            if shared - have >= 2 * self.block_tokens:
                return True
        return False

    def lookup(self, ids: Sequence[int], usable: int, held: int = 0) -> Lease:
        """Pin the longest chain of cached blocks ``ids`` starts with, and after it the cached
        block that shares most of the next tokens (a prompt that ends inside a block, or leaves
        it); its lease reuses at most ``usable`` positions. Counts ``len(ids)`` tokens queried
        and as hits the lease's, or ``held`` where more: the positions the caller's slot holds
        already (a runtime's ``held_prefix``), reused without a copy."""
        B = self.block_tokens
        usable = max(0, min(usable, len(ids)))
        chain, parent, start = self._chain(ids, usable)
        tokens = min(start, usable)
        if tokens == start:  # the tokens after the chain may begin one of its cached children
            rest = list(ids[start : min(usable, start + B)])
            best, most = None, 0
            for kid in self._kids.get(parent, ()) if rest else ():
                shared = next((i for i, (a, b) in enumerate(zip(kid.key[1], rest)) if a != b),
                             min(len(kid.key[1]), len(rest)))
                if shared > most:
                    best, most = kid, shared
            if best is not None:
                chain.append(best)
                tokens += most
        for b in chain:
            b.refs += 1
        self._touch(chain)
        self.queries += len(ids)
        self.hits += max(tokens, min(held, usable))
        return Lease(chain, tokens)

    def insert(self, ids: Sequence[int], read: Reader, *, block_bytes: int, tail: bool = False) -> int:
        """Cache every full block of ``ids`` (the tokens at positions ``0 ..`` of a sequence whose
        K/V ``read`` gives; each block takes ``block_bytes``) that is not cached yet; return how
        many were added. Stops at the first block it cannot make room for.

        ``tail``: the positions after the last full block too, as a *tail* block of fewer tokens
        (a whole block's place): the end of a chat's answer, which its next turn starts with. A tail
        is only ever the block after a chain (nothing is cached after it), and one that another
        block of the same parent starts with is dropped (unpinned) or not added."""
        B, path, added = self.block_tokens, [], 0
        parent: _Block | None = None
        try:
            for start in range(0, len(ids), B):
                if start + B > len(ids) and not tail:
                    break
                key = (parent.id if parent is not None else -1, tuple(ids[start : start + B]))
                block = self._blocks.get(key) or self._covering(key)
                if block is None:
                    if not self._make_room(block_bytes):
                        break
                    block = self._add(key, read(start, start + len(key[1])), block_bytes)
                    added += 1
                self._drop_covered(block)
                block.refs += 1  # pinned while the chain grows: making room never takes its own parent
                path.append(block)
                parent = block
        finally:
            for b in path:
                b.refs -= 1
            self._touch(path)
        return added

    def _covering(self, key: tuple[int, tuple[int, ...]]) -> _Block | None:
        """For a tail's key (fewer than a block's tokens): a cached block of the same parent that
        starts with its tokens, which then holds its K/V already."""
        tokens = key[1]
        if len(tokens) == self.block_tokens:
            return None
        return next((b for b in self._kids.get(key[0], ()) if b.key[1][: len(tokens)] == tokens), None)

    def _add(self, key: tuple[int, tuple[int, ...]], kv: torch.Tensor, block_bytes: int) -> _Block:
        """A new block ``key`` holding ``kv`` (a tail's fills the start of its place)."""
        slot = self._place(kv, block_bytes)
        self._pool[slot][:, :, : kv.shape[2]].copy_(kv)  # type: ignore[index]  # _place made it
        block = _Block(key, self._next_id, self._pool[slot], block_bytes, slot)  # type: ignore[index]
        self._next_id += 1
        self._blocks[key] = block
        self._kids.setdefault(key[0], []).append(block)
        self.bytes += block_bytes
        return block

    def _drop_covered(self, block: _Block) -> None:
        """Drop the unpinned tails beside ``block`` (same parent) that it starts with: it holds their K/V."""
        tokens, kids = block.key[1], self._kids.get(block.key[0], ())
        for old in [b for b in kids if b.refs == 0 and len(b.key[1]) < len(tokens) and tokens[: len(b.key[1])] == b.key[1]]:
            self._drop(old)

    def _place(self, kv: torch.Tensor, block_bytes: int) -> int:
        """A free place in the pool for a block like ``kv`` (a tail's: of fewer positions; the pool
        is made on first use, and made again for another block layout once the cache is empty)."""
        pool, shape = self._pool, torch.Size((*kv.shape[:2], self.block_tokens, *kv.shape[3:]))
        if pool is None or pool.shape[1:] != shape or pool.dtype != kv.dtype or pool.device != kv.device \
                or block_bytes != self._block_bytes:
            if self._blocks:
                raise ConfigError(f"a block of shape {tuple(kv.shape)} ({kv.dtype}) does not fit this prefix cache's "
                                  "blocks; give each runtime its own PrefixCache")
            places = self.max_bytes // block_bytes  # _make_room keeps the blocks' bytes within max_bytes
            self._pool = torch.empty((places, *shape), dtype=kv.dtype, device=kv.device)
            self._free, self._block_bytes = list(range(places - 1, -1, -1)), block_bytes
        return self._free.pop()

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the pool the blocks live in (0 before the first insert): at most ``max_bytes``,
        and its memory becomes resident only as blocks fill it."""
        return 0 if self._pool is None else self._pool.numel() * self._pool.element_size()

    def _touch(self, chain: list[_Block]) -> None:
        """Mark ``chain`` used now, its leaf first: a parent stays more recent than its children."""
        for b in reversed(chain):
            self._blocks.move_to_end(b.key)

    def _make_room(self, nbytes: int) -> bool:
        """Evict least recently used blocks (unpinned, childless) until ``nbytes`` more fit."""
        if nbytes > self.max_bytes:
            return False
        while self.bytes + nbytes > self.max_bytes:
            victim = next((b for b in self._blocks.values() if b.refs == 0 and not self._kids.get(b.id)), None)
            if victim is None:
                return False
            self._drop(victim)
            self.evictions += 1
        return True

    def _drop(self, block: _Block) -> None:
        del self._blocks[block.key]
        self.bytes -= block.nbytes
        self._free.append(block.slot)
        siblings = self._kids[block.key[0]]
        siblings.remove(block)
        if not siblings:
            del self._kids[block.key[0]]
