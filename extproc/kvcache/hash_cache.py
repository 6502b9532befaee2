"""Block hashes of token prefixes seen before: a repeat prompt hashes only its new blocks.

A prompt's blocks are grouped in fixed *chunks* of ``CHUNK_BLOCKS`` blocks from its start. A chunk's hashes
depend on exactly two things: the chain digest before it (which covers every earlier token, the seed and the
first block's extra keys) and its own tokens (with the later blocks' extra keys). So a chunk is cached under
``(parent digest, extra keys, token bytes)`` and a new prompt walks its chunks, reusing each one it finds and
hashing from the first it does not. Cost per cached chunk: one slice to bytes and one dict lookup (the bytes'
hash is linear in their length), so the whole walk is linear in the prompt and ~20x cheaper than hashing it.
A prompt that shares a prefix with a cached one re-hashes at most one chunk before it diverges.

Tokens are compared as 4-byte unsigned ints (``array('I')``); a prompt whose ids do not fit (a client's odd
token-id prompt) is hashed directly. Bounded by ``max_bytes`` (least recently used chunks go first);
thread-safe (one lock around the dict; hashing itself runs outside it).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.kvcache.hashing import BlockDigest, BlockHasher, ExtraKeys, extra_keys_for
from extproc.types import BlockHash, LoraAdapter

__all__ = ["CHUNK_BLOCKS", "CachedHasher", "HashCacheStats", "PendingHashes"]

CHUNK_BLOCKS = 32
"""Blocks per cached chunk: 512 tokens at block size 16 (a miss re-hashes at most this many, ~80 us)."""

_ENTRY_OVERHEAD_BYTES = 200  # dict slot, key tuple, list headers: a rough per-chunk cost beyond the payload


@dataclass(frozen=True, slots=True)
class _Chunk:
    hashes: tuple[BlockHash, ...]
    last: BlockDigest  # the chain digest after the chunk: the next chunk's parent
    size_bytes: int


@dataclass
class HashCacheStats:
    """Counters since start (blocks reused from the cache vs hashed), and the cache's current size."""

    hit_blocks: int = 0
    miss_blocks: int = 0
    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class PendingHashes:
    """What ``CachedHasher.start`` found: the cached leading hashes and the blocks still to hash."""

    known: list[BlockHash]
    missing_blocks: int
    _tokens: Sequence[int]
    _parent: BlockDigest | None  # the chain digest after ``known`` (None: nothing known yet)
    _extra: tuple[ExtraKeys, ExtraKeys]
    _lora: LoraAdapter | None
    _salt: str | None
    _packed: array[int] | None  # the tokens as array('I'), or None when they do not fit (no caching)


class CachedHasher:
    """``BlockHasher`` with a chunk cache; same answers as ``hasher.hash_blocks`` for every input.

    Use ``hash_blocks`` in one call, or ``start`` (cheap: lookups only) then ``finish`` (hashes what is
    missing) to decide between the two where the hashing should run.
    """

    def __init__(self, hasher: BlockHasher, *, max_bytes: int = 64 << 20) -> None:
        self.hasher = hasher
        self._max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[bytes, ExtraKeys, bytes], _Chunk] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = HashCacheStats()

    def hash_blocks(
        self, tokens: Sequence[int], *, lora: LoraAdapter | None = None, cache_salt: str | None = None
    ) -> list[BlockHash]:
        """The event-form keys of every full block of ``tokens`` (as ``BlockHasher.hash_blocks``)."""
        return self.finish(self.start(tokens, lora=lora, cache_salt=cache_salt))

    def start(
        self, tokens: Sequence[int], *, lora: LoraAdapter | None = None, cache_salt: str | None = None
    ) -> PendingHashes:
        """Look the prompt's chunks up (no hashing). Cost: linear in the cached prefix, ~1 us per chunk."""
        size = self.hasher.scheme.block_size
        count = len(tokens) // size
        extra = extra_keys_for(lora, cache_salt)
        packed = _pack(tokens) if self._max_bytes > 0 else None
        known: list[BlockHash] = []
        parent: BlockDigest | None = None
        if packed is not None:
            step = CHUNK_BLOCKS * size
            root = self.hasher.none_hash()
            with self._lock:
                for start in range(0, count * size, step):
                    stop = min(start + step, count * size)
                    key = (parent or root, extra[1 if start else 0], packed[start:stop].tobytes())
                    chunk = self._chunks.get(key)
                    if chunk is None:
                        break
                    self._chunks.move_to_end(key)
                    known += chunk.hashes
                    parent = chunk.last
        return PendingHashes(known, count - len(known), tokens, parent, extra, lora, cache_salt, packed)

    def finish(self, pending: PendingHashes) -> list[BlockHash]:
        """Hash the missing blocks, cache their chunks, and return every block's key."""
        size = self.hasher.scheme.block_size
        self.stats.hit_blocks += len(pending.known)
        self.stats.miss_blocks += pending.missing_blocks
        if pending.missing_blocks == 0:
            return pending.known
        done = len(pending.known)
        tokens = pending._tokens[done * size : (done + pending.missing_blocks) * size]
        digests = self.hasher.hash_digests_from(
            tokens, parent=pending._parent, lora=pending._lora, cache_salt=pending._salt, first_block=done == 0
        )
        fresh = [BlockHash(int.from_bytes(d[-8:], "big")) for d in digests]
        if pending._packed is not None:
            self._store(pending, done, fresh, digests)
        return pending.known + fresh

    def _store(self, pending: PendingHashes, done: int, fresh: list[BlockHash], digests: list[BlockDigest]) -> None:
        size = self.hasher.scheme.block_size
        packed = pending._packed
        assert packed is not None
        parent = pending._parent or self.hasher.none_hash()
        with self._lock:
            for i in range(0, len(fresh), CHUNK_BLOCKS):
                first = done + i
                if first % CHUNK_BLOCKS:  # only chunks aligned to the prompt's start are ever looked up
                    break
                n = min(CHUNK_BLOCKS, len(fresh) - i)
                data = packed[first * size : (first + n) * size].tobytes()
                chunk = _Chunk(tuple(fresh[i : i + n]), digests[i + n - 1], len(data) + 40 * n + _ENTRY_OVERHEAD_BYTES)
                key = (parent, pending._extra[1 if first else 0], data)
                old = self._chunks.pop(key, None)
                if old is not None:
                    self.stats.bytes -= old.size_bytes
                self._chunks[key] = chunk
                self.stats.bytes += chunk.size_bytes
                parent = chunk.last
            while self.stats.bytes > self._max_bytes and self._chunks:
                _, evicted = self._chunks.popitem(last=False)
                self.stats.bytes -= evicted.size_bytes
            self.stats.entries = len(self._chunks)


def _pack(tokens: Sequence[int]) -> array[int] | None:
    """``tokens`` as array('I') (the fast encoder's own type passes through), or None if an id does not fit."""
    if isinstance(tokens, array) and tokens.typecode == "I":
        return tokens
    if not all(type(t) is int for t in tokens):  # a bool packs like 1 but hashes differently: never cache it
        return None
    try:
        return array("I", tokens)
    except (OverflowError, TypeError):
        return None
