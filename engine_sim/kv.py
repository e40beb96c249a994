"""KV cache: paged blocks (16 tokens, or the config's ``block_tokens``: 128 on vLLM's CPU build), a free queue with LRU
eviction, and automatic prefix caching.

Contracts (after vLLM V1's ``BlockPool`` and ``KVCacheManager``):

* A block is *free* when no request references it. Free blocks sit in an LRU queue; a free block may still
  hold a cached prefix (its hash stays registered) until it is handed out again, which evicts the hash.
* Only *full* blocks are cached. A block's hash chains its parent's hash and its block of token ids, so a hit on
  block k implies the whole prefix up to k matches. The first block's hash takes the request's ``cache_salt``
  (vLLM's extra key), so requests with different salts share no block.
* A lookup never covers the whole prompt: the last token is always recomputed (vLLM caps a hit at
  ``num_tokens - 1``), so a prompt that is an exact multiple of the block size loses its last cached block.
* Freed requests return their blocks tail first, so the end of a sequence is evicted before its shared head.
* ``usage`` counts referenced blocks: cached-but-free blocks are reusable capacity, as in vLLM's gauge.
* With KV events on (``BlockPool.events``, `engine_sim.kv_events`), every block that becomes cached is announced
  (``BlockStored``, with vLLM's block hashes from `engine_sim.block_hash`), every eviction of an announced block
  too (``BlockRemoved``), and a prefix-cache reset (``AllBlocksCleared``). A full block whose prefix is already
  cached by another block stays uncached here, so it is not announced either.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_sim.block_hash import chain_hashes
from engine_sim.kv_events import KVEventLog

__all__ = ["BLOCK_SIZE", "Block", "BlockPool", "KVCacheManager"]

BLOCK_SIZE = 16  # vLLM's default on a GPU; `engine_sim.config.build_scheduler` passes the configured size


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


class BlockPool:
    """``num_blocks`` blocks, a free LRU queue (evict from the front) and a hash -> block map."""

    events: KVEventLog | None = None  # set on an instance to record KV events (a class default: subclasses too)

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._free: OrderedDict[int, Block] = OrderedDict((i, Block(i)) for i in range(num_blocks))
        self._cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by a request (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, block_hash: int) -> Block | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cached blocks (removing free ones from the eviction queue)."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def allocate(self, count: int) -> list[Block]:
        """``count`` fresh blocks from the LRU end; evicts their cached hashes. Caller checks ``num_free``."""
        if count > len(self._free):
            raise RuntimeError(f"allocate({count}) with {len(self._free)} free blocks")
        out: list[Block] = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                    if self.events is not None:
                        self.events.removed(block.block_hash)
                block.block_hash = None
            block.ref_count = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference on each block, in the given order (the first becomes the first evicted)."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = block

    def reset_prefix_cache(self) -> None:
        """Forget the hash of every free block: no later request hits them (a level >= 1 sleep discards them)."""
        for block in self._free.values():
            if block.block_hash is not None and self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
        if self.events is not None:
            self.events.cleared()

    def register(self, block: Block, block_hash: int) -> bool:
        """Publish a full block's hash; False for a duplicate of an already-cached prefix (it stays unregistered)."""
        if self.enable_caching and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block
            return True
        return False


@dataclass
class _RequestKV:
    blocks: list[Block] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks seen so far
    digests: list[bytes] = field(default_factory=list)  # their vLLM hashes, computed only for KV events
    num_registered: int = 0  # leading blocks already published in the cache
    salt: str | None = None  # the request's cache_salt: the root of its chain


