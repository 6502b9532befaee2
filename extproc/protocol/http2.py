"""The server side of one cleartext HTTP/2 connection (RFC 9113), as little of it as a gRPC server needs: frames
in, calls on a ``StreamHandler`` out, bytes to send.

Why our own: the ``h2`` library runs a full state machine, an event object and a frame object per frame, and an
HPACK encoder for every header block; on this kind of VM a picker that wakes once per request runs all of that
with cold caches, and it was most of what an ext_proc exchange cost beyond ext_authz's (``bench.extproc_floor``).
This does what Envoy's gRPC clients (ext_proc, health checks) and grpcio's client need, in a few function calls
per frame. HPACK decoding (Huffman, the dynamic table) is the ``hpack`` package's; what we send is encoded here
without the dynamic table, which every decoder accepts whatever its table size.

What it does:
- reads the client preface, answers SETTINGS (applying the peer's initial window and maximum frame size) and PING;
- HEADERS (+ CONTINUATION, padding and priority skipped) become ``on_headers`` (a new stream, or trailers), DATA
  becomes ``on_data`` (padding stripped), RST_STREAM ``on_reset``, WINDOW_UPDATE ``on_window``, GOAWAY
  ``on_goaway``; PRIORITY and unknown frame types are ignored, as the RFC asks;
- receive windows: granted as ``window_bytes`` (stream and connection) and replenished once half is consumed, so a
  large body never waits on a round trip; what a peer sends past them is not policed (the gRPC layer bounds each
  message);
- send windows: ``send_window(stream_id)`` tells what may go now; ``send_data`` never sends more.

A connection error (a bad preface, a frame that breaks the framing, an HPACK block that does not decode) raises
``Http2Error`` after queueing a GOAWAY that says why; the caller sends what is queued and closes. Not
thread-safe: one event loop.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import NoReturn, Protocol

import hpack
import hpack.exceptions

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME = struct.Struct(">HBBBL")  # length (24 bits: high 16 + low 8), type, flags, stream id (31 bits)
_HEADER_SIZE = 9
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
# error codes
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR = 0x0, 0x1, 0x3, 0x6, 0x9
CANCEL = 0x8

DEFAULT_WINDOW = 65_535  # RFC 9113 §6.9.2: every window starts here
DEFAULT_MAX_FRAME = 16_384
_MAX_WINDOW = (1 << 31) - 1
_MAX_HEADER_BLOCK = 1 << 20  # a header block (with its CONTINUATIONs) beyond this is refused
_DECODED_BLOCKS = 64  # decoded header blocks remembered (``Http2Connection._decode``)

Headers = Sequence[tuple[bytes, bytes]]


class Http2Error(Exception):
    """The connection cannot go on (``code``: the HTTP/2 error code a GOAWAY carried)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamHandler(Protocol):
    """What a connection reports, in the order frames arrived."""

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool, new: bool) -> None:
        """A header block: a ``new`` stream's request headers, or trailers of one opened before."""
        ...

    def on_data(self, stream_id: int, data: bytes, *, end_stream: bool) -> None:
        """DATA on ``stream_id`` (``data`` may be empty: an END_STREAM alone)."""
        ...

    def on_reset(self, stream_id: int) -> None:
        """The peer reset ``stream_id``."""
        ...

    def on_window(self, stream_id: int) -> None:
        """A send window grew (``stream_id`` 0: the connection's, or every stream's by SETTINGS)."""
        ...

    def on_goaway(self) -> None:
        """The peer is closing the connection."""
        ...


