"""Where every replica routed, told to the others through Redis: the hot sets' view of the whole fleet.

Cold placement puts a new prefix where the fewest hot blocks are (``scheduling.profiles``), and a copy is
bounded by them: both read ``backends.hot_blocks``, which counts what this replica routed. Two replicas
each counted half the traffic, and one replica's fresh placements were invisible to the other, so a burst of
new prefixes split unevenly across the fleet where one replica spreads them (``docs/scheduling.md``,
"Replicas as one"). Each replica now publishes its ``Touch`` per routed request and applies the others'
(``HotBlocks.heard``), so every replica's hot sets count the whole fleet's traffic.

A Redis STREAM, not pub/sub: it works on a Redis Cluster (one key, one slot), and a reader resumes from the
last entry it read after a short outage. Best effort throughout: a touch is a hint that only sharpens
placement, so a write that fails or a reader that falls behind the trimmed stream loses touches (counted)
and never holds up a decision. ``publish`` is synchronous and cheap; the touches of one event-loop turn go
out as one entry (one XADD).

The same entries carry each replica's TTFT predictions (``Prediction``, ``publish_prediction``) when the
replicas share them (``index.share_predictions``): every replica's calibration then pairs an engine's first tokens
with all the requests routed there, not only its own (``backends.calibration``). Also best effort: a lost
prediction leaves that replica's pairing one off until the request is abandoned (``ABANDONED_S``).

And each routed call whose chain's next call is expected (``DueCall``, ``publish_due_call``) when the replicas
share them (``index.share_due_calls``): every replica's due calls (``scheduling.due_calls``) then know the calls
due on every endpoint, not only those of the chains it routed. A lost one leaves a call unknown to the others.

Entry field ``t``, our own encoding (big-endian), always present (with no touches when only predictions go)::

    replica (8 bytes), touches (u32), then per touch:
    endpoint length (u16), hit_blocks (u32), stored_blocks (u32), path length (u32), endpoint (utf-8),
    path (u64 each)

Entry field ``p``, only when the entry carries predictions (a replica that predates it ignores it)::

    predictions (u32), then per prediction:
    endpoint length (u16), ttft_s (f64), fixed_s (f64), features (u8), endpoint (utf-8), features (f64 each)

Entry field ``d``, only when the entry carries due calls (ignored likewise); NaN: ``after_s`` is None::

    calls (u32), then per call:
    endpoint length (u16), block (u64), blocks (u32), first_token_in_s (f64), after_s (f64), continues (u8: 0 or
    1), endpoint (utf-8), then the block it continues (u64) when that is 1
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import RedisClusterException, RedisError

from extproc.redis.client import RedisClient, call_within, client_for
from extproc.redis.schema import Schema, pack_hashes, unpack_hashes
from extproc.tasks import stop_task
from extproc.types import BlockHash, DueCall, EndpointId, Prediction, Touch

log = logging.getLogger(__name__)

_FIELD = b"t"
_PREDICTIONS_FIELD = b"p"
_HEAD = struct.Struct(">8sI")
_TOUCH = struct.Struct(">HIII")
_COUNT = struct.Struct(">I")
_PREDICTION = struct.Struct(">HddB")
_FEATURE = struct.Struct(">d")
_DUE_CALLS_FIELD = b"d"
_DUE_CALL = struct.Struct(">HQIddB")
_BLOCK = struct.Struct(">Q")
STREAM_MAX_ENTRIES = 1024  # about this many batches kept: seconds of traffic, while readers lag by milliseconds
_READ_BATCHES = 256  # entries per read
_RETRY_S = 0.5  # a failed read waits this long before the next
_Item = TypeVar("_Item")  # what an entry's extra field holds: predictions, due calls


class TouchesUnavailable(Exception):
    """Redis did not take or give touches in time."""


@dataclass
class TouchCounters:
    """Exported as ``router_kv_touches_*``: touches this replica published and heard from others, and those
    lost (a write that failed; a read that failed is counted in ``read_errors``); ``predictions_*`` the same for
    the TTFT predictions (``share_predictions``), ``due_calls_*`` for the chains' calls (``share_due_calls``)."""

    published: int = 0
    heard: int = 0
    lost: int = 0
    read_errors: int = 0
    predictions_published: int = 0
    predictions_heard: int = 0
    predictions_lost: int = 0
    due_calls_published: int = 0
    due_calls_heard: int = 0
    due_calls_lost: int = 0


