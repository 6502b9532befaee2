"""Block hashes of token prefixes seen before: a repeat prompt hashes only its new blocks.

A prompt's blocks are grouped in fixed *chunks* of ``CHUNK_BLOCKS`` blocks from its start. A chunk's hashes
depend on exactly two things: the chain digest before it (which covers every earlier token, the seed and the
first block's extra keys) and its own tokens (with the later blocks' extra keys). So a chunk is cached under
``(parent digest, extra keys, token bytes)`` and a new prompt walks its chunks, reusing each one it finds and
hashing from the first it does not. Cost per cached chunk: one slice to bytes and one dict lookup (the bytes'
hash is linear in their length), so the whole walk is linear in the prompt and ~20x cheaper than hashing it.
A prompt that shares a prefix with a cached one re-hashes at most one chunk before it diverges.

A long prompt (``RECALL_MIN_CHUNKS`` chunks or more) is also remembered whole: its tokens, every block's hash and
the chain digest after each chunk, filed under its first chunk. A new prompt with the same first chunk is
compared with those (numpy, a few memory compares, no hashing of the bytes) and takes the whole chunks it
shares with the closest one in one step; the chunk walk goes on from there. So a 100K-token agent context that
grew by a turn costs ~0.1 ms here instead of a walk of 200 chunks (~0.6 ms). A prompt is remembered when it
hashed ``_RECALL_NEW_CHUNKS`` chunks or more (a document asked again with a new question at its end is not: the
document is remembered already), and replaces the remembered prompt it extends: a growing conversation is one
entry.

Tokens are compared as 4-byte unsigned ints (``array('I')``); a prompt whose ids do not fit (a client's odd
token-id prompt) is hashed directly. Bounded by ``max_bytes`` (least recently used chunks and prompts go first;
prompts get a quarter of it); thread-safe (one lock around the dicts; hashing itself runs outside it).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from extproc.keyed_lru import KeyedLru
from extproc.kvcache.hashing import BlockDigest, BlockHasher, ExtraKeys, extra_keys_for
from extproc.types import BlockHash, LoraAdapter

__all__ = ["CHUNK_BLOCKS", "CachedHasher", "HashCacheStats", "PendingHashes"]

CHUNK_BLOCKS = 32
"""Blocks per cached chunk: 512 tokens at block size 16 (a miss re-hashes at most this many, ~80 us)."""

_ENTRY_OVERHEAD_BYTES = 200  # dict slot, key tuple, list headers: a rough per-chunk cost beyond the payload
RECALL_MIN_CHUNKS = 4
"""Prompts of at least this many whole chunks (2K tokens at block size 16) are remembered whole."""
_RECALL_PER_HEAD = 32  # remembered prompts per first chunk: concurrent sessions sharing tool definitions
_RECALL_SCAN = 8  # of those, compared with a new prompt (most recently used first)
_RECALL_NEW_CHUNKS = 2  # a prompt is remembered when it hashed this many chunks or more (a repeat with a new
# question at its end hashes one: the document it repeats is remembered already)
_HASH_ENTRY_BYTES = 48  # a remembered block hash: list slot + int object
_FIRST_COMPARE_TOKENS = 2048  # the first token compare; each next one is 4x longer (a miss stops early)

_HeadKey = tuple[ExtraKeys, ExtraKeys, bytes]  # (first block's extra keys, the others', first chunk's tokens)


@dataclass(frozen=True, slots=True)
class _Chunk:
    hashes: tuple[BlockHash, ...]
    last: BlockDigest  # the chain digest after the chunk: the next chunk's parent
    size_bytes: int


@dataclass(eq=False)
class _Prompt:
    """A remembered prompt: its whole blocks' tokens, their hashes, the chain digest after each whole chunk."""

    tokens: np.ndarray[tuple[int], np.dtype[np.uint32]]
    hashes: list[BlockHash]
    chunk_last: list[BlockDigest]
    size_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.size_bytes = self.tokens.nbytes + _HASH_ENTRY_BYTES * len(self.hashes) + 80 * len(self.chunk_last)


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
    _chunk_last: list[BlockDigest] = field(default_factory=list)  # the chain digest after each known chunk
    _recalled: _Prompt | None = None  # the remembered prompt ``known`` began with
    _extends: bool = False  # that prompt is a prefix of this one (this one replaces it)
    _covered: bool = False  # this one is a prefix of that prompt (nothing to remember)