class KVCacheManager:
    """Per-request block tables over one `BlockPool`; all sizes in tokens unless named ``blocks``."""

    def __init__(self, pool: BlockPool, block_size: int = BLOCK_SIZE) -> None:
        self.pool = pool
        self.block_size = block_size
        self._requests: dict[str, _RequestKV] = {}

    def _state(self, request_id: str, cache_salt: str | None = None) -> _RequestKV:
        state = self._requests.get(request_id)
        if state is None:
            state = self._requests[request_id] = _RequestKV()
        if cache_salt is not None and state.salt != cache_salt:
            state.salt, state.hashes, state.digests = cache_salt, [], []
        return state

    def _hashes(self, state: _RequestKV, token_ids: Sequence[int], num_tokens: int | None = None) -> list[int]:
        """Chained hashes of the full blocks of ``token_ids[:num_tokens]`` (all of it by default)."""
        size = self.block_size
        limit = len(token_ids) if num_tokens is None else num_tokens
        for k in range(len(state.hashes), limit // size):
            parent = state.hashes[k - 1] if k else (hash(("cache_salt", state.salt)) if state.salt else 0)
            state.hashes.append(hash((parent, tuple(token_ids[k * size : (k + 1) * size]))))
        return state.hashes

    def computed_blocks(
        self, request_id: str, token_ids: Sequence[int], cache_salt: str | None = None
    ) -> tuple[list[Block], int]:
        """The longest cached prefix of full blocks (cached under ``cache_salt``), capped at ``len(token_ids) - 1``
        tokens: (blocks, tokens)."""
        if not self.pool.enable_caching:
            return [], 0
        hits: list[Block] = []
        max_blocks = (len(token_ids) - 1) // self.block_size
        for block_hash in self._hashes(self._state(request_id, cache_salt), token_ids)[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request_id: str, total_tokens: int, new_computed: Sequence[Block] = ()) -> bool:
        """Grow the request's table to hold ``total_tokens`` tokens; False (no change) when blocks run out.

        ``new_computed`` are prefix-cache hits taken by a request being admitted.
        """
        state = self._requests.get(request_id)
        if state is not None and not new_computed and total_tokens <= len(state.blocks) * self.block_size:
            return True  # the common decode step: the last block still has room
        if state is None:
            state = self._requests[request_id] = _RequestKV()
        have = len(state.blocks) + len(new_computed)
        need = -(-total_tokens // self.block_size) - have
        reclaimable = sum(1 for b in new_computed if b.ref_count == 0)
        if need > self.pool.num_free - reclaimable:
            return False
        if new_computed:
            self.pool.touch(new_computed)
            state.blocks.extend(new_computed)
            state.num_registered = len(state.blocks)
        if need > 0:
            state.blocks.extend(self.pool.allocate(need))
        return True

    def cache_computed(
        self, request_id: str, token_ids: Sequence[int], num_computed: int, cache_salt: str | None = None
    ) -> None:
        """Publish the request's blocks that became full with computed tokens."""
        state = self._requests.get(request_id)
        if state is None or not self.pool.enable_caching:
            return
        if cache_salt is not None and state.salt != cache_salt:
            state = self._state(request_id, cache_salt)
        full = min(num_computed // self.block_size, len(state.blocks))
        if full <= state.num_registered:
            return  # no block became full: nothing to hash (most steps; slicing ``token_ids`` would cost more)
        hashes = self._hashes(state, token_ids, full * self.block_size)
        events = self.pool.events
        first = state.num_registered
        registered = [self.pool.register(state.blocks[k], hashes[k]) for k in range(first, full)]
        if events is not None:
            self._announce(events, state, token_ids, first, registered)
        state.num_registered = max(state.num_registered, full)

    def _announce(
        self, events: KVEventLog, state: _RequestKV, token_ids: Sequence[int], first: int, registered: list[bool]
    ) -> None:
        """One ``BlockStored`` per run of consecutive blocks that ``cache_computed`` registered from ``first`` on."""
        size = self.block_size
        tokens = token_ids[: (first + len(registered)) * size]
        digests = chain_hashes(events.root, tokens, size, state.digests, state.salt)
        k = first
        while k < first + len(registered):
            if not registered[k - first]:
                k += 1
                continue
            end = k
            while end < first + len(registered) and registered[end - first]:
                end += 1
            parent = digests[k - 1] if k else None
            run = list(token_ids[k * size : end * size])
            events.stored(state.hashes[k:end], digests[k:end], parent, run, state.salt)
            k = end

    def cached_prefix_tokens(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """The tokens of ``token_ids`` a request would find cached now (`computed_blocks`' count), changing nothing."""
        if not self.pool.enable_caching:
            return 0
        hits = 0
        for block_hash in self._hashes(_RequestKV(salt=cache_salt), token_ids)[
            : (len(token_ids) - 1) // self.block_size
        ]:
            if self.pool.lookup(block_hash) is None:
                break
            hits += 1
        return hits * self.block_size

    def detach(self, request_id: str) -> list[Block]:
        """Drop the request's bookkeeping but keep its references: the caller owns the blocks until it hands them
        to ``pool.release`` (a prefill leg's blocks held for a decode engine's pull, `engine_sim.nixl`)."""
        state = self._requests.pop(request_id, None)
        return [] if state is None else state.blocks

    def free(self, request_id: str) -> None:
        """Release all of the request's blocks, tail first; its hashes are kept for a later readmission."""
        state = self._requests.get(request_id)
        if state is None:
            return
        self.pool.release(list(reversed(state.blocks)))
        state.blocks = []
        state.num_registered = 0

    def forget(self, request_id: str) -> None:
        """Free the request and drop its bookkeeping (finished or aborted)."""
        self.free(request_id)
        self._requests.pop(request_id, None)

    def num_blocks_of(self, request_id: str) -> int:
        state = self._requests.get(request_id)
        return 0 if state is None else len(state.blocks)
