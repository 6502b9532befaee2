"""A paged KV cache with prefix caching, modelled on vLLM v1's ``BlockPool`` and ``KVCacheManager``.

Data shapes:

* blocks are ints ``0 .. num_gpu_blocks-1``; block 0 is the null block (never allocated), as in vLLM, so
  usage is
  ``1 - free / (num_gpu_blocks - 1)``;
* ``_free``: the free queue, an ordered set of block ids; allocation pops the head (LRU), freeing appends
  to the
  tail (callers free a request's blocks in reverse order so its tail blocks are evicted first);
* ``_cached``: ``{block_hash: {block_id: None}}``, several blocks may hold the same hash;
* ``_hash_of``: ``{block_id: block_hash}`` for cached blocks; ``_ref``: per-block reference counts.

Evicting a cached block records a :class:`Removed`; caching a run of full blocks records one
:class:`StoredRun`;
a reset records :class:`Cleared`. The engine drains ``take_events()`` once per step.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm_sim.events import Cleared, EventRecord, Removed, StoredRun
from vllm_sim.hashing import BlockHash, block_extra_keys
from vllm_sim.request import SimRequest


class BlockPool:
    """Block allocation, reference counting, the prefix-cache map and LRU eviction."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool, record_events: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._record = record_events and enable_caching
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_gpu_blocks))
        self._ref = [0] * num_gpu_blocks
        self._hash_of: dict[int, BlockHash] = {}
        self._cached: dict[BlockHash, dict[int, None]] = {}
        self._events: list[EventRecord] = []

    # --- queries

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, cached or not)."""
        return len(self._free)

    def usage(self) -> float:
        """KV usage in [0, 1], as ``vllm:kv_cache_usage_perc`` reports it."""
        return 1.0 - len(self._free) / (self.num_gpu_blocks - 1)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """A block holding ``block_hash`` (the first one cached), or None."""
        blocks = self._cached.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def free_order(self) -> list[int]:
        """The free queue, head (next evicted) first. For tests."""
        return list(self._free)

    def take_events(self) -> list[EventRecord]:
        """Events recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    # --- mutations

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the free queue."""
        for b in block_ids:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their cached hashes. Caller checks space."""
        out: list[int] = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            self._evict(b)
            self._ref[b] = 1
            out.append(b)
        return out

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of.pop(block_id, None)
        if block_hash is None:
            return
        holders = self._cached[block_hash]
        del holders[block_id]
        if not holders:
            del self._cached[block_hash]
        if self._record:
            self._events.append(Removed(block_hash))

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference per block, in the given order; blocks reaching 0 go to the free queue's tail."""
        for b in block_ids:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def cache_full_blocks(self, req: SimRequest, num_full_blocks: int) -> None:
        """Register ``req``'s blocks ``[req.num_cached_blocks, num_full_blocks)`` under their hashes (one event)."""
        start = req.num_cached_blocks
        if not self.enable_caching or num_full_blocks <= start:
            return
        new_hashes = req.block_hashes[start:num_full_blocks]
        for block_id, block_hash in zip(req.block_ids[start:num_full_blocks], new_hashes, strict=True):
            self._hash_of[block_id] = block_hash
            self._cached.setdefault(block_hash, {})[block_id] = None
        req.num_cached_blocks = num_full_blocks
        if self._record:
            bs = self.block_size
            lora = req.lora
            self._events.append(
                StoredRun(
                    block_hashes=new_hashes,
                    parent_block_hash=req.block_hashes[start - 1] if start > 0 else None,
                    token_ids=req.all_token_ids[start * bs : num_full_blocks * bs],
                    block_size=bs,
                    lora_id=lora.int_id if lora else None,
                    lora_name=lora.name if lora else None,
                    extra_keys=[block_extra_keys(i, lora, req.cache_salt) for i in range(start, num_full_blocks)],
                )
            )

    def reset(self) -> bool:
        """Forget every cached hash; only when no block is in use (as vLLM). Returns whether it reset."""
        if len(self._free) != self.num_gpu_blocks - 1:
            return False
        self._hash_of.clear()
        self._cached.clear()
        if self._record:
            self._events.append(Cleared())
        return True


class KVCacheManager:
    """Per-request KV bookkeeping on top of a :class:`BlockPool` (vLLM's ``KVCacheManager``)."""

    def __init__(self, pool: BlockPool, max_model_len: int) -> None:
        self.pool = pool
        self.max_model_len = max_model_len

    def computed_blocks(self, req: SimRequest) -> list[int]:
        """The longest run of ``req``'s leading block hashes that is cached, never covering the last token."""
        if not self.pool.enable_caching:
            return []
        max_blocks = (req.num_tokens - 1) // self.pool.block_size
        hits: list[int] = []
        for block_hash in req.block_hashes[:max_blocks]:
            block_id = self.pool.cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate_slots(self, req: SimRequest, num_new_tokens: int, hit_blocks: list[int]) -> bool:
        """Reserve blocks for ``num_new_tokens`` more tokens after ``hit_blocks``; False when KV is short.

        On success, the hit blocks join the request (already cached, so not announced again) and every block
        that the scheduled tokens fill is cached, which records one ``StoredRun``.
        """
        pool, bs = self.pool, self.pool.block_size
        computed = req.num_computed_tokens + len(hit_blocks) * bs
        need_tokens = min(computed + num_new_tokens, self.max_model_len)
        need_blocks = -(-need_tokens // bs) - len(req.block_ids) - len(hit_blocks)
        evictable_hits = sum(1 for b in hit_blocks if pool.ref_count(b) == 0)
        if need_blocks > pool.num_free - evictable_hits:
            return False
        if hit_blocks:
            pool.touch(hit_blocks)
            req.block_ids.extend(hit_blocks)
            req.num_cached_blocks = len(req.block_ids)
        if need_blocks > 0:
            req.block_ids.extend(pool.allocate(need_blocks))
        pool.cache_full_blocks(req, min(computed + num_new_tokens, req.num_tokens) // bs)
        return True

    def free(self, req: SimRequest) -> None:
        """Release all of ``req``'s blocks, tail first, so its last blocks are evicted first."""
        self.pool.free(req.block_ids[::-1])
        req.block_ids = []
        req.num_cached_blocks = 0