class CachedHasher:
    """``BlockHasher`` with a chunk cache; same answers as ``hasher.hash_blocks`` for every input.

    Use ``hash_blocks`` in one call, or ``start`` (cheap: lookups only) then ``finish`` (hashes what is
    missing) to decide between the two where the hashing should run.
    """

    def __init__(self, hasher: BlockHasher, *, max_bytes: int = 64 << 20) -> None:
        self.hasher = hasher
        self._max_bytes = max_bytes
        self._chunks: OrderedDict[tuple[bytes, ExtraKeys, bytes], _Chunk] = OrderedDict()
        self._chunk_bytes = 0
        prompt_budget = max_bytes // 4  # whole long prompts; the chunks get the rest
        self._chunk_budget = max_bytes - prompt_budget
        self._prompts: KeyedLru[_HeadKey, _Prompt] = KeyedLru(prompt_budget, _RECALL_PER_HEAD)
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
        """Look the prompt up (no hashing): a remembered prompt it shares whole chunks with, then the chunk cache.
        Cost: a few memory compares for a remembered prefix, ~1 us per chunk walked."""
        size = self.hasher.scheme.block_size
        count = len(tokens) // size
        extra = extra_keys_for(lora, cache_salt)
        packed = _pack(tokens) if self._max_bytes > 0 else None
        if packed is None:
            return PendingHashes([], count, tokens, None, extra, lora, cache_salt, None)
        step = CHUNK_BLOCKS * size
        with self._lock:
            recalled, shared = self._recall(packed, count, size, extra)
            chunks = shared // size // CHUNK_BLOCKS
            known = recalled.hashes[: chunks * CHUNK_BLOCKS] if recalled is not None else []
            chunk_last = recalled.chunk_last[:chunks] if recalled is not None else []
            parent = chunk_last[-1] if chunk_last else None
            root = self.hasher.none_hash()
            for start in range(chunks * step, count * size, step):
                stop = min(start + step, count * size)
                key = (parent or root, extra[1 if start else 0], packed[start:stop].tobytes())
                chunk = self._chunks.get(key)
                if chunk is None:
                    break
                self._chunks.move_to_end(key)
                known += chunk.hashes
                parent = chunk.last
                chunk_last.append(chunk.last)
        extends = recalled is not None and shared == len(recalled.tokens)
        covered = shared == count * size
        return PendingHashes(known, count - len(known), tokens, parent, extra, lora, cache_salt, packed, chunk_last,
                             recalled, extends, covered)  # fmt: skip

    def finish(self, pending: PendingHashes) -> list[BlockHash]:
        """Hash the missing blocks, cache their chunks (and the prompt, if long), and return every block's key."""
        size = self.hasher.scheme.block_size
        self.stats.hit_blocks += len(pending.known)
        self.stats.miss_blocks += pending.missing_blocks
        if pending.missing_blocks == 0:
            if not (pending._extends or pending._covered):  # known from chunks alone: remember it whole
                self._remember(pending, pending.known, pending._chunk_last)
            return pending.known
        done = len(pending.known)
        tokens = pending._tokens[done * size : (done + pending.missing_blocks) * size]
        digests = self.hasher.hash_digests_from(
            tokens, parent=pending._parent, lora=pending._lora, cache_salt=pending._salt, first_block=done == 0
        )
        fresh = [BlockHash(int.from_bytes(d[-8:], "big")) for d in digests]
        if pending._packed is not None:
            self._store(pending, done, fresh, digests)
            if len(fresh) >= _RECALL_NEW_CHUNKS * CHUNK_BLOCKS:  # else what it adds is cheap to walk or hash again
                # done is a whole number of chunks: fresh chunk j ends at digest (j + 1) * CHUNK_BLOCKS - 1
                ends = digests[CHUNK_BLOCKS - 1 :: CHUNK_BLOCKS]
                self._remember(pending, pending.known + fresh, pending._chunk_last + ends)
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
                    self._chunk_bytes -= old.size_bytes
                self._chunks[key] = chunk
                self._chunk_bytes += chunk.size_bytes
                parent = chunk.last
            while self._chunk_bytes > self._chunk_budget and self._chunks:
                _, evicted = self._chunks.popitem(last=False)
                self._chunk_bytes -= evicted.size_bytes
            self.stats.entries = len(self._chunks)
            self.stats.bytes = self._chunk_bytes + self._prompts.bytes

    def _recall(
        self, packed: array[int], count: int, size: int, extra: tuple[ExtraKeys, ExtraKeys]
    ) -> tuple[_Prompt | None, int]:
        """The remembered prompt sharing the longest prefix with this one's whole blocks (among those filed under
        the same first chunk), and how many tokens they share. Under the lock."""
        if count < RECALL_MIN_CHUNKS * CHUNK_BLOCKS:
            return None, 0
        same_head = self._prompts.under((*extra, packed[: CHUNK_BLOCKS * size].tobytes()))
        if not same_head:
            return None, 0
        ours = np.frombuffer(packed, dtype=np.uint32, count=count * size)
        best, shared = same_head[0], -1
        for prompt in same_head[:_RECALL_SCAN]:
            n = _common_prefix(ours, prompt.tokens)
            if n > shared:
                best, shared = prompt, n
            if n == len(ours):
                break
        self._prompts.used(best)
        return best, shared

    def _remember(self, pending: PendingHashes, hashes: list[BlockHash], chunk_last: list[BlockDigest]) -> None:
        """File a long prompt under its first chunk, replacing the remembered one it extends."""
        packed, size = pending._packed, self.hasher.scheme.block_size
        if packed is None or len(hashes) < RECALL_MIN_CHUNKS * CHUNK_BLOCKS:
            return
        tokens = np.frombuffer(packed, dtype=np.uint32, count=len(hashes) * size).copy()
        head = (*pending._extra, packed[: CHUNK_BLOCKS * size].tobytes())
        prompt = _Prompt(tokens, hashes, chunk_last)
        with self._lock:
            replaced = pending._recalled if pending._extends else None
            self._prompts.add(head, prompt, prompt.size_bytes, replaces=replaced)
            self.stats.bytes = self._chunk_bytes + self._prompts.bytes


def _common_prefix(
    ours: np.ndarray[tuple[int], np.dtype[np.uint32]], theirs: np.ndarray[tuple[int], np.dtype[np.uint32]]
) -> int:
    """How many leading tokens the two share: compares of growing length, so a prompt that differs early costs
    one short compare."""
    n = min(len(ours), len(theirs))
    at, length = 0, _FIRST_COMPARE_TOKENS
    while at < n:
        stop = min(n, at + length)
        differ = np.flatnonzero(ours[at:stop] != theirs[at:stop])
        if differ.size:
            return at + int(differ[0])
        at, length = stop, length * 4
    return n


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