def encode(replica: bytes, touches: Sequence[Touch]) -> bytes:
    """One entry's payload (module docstring)."""
    parts = [_HEAD.pack(replica, len(touches))]
    for t in touches:
        name = t.endpoint.encode()
        parts += [_TOUCH.pack(len(name), t.hit_blocks, t.stored_blocks, len(t.path)), name, pack_hashes(t.path)]
    return b"".join(parts)


def decode(payload: bytes) -> tuple[bytes, list[Touch]]:
    """``encode``'s inverse: the replica that wrote it and its touches. Raises ValueError on a malformed entry."""
    try:
        replica, count = _HEAD.unpack_from(payload)
        at, touches = _HEAD.size, []
        for _ in range(count):
            name_len, hit, stored, n = _TOUCH.unpack_from(payload, at)
            at += _TOUCH.size
            name = payload[at : at + name_len].decode()
            at += name_len
            path, at = unpack_hashes(payload, at, n)
            touches.append(Touch(EndpointId(name), path, hit, stored))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"malformed touches entry: {exc}") from exc
    if at != len(payload):
        raise ValueError("malformed touches entry: trailing bytes")
    return replica, touches


def encode_predictions(predictions: Sequence[Prediction]) -> bytes:
    """An entry's ``p`` field (module docstring)."""
    parts = [_COUNT.pack(len(predictions))]
    for p in predictions:
        name = p.endpoint.encode()
        parts += [_PREDICTION.pack(len(name), p.ttft_s, p.fixed_s, len(p.features)), name]
        parts += [_FEATURE.pack(f) for f in p.features]
    return b"".join(parts)


def decode_predictions(payload: bytes) -> list[Prediction]:
    """``encode_predictions``' inverse. Raises ValueError on a malformed field."""
    try:
        (count,), at, predictions = _COUNT.unpack_from(payload), _COUNT.size, []
        for _ in range(count):
            name_len, ttft_s, fixed_s, n = _PREDICTION.unpack_from(payload, at)
            at += _PREDICTION.size
            name = payload[at : at + name_len].decode()
            at += name_len
            features = tuple(_FEATURE.unpack_from(payload, at + i * _FEATURE.size)[0] for i in range(n))
            at += n * _FEATURE.size
            predictions.append(Prediction(EndpointId(name), ttft_s, features, fixed_s))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed predictions field: {exc}") from exc
    if at != len(payload):
        raise ValueError("malformed predictions field: trailing bytes")
    return predictions


def encode_due_calls(calls: Sequence[DueCall]) -> bytes:
    """An entry's ``d`` field (module docstring)."""
    parts = [_COUNT.pack(len(calls))]
    for c in calls:
        name = c.endpoint.encode()
        after_s = math.nan if c.after_s is None else c.after_s
        continues = c.continues is not None
        parts += [_DUE_CALL.pack(len(name), c.block, c.blocks, c.first_token_in_s, after_s, continues), name]
        if c.continues is not None:
            parts.append(_BLOCK.pack(c.continues))
    return b"".join(parts)


def decode_due_calls(payload: bytes) -> list[DueCall]:
    """``encode_due_calls``' inverse. Raises ValueError on a malformed field."""
    try:
        (count,), at, calls = _COUNT.unpack_from(payload), _COUNT.size, []
        for _ in range(count):
            name_len, block, blocks, first_token_in_s, after_s, continues = _DUE_CALL.unpack_from(payload, at)
            at += _DUE_CALL.size
            name = payload[at : at + name_len].decode()
            at += name_len
            continued = None
            if continues:
                continued = BlockHash(_BLOCK.unpack_from(payload, at)[0])
                at += _BLOCK.size
            after = None if math.isnan(after_s) else after_s
            calls.append(DueCall(EndpointId(name), BlockHash(block), blocks, first_token_in_s, after, continued))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed due calls field: {exc}") from exc
    if at != len(payload):
        raise ValueError("malformed due calls field: trailing bytes")
    return calls


