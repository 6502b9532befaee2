"""vLLM's KV-cache event wire format (msgpack), and nothing else.

The only module that knows vLLM's event encoding. The block pool produces neutral records
(:class:`StoredRun`, :class:`Removed`, :class:`Cleared`); :class:`EventEncoder` turns a step's records into
one ``KVEventBatch`` payload, byte-compatible with vLLM:

* vLLM ≥ 0.24 (default here, classes as in 0.33.0 ``vllm/distributed/kv_events.py``): each event is a
  msgpack map tagged under ``"type"``; ``BlockStored`` has 15 fields + tag, so msgspec writes a map16 header.
* vLLM ≤ 0.23 (``legacy=True``): each event is a positional array ``[tag, field, ...]`` with 11
  ``BlockStored`` fields and 3 ``BlockRemoved`` fields.

The batch is always ``[ts, events, data_parallel_rank]``. The structs mirror vLLM's field order and defaults
exactly, because msgspec's output (key order, omitted defaults, header widths) follows from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from vllm_sim.hashing import BlockHash, EventBlockHash, ExtraKeys, event_extra_keys, to_event_hash

MEDIUM_GPU = "GPU"
KV_CACHE_SPEC_KIND = "full_attention"


# --- neutral records produced by the block pool


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run of newly cached full blocks of one request (one ``BlockStored``)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    lora_name: str | None
    extra_keys: list[ExtraKeys]


@dataclass(frozen=True, slots=True)
class Removed:
    """One evicted cached block (one ``BlockRemoved``)."""

    block_hash: BlockHash


@dataclass(frozen=True, slots=True)
class Cleared:
    """The prefix cache was reset (``AllBlocksCleared``)."""


EventRecord = StoredRun | Removed | Cleared


# --- vLLM 0.33.0 classes (map form)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[EventBlockHash]
    parent_block_hash: EventBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[EventBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# --- vLLM 0.22/0.23 classes (array form)


class LegacyKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class LegacyBlockStored(LegacyKVCacheEvent, tag="BlockStored"):
    block_hashes: list[EventBlockHash]
    parent_block_hash: EventBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class LegacyBlockRemoved(LegacyKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[EventBlockHash]
    medium: str | None
    group_idx: int | None = None


class LegacyAllBlocksCleared(LegacyKVCacheEvent, tag="AllBlocksCleared"):
    pass


# --- encoding


class EventEncoder:
    """Turns a step's :data:`EventRecord` list into one msgpack ``KVEventBatch`` payload."""

    def __init__(self, use_int_hashes: bool = True, legacy: bool = False, group_idx: int = 0) -> None:
        self._use_int = use_int_hashes
        self._legacy = legacy
        self._group_idx = group_idx
        self._encoder = msgspec.msgpack.Encoder()

    def _hash(self, digest: BlockHash) -> EventBlockHash:
        return to_event_hash(digest, self._use_int)

    def _stored(self, rec: StoredRun) -> Any:
        cls = LegacyBlockStored if self._legacy else BlockStored
        return cls(
            block_hashes=[self._hash(h) for h in rec.block_hashes],
            parent_block_hash=None if rec.parent_block_hash is None else self._hash(rec.parent_block_hash),
            token_ids=rec.token_ids,
            block_size=rec.block_size,
            lora_id=rec.lora_id,
            medium=MEDIUM_GPU,
            lora_name=rec.lora_name,
            extra_keys=[event_extra_keys(k) for k in rec.extra_keys],
            group_idx=self._group_idx,
            kv_cache_spec_kind=KV_CACHE_SPEC_KIND,
        )

    def to_struct(self, rec: EventRecord) -> Any:
        """The vLLM event struct for one record (map form, or array form when ``legacy``)."""
        if isinstance(rec, StoredRun):
            return self._stored(rec)
        if isinstance(rec, Removed):
            cls = LegacyBlockRemoved if self._legacy else BlockRemoved
            return cls(block_hashes=[self._hash(rec.block_hash)], medium=MEDIUM_GPU, group_idx=self._group_idx)
        return LegacyAllBlocksCleared() if self._legacy else AllBlocksCleared()

    def encode_structs(self, events: list[Any], ts: float, rank: int = 0) -> bytes:
        """Encode already-built event structs as one batch ``[ts, events, rank]``."""
        return self._encoder.encode(KVEventBatch(ts=ts, events=events, data_parallel_rank=rank))

    def encode(self, records: list[EventRecord], ts: float, rank: int = 0) -> bytes:
        """Encode one step's records as a ``KVEventBatch`` payload."""
        return self.encode_structs([self.to_struct(r) for r in records], ts, rank)


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any] | list[Any]], int | None]:
    """Decode a payload generically (maps stay dicts, arrays stay lists); for tests and tooling."""
    ts, events, rank = msgspec.msgpack.decode(payload)
    return float(ts), list(events), rank
