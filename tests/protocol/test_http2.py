"""Our HTTP/2 framing (``extproc.protocol.http2``) frame by frame: frames are packed here by hand (RFC 9113 §4.1)
and header blocks by the ``hpack`` package's own encoder (Huffman and the dynamic table on), so what is checked
is the parser against the RFC, not against itself. (Interop with grpcio's client and real Envoy is covered by
every exchange test of this package: ``each_grpc_server``.)"""

from __future__ import annotations

import struct

import hpack
import pytest

from extproc.protocol import http2

U32 = struct.Struct(">L")


def raw_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16, (n >> 8) & 0xFF, n & 0xFF, kind, flags)) + U32.pack(stream_id) + payload


def settings(**values: int) -> bytes:
    codes = {"initial_window": 4, "max_frame": 5, "table_size": 1}
    return raw_frame(4, 0, 0, b"".join(struct.pack(">HL", codes[k], v) for k, v in values.items()))


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/Method"), (b":authority", b"picker"),
           (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool, new: bool) -> None:
        self.events.append(("headers" if new else "trailers", stream_id, dict(headers), end_stream))

    def on_data(self, stream_id: int, data: bytes, *, end_stream: bool) -> None:
        self.events.append(("data", stream_id, data, end_stream))

    def on_reset(self, stream_id: int) -> None:
        self.events.append(("reset", stream_id))

    def on_window(self, stream_id: int) -> None:
        self.events.append(("window", stream_id))

    def on_goaway(self) -> None:
        self.events.append(("goaway",))


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """What the connection sent, as (type, flags, stream id, payload)."""
    out, at = [], 0
    while at < len(data):
        n = int.from_bytes(data[at : at + 3], "big")
        kind, flags, sid = data[at + 3], data[at + 4], U32.unpack_from(data, at + 5)[0]
        out.append((kind, flags, sid, data[at + 9 : at + 9 + n]))
        at += 9 + n
    return out


def connected(window: int = 1 << 20, max_frame: int = 1 << 20) -> tuple[http2.Http2Connection, Recorder]:
    rec = Recorder()
    conn = http2.Http2Connection(rec, window_bytes=window, max_frame_bytes=max_frame)
    conn.initiate(max_concurrent_streams=100)
    conn.receive(http2.PREFACE + settings())
    conn.data_to_send()
    return conn, rec


def test_the_server_preface_offers_our_windows_and_acknowledges_the_peers_settings() -> None:
    rec = Recorder()
    conn = http2.Http2Connection(rec, window_bytes=1 << 24, max_frame_bytes=1 << 20)
    conn.initiate(max_concurrent_streams=7)
    conn.receive(http2.PREFACE + settings(initial_window=1000))
    frames = parse_frames(conn.data_to_send())
    kind, flags, sid, payload = frames[0]
    assert (kind, flags, sid) == (4, 0, 0)
    offered = {struct.unpack_from(">HL", payload, i) for i in range(0, len(payload), 6)}
    assert offered == {(4, 1 << 24), (5, 1 << 20), (3, 7)}
    assert frames[1] == (8, 0, 0, U32.pack((1 << 24) - 65_535))  # the connection window raised to ours
    assert frames[2] == (4, 1, 0, b"")  # their SETTINGS acknowledged


def test_a_request_split_across_reads_anywhere_arrives_whole() -> None:
    encoder = hpack.Encoder()
    wire = http2.PREFACE + settings() + raw_frame(1, 0x4, 1, encoder.encode(REQUEST))
    wire += raw_frame(0, 0, 1, b"hello ") + raw_frame(0, 0x1, 1, b"world")
    for cut in range(1, len(wire)):
        rec = Recorder()
        conn = http2.Http2Connection(rec, window_bytes=1 << 20, max_frame_bytes=1 << 20)
        conn.receive(wire[:cut])
        conn.receive(wire[cut:])
        assert rec.events == [("headers", 1, dict(REQUEST), False), ("data", 1, b"hello ", False),
                              ("data", 1, b"world", True)], cut  # fmt: skip


def test_padding_priority_and_continuation_are_read_through() -> None:
    conn, rec = connected()
    block = hpack.Encoder().encode(REQUEST)
    first, rest = block[:5], block[5:]
    padded_priority = bytes((3,)) + U32.pack(0) + bytes((16,)) + first + b"\0\0\0"  # PADDED | PRIORITY
    conn.receive(raw_frame(1, 0x8 | 0x20, 3, padded_priority) + raw_frame(9, 0x4, 3, rest))
    conn.receive(raw_frame(0, 0x8 | 0x1, 3, bytes((2,)) + b"body" + b"\0\0"))
    assert rec.events == [("headers", 3, dict(REQUEST), False), ("data", 3, b"body", True)]