@dataclass(frozen=True, slots=True)
class _Sinks:
    """Where ``follow`` hands what the other replicas published (None: not wanted)."""

    touches: Callable[[Touch], None] | None
    predictions: Callable[[Prediction], None] | None
    due_calls: Callable[[DueCall], None] | None


class SharedTouches:
    """Publishes this replica's touches and hands the other replicas' to a sink (``follow``).

    ``writer`` carries the writes under ``timeout_s``; ``reader`` the blocking reads, so its socket timeout
    must exceed ``block_s``. ``replica``: 8 bytes unique to this replica (its own entries are skipped)."""

    def __init__(
        self,
        writer: RedisClient,
        reader: RedisClient,
        *,
        namespace: str,
        timeout_s: float,
        block_s: float = 1.0,
        replica: bytes | None = None,
    ) -> None:
        self._w, self._r = writer, reader
        self._key = Schema(namespace).touches
        self._timeout_s = timeout_s
        self._block_ms = max(int(block_s * 1000), 1)
        self._replica = replica or os.urandom(8)
        self._pending: list[Touch] = []
        self._pending_predictions: list[Prediction] = []
        self._pending_due_calls: list[DueCall] = []
        self._flushing: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self.counters = TouchCounters()
        self.positioned = asyncio.Event()  # set once ``follow``'s reader knows where it starts: what is published
        # after that is heard

    @classmethod
    def from_url(cls, url: str, *, namespace: str, timeout_s: float, block_s: float = 1.0) -> SharedTouches:
        """Touches on ``url``, connecting lazily."""
        reader = client_for(url, block_s + max(timeout_s, 1.0))  # a blocked read is not a slow one
        return cls(client_for(url, timeout_s), reader, namespace=namespace, timeout_s=timeout_s, block_s=block_s)

    def publish(self, touch: Touch) -> None:
        """Tell the other replicas (in the background, with the rest of this event-loop turn's touches)."""
        self._pending.append(touch)
        self._flush_soon()

    def publish_prediction(self, prediction: Prediction) -> None:
        """Tell the other replicas what this one predicted for a request it routed (as ``publish``)."""
        self._pending_predictions.append(prediction)
        self._flush_soon()

    def publish_due_call(self, call: DueCall) -> None:
        """Tell the other replicas a call this one routed, whose chain's next call is expected (as ``publish``)."""
        self._pending_due_calls.append(call)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush(), name="touches-flush")

    def follow(
        self,
        sink: Callable[[Touch], None] | None,
        predictions: Callable[[Prediction], None] | None = None,
        due_calls: Callable[[DueCall], None] | None = None,
    ) -> None:
        """Hand every touch another replica publishes from now on to ``sink``, every prediction to
        ``predictions`` and every due call to ``due_calls`` (a background task; None: not wanted)."""
        if self._following is None:
            follow = self._follow(_Sinks(sink, predictions, due_calls))
            self._following = asyncio.get_running_loop().create_task(follow, name="touches-follow")
            self._following.add_done_callback(_said_if_failed)

    async def close(self) -> None:
        """Stop following, send what is pending (within the timeout), close the connections."""
        await stop_task(self._following)
        if self._flushing is not None:
            await asyncio.wait({self._flushing}, timeout=self._timeout_s * 2)
            await stop_task(self._flushing)
        await self._w.aclose()
        await self._r.aclose()

    async def _flush(self) -> None:
        while self._pending or self._pending_predictions or self._pending_due_calls:
            batch, self._pending = self._pending, []
            predicted, self._pending_predictions = self._pending_predictions, []
            due, self._pending_due_calls = self._pending_due_calls, []
            entry: dict[Any, Any] = {_FIELD: encode(self._replica, batch)}
            if predicted:
                entry[_PREDICTIONS_FIELD] = encode_predictions(predicted)
            if due:
                entry[_DUE_CALLS_FIELD] = encode_due_calls(due)
            try:
                add = self._w.xadd(self._key, entry, maxlen=STREAM_MAX_ENTRIES, approximate=True)
                await call_within(self._w, add, self._timeout_s, TouchesUnavailable)
            except TouchesUnavailable as exc:
                self.counters.lost += len(batch)
                self.counters.predictions_lost += len(predicted)
                self.counters.due_calls_lost += len(due)
                log.debug("touches not published: %s", exc)
            else:
                self.counters.published += len(batch)
                self.counters.predictions_published += len(predicted)
                self.counters.due_calls_published += len(due)

    async def _follow(self, sinks: _Sinks) -> None:
        last: bytes | None = None
        while True:
            try:
                if last is None:
                    last = await self._newest()
                    self.positioned.set()
                got = await self._r.xread({self._key: last}, count=_READ_BATCHES, block=self._block_ms)
            except (RedisError, RedisClusterException, OSError) as exc:  # the cluster's own are not RedisErrors
                self.counters.read_errors += 1
                log.debug("touches not read: %r", exc)
                await asyncio.sleep(_RETRY_S)
                continue
            last = self._deliver(got, sinks) or last

    async def _newest(self) -> bytes:
        """The newest entry's id (reading starts after it), or the stream's start when it has none."""
        newest: Any = await self._r.xrevrange(self._key, count=1)
        return bytes(newest[0][0]) if newest else b"0-0"

    def _deliver(self, got: Any, sinks: _Sinks) -> bytes | None:
        """Hand the other replicas' touches, predictions and due calls in ``got`` (an XREAD answer) to ``sinks``;
        the last entry id read. This replica's own entries are skipped before their touches are decoded."""
        last = None
        streams = got.items() if isinstance(got, dict) else (got or [])
        for _key, entries in streams:
            for entry_id, fields in entries:
                last = bytes(entry_id)
                head = fields.get(_FIELD, b"")
                if head.startswith(self._replica):
                    continue
                try:
                    _replica, touches = decode(head)
                except ValueError as exc:
                    self.counters.read_errors += 1
                    log.debug("touches entry %r skipped: %s", entry_id, exc)
                    continue
                if sinks.touches is not None:
                    for touch in touches:
                        sinks.touches(touch)
                    self.counters.heard += len(touches)
                predictions, due = sinks.predictions, sinks.due_calls
                self.counters.predictions_heard += self._heard(
                    entry_id, fields, _PREDICTIONS_FIELD, decode_predictions, predictions
                )
                self.counters.due_calls_heard += self._heard(entry_id, fields, _DUE_CALLS_FIELD, decode_due_calls, due)
        return last

    def _heard(
        self,
        entry_id: Any,
        fields: dict[bytes, bytes],
        field: bytes,
        decode_field: Callable[[bytes], list[_Item]],
        sink: Callable[[_Item], None] | None,
    ) -> int:
        """How many items of an entry's ``field`` (its predictions, its due calls) went to ``sink``; a malformed
        field is counted and skipped (the entry's touches and other fields still count)."""
        if sink is None or field not in fields:
            return 0
        try:
            items = decode_field(fields[field])
        except ValueError as exc:
            self.counters.read_errors += 1
            log.debug("field %r of touches entry %r skipped: %s", field, entry_id, exc)
            return 0
        for item in items:
            sink(item)
        return len(items)


def _said_if_failed(task: asyncio.Task[None]) -> None:
    """The reader only ends when stopped; one that failed (a sink's error) is logged at once, not at shutdown:
    until a restart this replica's hot sets count only its own traffic again."""
    if not task.cancelled() and task.exception() is not None:
        log.error("touches: the other replicas' touches are no longer read", exc_info=task.exception())