def encode_headers(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of literal fields that never touch the dynamic table (§6.2.2 "without indexing"), names
    literal: valid for any decoder state. ``:status: 200`` uses its static-table entry."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out += b"\x88"  # static table index 8
            continue
        out += b"\x00"
        out += _hpack_int(len(name), 7) + name
        out += _hpack_int(len(value), 7) + value
    return bytes(out)


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with the first byte's other bits 0 (Huffman off for string lengths)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header, then ``payload``."""
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


class Http2Connection:
    """One server connection's framing and flow control; the streams' meaning is the handler's."""

    def __init__(self, handler: StreamHandler, *, window_bytes: int, max_frame_bytes: int) -> None:
        self._handler = handler
        self._window = window_bytes
        self._max_frame_in = max_frame_bytes
        self._out = bytearray()
        self._buffer = bytearray()  # the start of a frame not yet whole
        self._need = 0  # bytes ``_buffer`` must reach before parsing can go on
        self._preface_seen = False
        self._decoder = hpack.Decoder()
        self._decoded: dict[bytes, tuple[tuple[bytes, bytes], ...]] = {}  # see ``_decode``
        self._decoded_state: tuple[int, object] = (0, None)
        # header block being assembled: (stream id, fragments so far, END_STREAM on its HEADERS frame)
        self._block: tuple[int, bytearray, bool] | None = None
        self._last_stream = 0
        self._closing = False
        # what we may send: the connection's window, each open stream's, the peer's frame and initial window sizes
        self._send_conn = DEFAULT_WINDOW
        self._send_streams: dict[int, int] = {}
        self._peer_initial = DEFAULT_WINDOW
        self.max_outbound_frame = DEFAULT_MAX_FRAME
        # what the peer has sent and we have not given back yet (connection; per stream)
        self._consumed_conn = 0
        self._consumed: dict[int, int] = {}

    # -- setup and teardown ----------------------------------------------------------------------------------
    def initiate(self, max_concurrent_streams: int) -> None:
        """Queue our SETTINGS and the connection window's increment (the server's preface)."""
        settings = (
            _SETTING.pack(INITIAL_WINDOW_SIZE, self._window)
            + _SETTING.pack(MAX_FRAME_SIZE, self._max_frame_in)
            + _SETTING.pack(MAX_CONCURRENT_STREAMS, max_concurrent_streams)
        )
        self._out += frame(SETTINGS, 0, 0, settings)
        if self._window > DEFAULT_WINDOW:
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._window - DEFAULT_WINDOW))

    def go_away(self, code: int = NO_ERROR, message: str = "") -> None:
        """Queue a GOAWAY: no new streams (the ones up to the last we saw may finish)."""
        if not self._closing:
            self._closing = True
            self._out += frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code) + message.encode())

    def data_to_send(self) -> bytes:
        """Everything queued since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    # -- receiving ---------------------------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Feed bytes from the socket; calls the handler per complete frame. Raises ``Http2Error``."""
        if self._buffer:  # a frame (or the preface) was cut short: wait until it is whole, then parse it all
            self._buffer += data
            if len(self._buffer) < self._need:
                return
            data = bytes(self._buffer)
            self._buffer.clear()
        start, end = 0, len(data)
        if not self._preface_seen:
            if end < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                self._buffer += data
                self._need = len(PREFACE)
                return
            if not data.startswith(PREFACE):
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 client preface")
            self._preface_seen = True
            start = len(PREFACE)
        need = _HEADER_SIZE
        while end - start >= _HEADER_SIZE:
            high, low, kind, flags, stream_id = _FRAME.unpack_from(data, start)
            length = (high << 8) | low
            if length > self._max_frame_in:
                self._fail(FRAME_SIZE_ERROR, f"a frame of {length} bytes exceeds {self._max_frame_in}")
            body = start + _HEADER_SIZE
            if end - body < length:
                need = _HEADER_SIZE + length
                break
            start = body + length
            self._frame(kind, flags, stream_id & _MAX_WINDOW, data[body:start])
        if start < end:
            self._buffer += memoryview(data)[start:]
            self._need = need
        self._replenish()

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            self._fail(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8:
                self._fail(FRAME_SIZE_ERROR, "a PING must carry 8 bytes")
            if not flags & ACK:
                self._out += frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            self._closed(stream_id)
            self._handler.on_reset(stream_id)
        elif kind == GOAWAY:
            self._handler.on_goaway()
        elif kind == PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "a client must not push")
        # PRIORITY and unknown types: ignored (§5.5, §6.3)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            self._fail(PROTOCOL_ERROR, "DATA on stream 0")
        # flow control counts the whole payload, padding included (§6.9.1)
        self._consumed_conn += len(payload)
        if stream_id in self._send_streams:
            self._consumed[stream_id] = self._consumed.get(stream_id, 0) + len(payload)
        self._handler.on_data(stream_id, self._unpadded(payload, flags), end_stream=bool(flags & END_STREAM))

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            self._fail(PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment = self._unpadded(payload, flags)
        if flags & PRIORITY_FLAG:
            fragment = fragment[5:]  # stream dependency and weight: ignored
        self._block = (stream_id, bytearray(fragment), bool(flags & END_STREAM))
        if flags & END_HEADERS:
            self._end_block()

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            self._fail(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = self._block[1]
        block += payload
        if len(block) > _MAX_HEADER_BLOCK:
            self._fail(PROTOCOL_ERROR, f"a header block beyond {_MAX_HEADER_BLOCK} bytes")
        if flags & END_HEADERS:
            self._end_block()

    def _end_block(self) -> None:
        assert self._block is not None
        stream_id, block, end_stream = self._block
        self._block = None
        headers = self._decode(bytes(block))
        new = stream_id not in self._send_streams and stream_id > self._last_stream
        if new:
            if stream_id % 2 == 0:
                self._fail(PROTOCOL_ERROR, f"a client opened even stream {stream_id}")
            self._last_stream = stream_id
            self._send_streams[stream_id] = self._peer_initial
        # not new: trailers, also on a stream our side already closed (the handler still waits for its end)
        self._handler.on_headers(stream_id, headers, end_stream=end_stream, new=new)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Every block is decoded, even one we ignore: the decoder's table must follow the peer's.

        A peer's gRPC streams mostly repeat one block (Envoy sends ``:path`` as a Huffman literal that is never
        indexed, the rest as dynamic-table references), so decoded blocks are remembered while the table stays
        as it was: a block that left it unchanged decodes the same again. The table's state is its length and
        the identity of its newest entry (every insertion puts a new entry in front; evictions shorten it)."""
        entries = self._decoder.header_table.dynamic_entries
        state = (len(entries), entries[0] if entries else None)
        if state[0] != self._decoded_state[0] or state[1] is not self._decoded_state[1]:
            self._decoded.clear()
            self._decoded_state = state
        cached = self._decoded.get(block)
        if cached is not None:
            return list(cached)
        try:
            headers = [(bytes(n), bytes(v)) for n, v in self._decoder.decode(block, raw=True)]
        except hpack.exceptions.HPACKError as exc:
            self._fail(COMPRESSION_ERROR, f"header block does not decode: {exc}")
        after = (len(entries), entries[0] if entries else None)
        if after[0] == state[0] and after[1] is state[1]:
            if len(self._decoded) >= _DECODED_BLOCKS:
                self._decoded.clear()
            self._decoded[block] = tuple(headers)
        return headers

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % _SETTING.size:
            self._fail(FRAME_SIZE_ERROR, "SETTINGS payload is not whole settings")
        grew = False
        for offset in range(0, len(payload), _SETTING.size):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "initial window beyond 2^31-1")
                delta, self._peer_initial = value - self._peer_initial, value
                for sid in self._send_streams:
                    self._send_streams[sid] += delta
                grew = grew or delta > 0
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= (1 << 24) - 1:
                    self._fail(PROTOCOL_ERROR, f"maximum frame size {value} out of range")
                self.max_outbound_frame = value
            elif key == HEADER_TABLE_SIZE:
                pass  # what we send never uses the dynamic table
        self._out += frame(SETTINGS, ACK, 0)
        if grew:
            self._handler.on_window(0)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "WINDOW_UPDATE must carry 4 bytes")
        increment = _U32.unpack(payload)[0] & _MAX_WINDOW
        if stream_id == 0:
            self._send_conn += increment
            if increment == 0 or self._send_conn > _MAX_WINDOW:  # §6.9, §6.9.1: a connection error
                self._fail(FLOW_CONTROL_ERROR if increment else PROTOCOL_ERROR, "bad connection WINDOW_UPDATE")
        elif stream_id in self._send_streams:
            self._send_streams[stream_id] += increment
            if increment == 0 or self._send_streams[stream_id] > _MAX_WINDOW:  # a stream error: reset it
                self.reset(stream_id, FLOW_CONTROL_ERROR if increment else PROTOCOL_ERROR)
                self._handler.on_reset(stream_id)
                return
        else:
            return  # a closed stream's: nothing waits on it
        self._handler.on_window(stream_id)

    def _replenish(self) -> None:
        """Give back what the peer consumed once half a window is used (one update, not one per frame)."""
        half = self._window // 2
        if self._consumed_conn >= half:
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._consumed_conn))
            self._consumed_conn = 0
        for sid in [s for s, n in self._consumed.items() if n >= half]:
            self._out += frame(WINDOW_UPDATE, 0, sid, _U32.pack(self._consumed.pop(sid)))

    def _unpadded(self, payload: bytes, flags: int) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            self._fail(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - payload[0]]

    def _fail(self, code: int, message: str) -> NoReturn:
        self.go_away(code, message)
        raise Http2Error(code, message)

    # -- sending -----------------------------------------------------------------------------------------------
    def send_window(self, stream_id: int) -> int:
        """Bytes of DATA ``stream_id`` may send now (0 for a closed stream)."""
        stream = self._send_streams.get(stream_id)
        return 0 if stream is None else max(min(stream, self._send_conn), 0)

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        """Queue a header block (``encode_headers``), split into CONTINUATIONs past the peer's frame size;
        ``end_stream`` closes our side (the stream is then forgotten here)."""
        if stream_id not in self._send_streams:
            return
        size = self.max_outbound_frame
        first, rest = block[:size], block[size:]
        flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
        self._out += frame(HEADERS, flags, stream_id, first)
        while rest:
            piece, rest = rest[:size], rest[size:]
            self._out += frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, piece)
        if end_stream:
            self._closed(stream_id)

    def send_data(self, stream_id: int, data: bytes) -> None:
        """Queue ``data`` (at most ``send_window`` bytes; split to the peer's frame size)."""
        if stream_id not in self._send_streams:
            return
        if len(data) > self.send_window(stream_id):
            raise ValueError(f"{len(data)} bytes exceed stream {stream_id}'s send window")
        size = self.max_outbound_frame
        for offset in range(0, len(data), size):
            piece = data[offset : offset + size]
            self._out += frame(DATA, 0, stream_id, piece)
        self._send_conn -= len(data)
        self._send_streams[stream_id] -= len(data)

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        """Queue RST_STREAM and forget the stream."""
        if stream_id in self._send_streams:
            self._out += frame(RST_STREAM, 0, stream_id, _U32.pack(code))
            self._closed(stream_id)

    def _closed(self, stream_id: int) -> None:
        self._send_streams.pop(stream_id, None)
        self._consumed.pop(stream_id, None)

    @property
    def closing(self) -> bool:
        """A GOAWAY was queued."""
        return self._closing
