"""vLLM KV-cache events: the one module that knows their msgpack encoding and ZMQ framing.

Wire facts (see ``shared/vllm/SPEC.md`` §1):

* PUB message: ``[topic (utf-8), seq (8-byte big-endian unsigned), payload]``.
* Payload: a msgpack array ``[ts, events, data_parallel_rank]`` (vLLM 0.9 sends ``[ts, events]``).
* Each event is a **map** keyed by field name with the tag under ``"type"`` (vLLM >= 0.24), or a positional
  **array** ``[tag, field1, ...]`` (vLLM <= 0.23; older releases send a prefix of the field list).
* Block hashes are ints (the digest's low 64 bits) or raw digests as ``bin`` (last 8 bytes, big-endian, are
  the same value); both normalise to an ``EngineBlockHash`` in ``[0, 2**64)``.
* Replay (ROUTER, from a DEALER): request ``[b"", start_seq8]``; replies ``[b"", topic, seq8, payload]``
  (>= 0.26) or ``[b"", seq8, payload]`` (<= 0.25); the end marker has seq ``ff*8`` and an empty payload.

Everything else in the router sees only the frozen types below. ``decode_batch`` and the frame parsers raise
``EventDecodeError`` and nothing else for any malformed input; events with an unknown tag are skipped and
counted in ``EventBatch.unknown_events``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from extproc.types import EngineBlockHash

MASK64 = 2**64 - 1
END_SEQ = MASK64  # ff*8: the replay end marker's sequence number


class EventDecodeError(ValueError):
    """A payload or frame set that is not a well-formed vLLM KV-event message."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks newly cached on an engine, in prefix order; ``parent`` is the block before the first."""

    block_hashes: tuple[EngineBlockHash, ...]
    parent: EngineBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    extra_keys: tuple[object, ...] | None = None  # one entry per block: None or a tuple of untagged keys
    group_idx: int | None = None
    kind: str | None = None  # kv_cache_spec_kind, e.g. "full_attention"
    lookahead: bool = False  # EAGLE lookahead hashing covered tokens beyond each block (>= 0.33)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks an engine evicted (vLLM core sends one hash per event)."""

    block_hashes: tuple[EngineBlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine reset its prefix cache: it holds nothing any more."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One scheduler step's events, in order. ``unknown_events`` counts skipped events with unknown tags."""

    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None
    unknown_events: int = 0


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One replayed batch; ``topic`` is None for the <= 0.25 reply form, which has none."""

    seq: int
    payload: bytes
    topic: str | None


# -- wire schemas (private) ----------------------------------------------------------------------------------

_Hash = int | bytes


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Stored(msgspec.Struct):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_name: str | None = None
    medium: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    lookahead_token_ids: list[Any] | None = None


class _Removed(msgspec.Struct):
    block_hashes: list[_Hash]
    medium: str | None = None
    group_idx: int | None = None


# Positional (<= 0.23) layouts after the tag, and how many leading fields a sender must include.
_STORED_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
)  # fmt: skip
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_POSITIONAL: dict[str, tuple[tuple[str, ...], int]] = {
    "BlockStored": (_STORED_FIELDS, 4),
    "BlockRemoved": (_REMOVED_FIELDS, 1),
    "AllBlocksCleared": ((), 0),
}

_decoder = msgspec.msgpack.Decoder(_Batch)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one PUB payload (frame 3) in either event form. Raises ``EventDecodeError`` only."""
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise EventDecodeError(f"bad event batch: {exc}") from None
    events: list[KvEvent] = []
    unknown = 0
    for i, item in enumerate(raw.events):
        try:
            event = _decode_event(item)
        except (msgspec.ValidationError, TypeError, ValueError, RecursionError) as exc:
            raise EventDecodeError(f"bad event #{i}: {exc}") from None
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return EventBatch(ts=raw.ts, events=tuple(events), dp_rank=raw.data_parallel_rank, unknown_events=unknown)


def parse_frames(frames: Sequence[bytes]) -> tuple[str, int, bytes]:
    """Split a PUB message into ``(topic, seq, payload)``; exactly 3 frames and an 8-byte seq are required."""
    if len(frames) != 3:
        raise EventDecodeError(f"expected 3 frames, got {len(frames)}")
    topic, seq8, payload = frames
    return _topic(topic), _seq(seq8), bytes(payload)


def replay_request(start_seq: int) -> list[bytes]:
    """The frames a DEALER sends to ask a publisher's ROUTER for every buffered batch from ``start_seq``."""
    if not 0 <= start_seq < END_SEQ:
        raise ValueError(f"start_seq out of range: {start_seq}")
    return [b"", start_seq.to_bytes(8, "big")]


def parse_replay_reply(frames: Sequence[bytes]) -> ReplayItem | None:
    """One replay reply as a DEALER receives it; ``None`` for the end marker (seq ff*8 or empty payload)."""
    if len(frames) == 4 and frames[0] == b"":
        topic: str | None = _topic(frames[1])
        seq8, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        topic, seq8, payload = None, frames[1], frames[2]
    else:
        raise EventDecodeError(f"bad replay reply: {len(frames)} frames")
    seq = _seq(seq8)
    if seq == END_SEQ or not payload:
        return None
    return ReplayItem(seq=seq, payload=bytes(payload), topic=topic)


# -- internals -----------------------------------------------------------------------------------------------


def _topic(frame: bytes) -> str:
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise EventDecodeError("topic is not utf-8") from None


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise EventDecodeError(f"sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def _decode_event(item: Any) -> KvEvent | None:
    """One event (a decoded map or positional array) → our type; ``None`` for an unknown tag."""
    if isinstance(item, dict):
        tag = item.get("type")
        fields: dict[str, Any] = item
    elif isinstance(item, list) and item:
        tag = item[0]
        layout = _POSITIONAL.get(tag) if isinstance(tag, str) else None
        if layout is None:
            _check_tag(tag)
            return None
        names, required = layout
        if len(item) - 1 < required:
            raise ValueError(f"{tag}: {len(item) - 1} positional fields, need at least {required}")
        fields = dict(zip(names, item[1:], strict=False))
    else:
        raise ValueError(f"event is neither a map nor a non-empty array: {type(item).__name__}")
    if tag == "BlockStored":
        return _stored(msgspec.convert(fields, _Stored))
    if tag == "BlockRemoved":
        removed = msgspec.convert(fields, _Removed)
        return BlockRemoved(_hashes(removed.block_hashes), removed.medium, removed.group_idx)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    _check_tag(tag)
    return None


def _check_tag(tag: object) -> None:
    """An unknown but well-formed tag is skipped; a non-string tag means the event is garbage."""
    if not isinstance(tag, str):
        raise ValueError(f"event tag must be a string, got {type(tag).__name__}")
    return None


def _stored(s: _Stored) -> BlockStored:
    return BlockStored(
        block_hashes=_hashes(s.block_hashes),
        parent=None if s.parent_block_hash is None else _hash(s.parent_block_hash),
        token_ids=tuple(s.token_ids),
        block_size=s.block_size,
        lora_name=s.lora_name,
        medium=s.medium,
        extra_keys=None if s.extra_keys is None else tuple(_freeze(k) for k in s.extra_keys),
        group_idx=s.group_idx,
        kind=s.kv_cache_spec_kind,
        lookahead=bool(s.lookahead_token_ids),
    )


def _hashes(values: list[_Hash]) -> tuple[EngineBlockHash, ...]:
    return tuple(_hash(v) for v in values)


def _hash(value: _Hash) -> EngineBlockHash:
    """int → low 64 bits; bytes (a raw digest) → its last 8 bytes, big-endian."""
    if isinstance(value, int):
        return EngineBlockHash(value & MASK64)
    if not value:
        raise ValueError("empty bytes block hash")
    return EngineBlockHash(int.from_bytes(value[-8:], "big"))


def _freeze(value: object) -> object:
    """Lists (msgpack arrays) → tuples, recursively, so events stay immutable and hashable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