def test_trailers_end_the_stream() -> None:
    conn, rec = connected()
    encoder = hpack.Encoder()
    conn.receive(raw_frame(1, 0x4, 1, encoder.encode(REQUEST)))
    conn.receive(raw_frame(1, 0x4 | 0x1, 1, encoder.encode([(b"x-trailer", b"1")])))
    assert rec.events[-1] == ("trailers", 1, {b"x-trailer": b"1"}, True)
    conn.send_headers(1, http2.encode_headers([(b"grpc-status", b"0")]), end_stream=True)  # our side closes first
    conn.receive(raw_frame(1, 0x4, 3, encoder.encode(REQUEST)))
    conn.send_headers(3, http2.encode_headers([(b"grpc-status", b"0")]), end_stream=True)
    conn.receive(raw_frame(1, 0x4 | 0x1, 3, encoder.encode([(b"x-trailer", b"2")])))
    assert rec.events[-1] == ("trailers", 3, {b"x-trailer": b"2"}, True)  # still reported: the handler waits on it


def test_repeated_blocks_decode_the_same_while_the_dynamic_table_changes() -> None:
    conn, rec = connected()
    encoder = hpack.Encoder()
    for sid, extra in ((1, b"a"), (3, b"a"), (5, b"b"), (7, b"a"), (9, b"b")):
        headers = [*REQUEST, (b"x-tag", extra)]
        conn.receive(raw_frame(1, 0x4 | 0x1, sid, encoder.encode(headers)))
        assert rec.events[-1] == ("headers", sid, dict(headers), True)
    # a table size update that empties the peer's table, then references by the new numbering
    encoder.header_table_size = 0
    encoder.header_table_size = 4096
    headers = [*REQUEST, (b"x-tag", b"c")]
    conn.receive(raw_frame(1, 0x4, 11, encoder.encode(headers)))
    conn.receive(raw_frame(1, 0x4, 13, encoder.encode(headers)))
    assert rec.events[-2:] == [("headers", 11, dict(headers), False), ("headers", 13, dict(headers), False)]


def test_ping_is_answered_and_a_ping_ack_is_not() -> None:
    conn, _ = connected()
    conn.receive(raw_frame(6, 0, 0, b"12345678") + raw_frame(6, 1, 0, b"87654321"))
    assert parse_frames(conn.data_to_send()) == [(6, 1, 0, b"12345678")]


def test_sending_respects_the_smaller_of_the_stream_and_connection_windows() -> None:
    conn, rec = connected()
    conn.receive(settings(initial_window=100, max_frame=16_384))
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.data_to_send()
    assert conn.send_window(1) == 100
    conn.send_data(1, b"x" * 100)
    assert conn.send_window(1) == 0
    with pytest.raises(ValueError):
        conn.send_data(1, b"x")
    conn.receive(raw_frame(8, 0, 1, U32.pack(50)))
    assert ("window", 1) in rec.events and conn.send_window(1) == 50
    conn.receive(settings(initial_window=200))  # +100 for every open stream
    assert conn.send_window(1) == 150
    assert conn.send_window(99) == 0  # no such stream


def test_the_connection_window_bounds_every_stream() -> None:
    conn, _ = connected()
    conn.receive(settings(initial_window=1 << 20, max_frame=16_384))
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    assert conn.send_window(1) == 65_535  # the connection's own window, never raised by SETTINGS
    conn.send_data(1, b"y" * 40_000)
    frames = parse_frames(conn.data_to_send())
    assert [len(p) for k, _, _, p in frames if k == 0] == [16_384, 16_384, 7_232]  # the peer's frame size
    assert conn.send_window(1) == 65_535 - 40_000


def test_received_data_is_given_back_once_half_a_window_is_used() -> None:
    conn, _ = connected(window=1000)
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.receive(raw_frame(0, 0, 1, b"z" * 400))
    assert conn.data_to_send() == b""
    conn.receive(raw_frame(0, 0, 1, b"z" * 200))
    assert sorted(parse_frames(conn.data_to_send())) == [(8, 0, 0, U32.pack(600)), (8, 0, 1, U32.pack(600))]


