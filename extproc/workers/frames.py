"""The local socket between front workers and the decider: length-prefixed pickled tuples, both directions.

Only our own processes speak it, over a Unix socket in a folder only this user can open (mode 0700), so
pickle is acceptable here; it is never exposed on a network port.

Front → decider:
- ``("ready", front_index)``: tokenizers loaded, serving;
- ``("ask", seq, Ask)``: decide this request;
- ``("served", request_id, endpoint)``: Envoy reported the endpoint that served a request;
- ``("stats", front_index, families)``: the front's own metrics (``metric_rows``), every second.

Decider → front, one per ask, with its ``seq``:
- ``("route", seq, endpoints, headers)``; ``("pass", seq)``: no decision (Envoy balances);
- ``("refused", seq, error_class_name, message, param)``: a ``RouterError`` to raise;
- ``("scheme", seq, HashScheme)``: hash again with this scheme (``SchemeChanged``);
- ``("failed", seq, text)``: the decision raised something else (the front fails open, as in one process).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
MAX_FRAME_BYTES = 256 << 20  # an ask carries at most max_blocks (8192) hashes: far below this

Frame = tuple[Any, ...]
MetricRows = list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]


def encode(frame: Frame) -> bytes:
    """One frame on the wire: 4-byte big-endian length, then the pickle."""
    payload = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class FrameStream(asyncio.Protocol):
    """One connection's frames: ``on_frame(frame)`` for each complete frame, in order, straight from
    ``data_received`` (no reader task, no await per frame); ``on_closed()`` once when the connection ends
    (an oversized or malformed frame closes it). ``send(frame)`` writes one frame; dropped once closed."""

    def __init__(self, on_frame: Callable[[Frame], None], on_closed: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            end = _LENGTH.size + length
            if length > MAX_FRAME_BYTES:
                log.warning("closing a worker connection: a frame of %d bytes exceeds %d", length, MAX_FRAME_BYTES)
                self.close()
                return
            if len(self._buffer) < end:
                return
            frame = pickle.loads(memoryview(self._buffer)[_LENGTH.size : end])
            del self._buffer[:end]
            if not isinstance(frame, tuple) or not frame:
                log.warning("closing a worker connection: a frame must be a non-empty tuple")
                self.close()
                return
            self._on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._on_closed()

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def send(self, frame: Frame) -> None:
        if not self.closed:
            assert self._transport is not None
            self._transport.write(encode(frame))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def metric_rows(collectors: Iterable[Collector]) -> MetricRows:
    """Every family of ``collectors`` as plain rows (name, type, help, samples), for the ``stats`` frame."""
    rows: MetricRows = []
    for collector in collectors:
        for family in collector.collect():
            samples = [(s.name, dict(s.labels), float(s.value)) for s in family.samples]
            rows.append((family.name, family.type, family.documentation, samples))
    return rows
