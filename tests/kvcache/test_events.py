"""Event decoding against vLLM's own bytes (golden files and SPEC hex), both forms, and fuzzing."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.kvcache.events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    ReplayItem,
    decode_batch,
    parse_frames,
    parse_replay_reply,
    replay_request,
)
from tests.support.golden import golden, golden_case, golden_event_hashes
from vllm_sim import events as vllm

GOLDEN_HASHES = golden("golden-hashes.json")

# SPEC §1.3 (map form, >= 0.24) and §1.4 (positional form, <= 0.23): the same batch.
SPEC_CURRENT_HEX = (
    "93cb41d954fc401000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfec4f29beb1e71e61"
    "a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656401"
)
SPEC_LEGACY_HEX = (
    "93cb41d954fc401000009294ac426c6f636b52656d6f76656491cfec4f29beb1e71e61a34750550091b0416c6c426c6f636b73"
    "436c656172656401"
)
# -- golden: vLLM 0.33.0's own encoding ----------------------------------------------------------------------


def test_golden_event_batch_payload() -> None:
    eb = GOLDEN_HASHES["event_batch"]
    batch = decode_batch(bytes.fromhex(eb["payload_hex"]))
    hashes = golden_event_hashes("doc_summary")
    tokens = golden_case("doc_summary")["token_ids"]

    assert batch.ts == 1764400000.5
    assert batch.dp_rank == 0
    assert batch.unknown_events == 0
    assert [type(e) for e in batch.events] == [BlockStored, BlockStored, BlockRemoved, AllBlocksCleared]
    first, second, removed, _ = batch.events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert isinstance(removed, BlockRemoved)

    assert first.block_hashes == tuple(hashes[0:3])
    assert first.parent is None
    assert first.token_ids == tuple(tokens[0:48])
    assert first.block_size == 16
    assert (first.lora_name, first.medium, first.group_idx, first.kind) == (None, "GPU", 0, "full_attention")
    assert first.extra_keys == (None, None, None)
    assert first.lookahead is False

    assert second.block_hashes == tuple(hashes[3:5])
    assert second.parent == hashes[2]
    assert second.token_ids == tuple(tokens[48:80])
    assert second.extra_keys == (None, None)
    assert (second.medium, second.group_idx, second.kind) == ("GPU", 0, "full_attention")

    assert removed == BlockRemoved(block_hashes=(hashes[4],), medium="GPU", group_idx=0)


def test_golden_frames() -> None:
    eb = GOLDEN_HASHES["event_batch"]
    frames = [bytes.fromhex(f) for f in eb["frames_hex"]]
    topic, seq, payload = parse_frames(frames)
    assert topic == eb["topic"] == "kv@127.0.0.1:8001@Qwen/Qwen3-0.6B"
    assert seq == 7
    assert payload == bytes.fromhex(eb["payload_hex"])


def test_spec_current_and_legacy_forms_decode_equal() -> None:
    current = decode_batch(bytes.fromhex(SPEC_CURRENT_HEX))
    legacy = decode_batch(bytes.fromhex(SPEC_LEGACY_HEX))
    assert current == legacy
    assert current.ts == 1700000000.25
    assert current.dp_rank == 1
    assert current.events == (
        BlockRemoved(block_hashes=(17027874615116373601,), medium="GPU", group_idx=0),
        AllBlocksCleared(),
    )


# -- both forms, encoded with vllm_sim's copies of vLLM's structs (independent of extproc) ---------------------


class _MapFuture(vllm.KVCacheEvent, tag="BlockPromoted"):  # a tag from some future release
    block_hashes: list[int]


def _encode(ts: float, events: list[Any], rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode([ts, events, rank])


def test_bytes_hashes_reduce_to_the_low_64_bits() -> None:
    digest = bytes.fromhex("c6bc808bd9d4d1de6f1596dfc17e2311880fc34d42a0fa18b71bfd862283218f")
    ev = vllm.BlockStored([digest], digest, list(range(16)), 16, None, "GPU", None)
    (stored,) = decode_batch(_encode(1.0, [ev])).events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (golden_event_hashes("doc_summary")[0],)
    assert stored.parent == golden_event_hashes("doc_summary")[0]


def test_int_hashes_are_masked_to_64_bits() -> None:
    ev = ["BlockRemoved", [-1, 2**64 - 1, 5]]
    (removed,) = decode_batch(_encode(1.0, [ev])).events
    assert removed == BlockRemoved(block_hashes=(2**64 - 1, 2**64 - 1, 5))


def test_map_form_ignores_unknown_keys_and_reads_extras() -> None:
    ev = vllm.BlockStored(  # session_id, lookahead_token_ids: fields we do not read, must be ignored
        [1, 2], None, list(range(32)), 16, 7, "CPU", "adapter-x",
        extra_keys=[["tenant-a"], None], group_idx=1, kv_cache_spec_kind="sliding_window",
        session_id="s-1", lookahead_token_ids=[[1], [2]],
    )  # fmt: skip
    (stored,) = decode_batch(_encode(2.0, [ev], rank=3)).events
    assert stored == BlockStored(
        block_hashes=(1, 2), parent=None, token_ids=tuple(range(32)), block_size=16,
        lora_name="adapter-x", medium="CPU", extra_keys=(("tenant-a",), None), group_idx=1,
        kind="sliding_window", lookahead=True,
    )  # fmt: skip


def test_unknown_tags_are_skipped_and_counted() -> None:
    events = [_MapFuture([1]), ["SomethingNew", 1, 2], {"type": "AllBlocksCleared"}]
    batch = decode_batch(_encode(1.0, events))
    assert batch.events == (AllBlocksCleared(),)
    assert batch.unknown_events == 2


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(
            ["BlockStored", [1], None, [0] * 16, 16, None],
            BlockStored((1,), None, (0,) * 16, 16),
            id="0.9-five-fields",
        ),
        pytest.param(
            ["BlockStored", [1], 9, [0] * 16, 16, None, "GPU", "lx", [None], 0, "full_attention", None],
            BlockStored((1,), 9, (0,) * 16, 16, "lx", "GPU", (None,), 0, "full_attention"),
            id="0.23-eleven-fields",
        ),
        pytest.param(
            ["BlockStored", [1], 9, [0] * 16, 16, None, "GPU", "lx", [None], 0, "full_attention", None, "x"],
            BlockStored((1,), 9, (0,) * 16, 16, "lx", "GPU", (None,), 0, "full_attention"),
            id="extra-trailing-field-ignored",
        ),
        pytest.param(["BlockRemoved", [4]], BlockRemoved((4,)), id="0.9-removed"),
        pytest.param(["BlockRemoved", [4], "GPU", 2], BlockRemoved((4,), "GPU", 2), id="0.23-removed"),
        pytest.param(["AllBlocksCleared"], AllBlocksCleared(), id="cleared"),
    ],
)
def test_positional_versions(event: list[Any], expected: Any) -> None:
    assert decode_batch(_encode(1.0, [event])).events == (expected,)


def test_two_element_batch_of_vllm_0_9() -> None:
    batch = decode_batch(msgspec.msgpack.encode([3.5, [["AllBlocksCleared"]]]))
    assert batch == decode_batch(_encode(3.5, [["AllBlocksCleared"]], rank=None))
    assert batch.dp_rank is None


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(bytes.fromhex(SPEC_CURRENT_HEX)[:-5], id="truncated"),
        pytest.param(msgspec.msgpack.encode({"ts": 1}), id="batch-not-array"),
        pytest.param(msgspec.msgpack.encode([1.0]), id="batch-too-short"),
        pytest.param(msgspec.msgpack.encode(["x", []]), id="ts-not-number"),
        pytest.param(_encode(1.0, [["BlockStored", [1], None]]), id="positional-too-short"),
        pytest.param(_encode(1.0, [{"type": "BlockStored"}]), id="map-missing-hashes"),
        pytest.param(_encode(1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]), id="float-hash"),
        pytest.param(_encode(1.0, [{"type": "BlockRemoved", "block_hashes": [True]}]), id="bool-hash"),
        pytest.param(_encode(1.0, [{"type": "BlockRemoved", "block_hashes": [b""]}]), id="empty-bytes-hash"),
        pytest.param(_encode(1.0, [{"no": "type"}]), id="map-without-tag"),
        pytest.param(_encode(1.0, [[5, 1]]), id="positional-int-tag"),
        pytest.param(_encode(1.0, [[]]), id="empty-event"),
        pytest.param(_encode(1.0, [7]), id="event-scalar"),
        pytest.param(_encode(1.0, [{1: 2, "type": "BlockRemoved"}]), id="map-int-key"),
        pytest.param(b"\x93\xcb" + bytes(8) + b"\x91" * 100_000 + b"\xc0\x00", id="deep-nesting"),
    ],
)
def test_garbage_raises_event_decode_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_fuzz_random_bytes_only_raise_event_decode_error(data: bytes) -> None:
    with contextlib.suppress(EventDecodeError):
        decode_batch(data)


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=9),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
    max_leaves=20,
)  # fmt: skip
_event_like = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "X"])},
        optional={k: _msgpack_values for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                                               "medium", "extra_keys", "group_idx")},
    ),
    st.tuples(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"])).map(list)
    | st.lists(_msgpack_values, max_size=12),
    _msgpack_values,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ts=_msgpack_values, events=st.lists(_event_like, max_size=4), rank=_msgpack_values, cut=st.integers(0, 64))
def test_fuzz_structured_payloads_only_raise_event_decode_error(
    ts: Any, events: list[Any], rank: Any, cut: int
) -> None:
    payload = msgspec.msgpack.encode([ts, events, rank])
    for candidate in (payload, payload[: max(0, len(payload) - cut)]):
        with contextlib.suppress(EventDecodeError):
            decode_batch(candidate)


# -- frames and replay ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"", b"\x00" * 8], id="two-frames"),
        pytest.param([b"", b"\x00" * 8, b"x", b"y"], id="four-frames"),
        pytest.param([b"", b"\x00" * 7, b"x"], id="short-seq"),
        pytest.param([b"", b"\x00" * 9, b"x"], id="long-seq"),
        pytest.param([b"\xff\xfe", b"\x00" * 8, b"x"], id="topic-not-utf8"),
    ],
)
def test_bad_frames(frames: list[bytes]) -> None:
    with pytest.raises(EventDecodeError):
        parse_frames(frames)


def test_replay_framing_both_generations() -> None:
    assert replay_request(5) == [b"", b"\x00\x00\x00\x00\x00\x00\x00\x05"]
    seq5 = (5).to_bytes(8, "big")
    assert parse_replay_reply([b"", b"kv@x", seq5, b"p"]) == ReplayItem(5, b"p", "kv@x")  # >= 0.26
    assert parse_replay_reply([b"", seq5, b"p"]) == ReplayItem(5, b"p", None)  # <= 0.25
    assert parse_replay_reply([b"", b"", b"\xff" * 8, b""]) is None  # end marker >= 0.26
    assert parse_replay_reply([b"", b"\xff" * 8, b""]) is None  # end marker <= 0.25
    assert parse_replay_reply([b"", b"", seq5, b""]) is None  # empty payload also ends
    assert END_SEQ == 2**64 - 1
    for bad in ([b"x", seq5, b"p"], [b"", seq5], [b"", b"t", b"\x01", b"p"]):
        with pytest.raises(EventDecodeError):
            parse_replay_reply(bad)
    with pytest.raises(ValueError):
        replay_request(-1)