def test_headers_and_trailers_go_out_whole_and_close_our_side() -> None:
    conn, _ = connected()
    conn.receive(settings(max_frame=16_384))
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.data_to_send()
    long_value = b"v" * 20_000
    sent = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-long", long_value)]
    conn.send_headers(1, http2.encode_headers(sent), end_stream=True)
    frames = parse_frames(conn.data_to_send())
    assert [(k, f) for k, f, _, _ in frames] == [(1, 0x1), (9, 0x4)]  # HEADERS (END_STREAM), CONTINUATION (END_HEADERS)
    assert hpack.Decoder().decode(b"".join(p for *_, p in frames), raw=True) == sent
    assert conn.send_window(1) == 0  # closed: nothing more may go


def test_a_stream_window_pushed_past_its_limit_resets_that_stream_only() -> None:
    conn, rec = connected()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.data_to_send()
    conn.receive(raw_frame(8, 0, 1, U32.pack((1 << 31) - 1)))
    assert parse_frames(conn.data_to_send()) == [(3, 0, 1, U32.pack(http2.FLOW_CONTROL_ERROR))]
    assert rec.events[-1] == ("reset", 1) and not conn.closing


def test_a_reset_stream_is_reported_and_forgotten() -> None:
    conn, rec = connected()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.receive(raw_frame(3, 0, 1, U32.pack(8)))
    assert rec.events[-1] == ("reset", 1) and conn.send_window(1) == 0


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http2.PROTOCOL_ERROR),  # not HTTP/2
        (http2.PREFACE + raw_frame(0, 0, 0, b"x"), http2.PROTOCOL_ERROR),  # DATA on stream 0
        (http2.PREFACE + raw_frame(6, 0, 0, b"short"), http2.FRAME_SIZE_ERROR),  # PING of 5 bytes
        (http2.PREFACE + raw_frame(1, 0, 1, b"\x82") + raw_frame(6, 0, 0, b"12345678"), http2.PROTOCOL_ERROR),
        (http2.PREFACE + raw_frame(1, 0x4, 1, b"\xff\xff\xff\xff"), http2.COMPRESSION_ERROR),  # bad HPACK
        (http2.PREFACE + raw_frame(0, 0, 1, b"\0" * 70_000), http2.FRAME_SIZE_ERROR),  # beyond our frame size
        (http2.PREFACE + raw_frame(5, 0x4, 1, U32.pack(2)), http2.PROTOCOL_ERROR),  # a client pushing
        (http2.PREFACE + raw_frame(1, 0x4, 2, b"\x82"), http2.PROTOCOL_ERROR),  # an even (server's) stream id
        (http2.PREFACE + raw_frame(8, 0, 0, U32.pack(0)), http2.PROTOCOL_ERROR),  # a window increment of 0
        (http2.PREFACE + raw_frame(8, 0, 0, U32.pack((1 << 31) - 1)), http2.FLOW_CONTROL_ERROR),  # beyond 2^31-1
    ],
    ids=[
        "not-http2",
        "data-on-0",
        "short-ping",
        "interrupted-block",
        "bad-hpack",
        "frame-too-big",
        "push",
        "even",
        "zero-increment",
        "window-overflow",
    ],
)
def test_a_connection_error_queues_a_goaway_that_says_why(wire: bytes, code: int) -> None:
    conn = http2.Http2Connection(Recorder(), window_bytes=1 << 20, max_frame_bytes=65_536)
    with pytest.raises(http2.Http2Error) as caught:
        conn.receive(wire)
    assert caught.value.code == code
    goaway = [p for k, _, _, p in parse_frames(conn.data_to_send()) if k == 7]
    assert len(goaway) == 1 and U32.unpack_from(goaway[0], 4)[0] == code


def test_unknown_frame_types_and_priority_are_ignored() -> None:
    conn, rec = connected()
    conn.receive(raw_frame(0xEE, 0, 0, b"whatever") + raw_frame(2, 0, 1, U32.pack(0) + b"\x10"))
    assert rec.events == [] and conn.data_to_send() == b""


def test_go_away_names_the_last_stream_seen_once() -> None:
    conn, _ = connected()
    conn.receive(raw_frame(1, 0x4, 5, hpack.Encoder().encode(REQUEST)))
    conn.data_to_send()
    conn.go_away()
    conn.go_away()
    frames = parse_frames(conn.data_to_send())
    assert frames == [(7, 0, 0, U32.pack(5) + U32.pack(0))] and conn.closing


@pytest.mark.parametrize("length", [0, 1, 126, 127, 128, 300, 20_000])
def test_our_header_blocks_decode_with_any_decoder(length: int) -> None:
    fields = [(b"grpc-status", b"13"), (b"grpc-message", b"m" * length)]
    decoder = hpack.Decoder()
    decoder.header_table_size = 0  # whatever its table size: we never index
    assert decoder.decode(http2.encode_headers(fields), raw=True) == fields
