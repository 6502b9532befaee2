"""Golden tests against ../shared/vllm: values computed by vLLM 0.33's own code and by transformers."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.support.golden import golden
from vllm_sim.events import (
    AllBlocksCleared,
    BlockRemoved,
    Cleared,
    EventEncoder,
    LegacyAllBlocksCleared,
    LegacyBlockRemoved,
    Removed,
    StoredRun,
)
from vllm_sim.hashing import DEFAULT_NONE_HASH_SEED, BlockHasher, LoraKey, to_event_hash
from vllm_sim.tokenize import ChatInput, PromptTokenizer

_VECTORS = golden("golden-hashes.json")["vectors"]
_CASES = golden("golden-tokens.json")["cases"]


def _vector_id(v: dict[str, Any]) -> str:
    lora = "lora" if v["lora"] else "nolora"
    return f"{v['case']}-{v['algo']}-seed{v['pythonhashseed']}-bs{v['block_size']}-{v['cache_salt']}-{lora}"


def test_golden_files_cover_what_the_issue_lists() -> None:
    combos = {(v["algo"], v["pythonhashseed"], v["block_size"]) for v in _VECTORS}
    assert len(combos) == 8
    assert any(v["cache_salt"] for v in _VECTORS)
    assert any(v["lora"] for v in _VECTORS)


@pytest.mark.parametrize("case", _CASES, ids=[c["name"] for c in _CASES])
def test_tokens_match_golden(tokenizer: PromptTokenizer, case: dict[str, Any]) -> None:
    if case["kind"] == "chat":
        ids = tokenizer.chat_sync(ChatInput(messages=case["messages"], chat_template_kwargs=case["template_kwargs"]))
    else:
        ids = tokenizer.completion_sync(case["prompt"])
    assert ids == case["token_ids"]


@pytest.mark.parametrize("vector", _VECTORS, ids=[_vector_id(v) for v in _VECTORS])
def test_block_hashes_match_golden(golden_tokens: dict[str, Any], vector: dict[str, Any]) -> None:
    seed = vector["pythonhashseed"] if vector["pythonhashseed"] is not None else DEFAULT_NONE_HASH_SEED
    hasher = BlockHasher(vector["algo"], seed, vector["block_size"])
    assert hasher.none_hash.hex() == vector["none_hash_hex"]
    lora = LoraKey(vector["lora"][0], vector["lora"][1], 1) if vector["lora"] else None
    digests = hasher.hash_tokens(golden_tokens[vector["case"]]["token_ids"], lora, vector["cache_salt"])
    assert [to_event_hash(d, True) for d in digests] == vector["event_block_hashes"]
    assert [d.hex() for d in digests[:3]] == vector["digests_hex"]


def test_spec_block_vector_tokens_1000_to_1039() -> None:
    """SPEC §2.3: tokens 1000..1039, block size 16, seed unset."""
    tokens = list(range(1000, 1040))
    sha = BlockHasher("sha256", DEFAULT_NONE_HASH_SEED, 16).hash_tokens(tokens)
    cbor = BlockHasher("sha256_cbor", DEFAULT_NONE_HASH_SEED, 16).hash_tokens(tokens)
    assert [to_event_hash(d, True) for d in sha] == [7322446309363477352, 17027874615116373601]
    assert [to_event_hash(d, True) for d in cbor] == [3753563854825738204, 2378715151359315973]


def _golden_batch_records(golden_tokens: dict[str, Any]) -> list[Any]:
    """The events the golden event_batch describes, as the block pool would record them."""
    tokens = golden_tokens["doc_summary"]["token_ids"]
    d = BlockHasher("sha256", DEFAULT_NONE_HASH_SEED, 16).hash_tokens(tokens)
    return [
        StoredRun(d[0:3], None, tokens[0:48], 16, None, None, [None] * 3),
        StoredRun(d[3:5], d[2], tokens[48:80], 16, None, None, [None] * 2),
        Removed(d[4]),
        Cleared(),
    ]


def test_event_batch_bytes_match_golden(golden_tokens: dict[str, Any]) -> None:
    batch = golden("golden-hashes.json")["event_batch"]
    expected = bytes.fromhex(batch["payload_hex"])
    ours = EventEncoder().encode(_golden_batch_records(golden_tokens), ts=1764400000.5, rank=0)
    assert msgspec.msgpack.decode(ours) == msgspec.msgpack.decode(expected)
    assert ours == expected
    assert bytes.fromhex(batch["frames_hex"][2]) == expected


def test_spec_examples_map_and_legacy_bytes() -> None:
    """SPEC §1.3 and §1.4: the same batch in both encodings."""
    h = 17027874615116373601
    current = EventEncoder().encode_structs(
        [BlockRemoved(block_hashes=[h], medium="GPU", group_idx=0), AllBlocksCleared()], 1700000000.25, 1
    )
    legacy = EventEncoder(legacy=True).encode_structs(
        [LegacyBlockRemoved(block_hashes=[h], medium="GPU", group_idx=0), LegacyAllBlocksCleared()],
        1700000000.25,
        1,
    )
    assert current.hex() == (
        "93cb41d954fc401000009284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfec4f29beb1e71e61"
        "a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656401"
    )
    assert legacy.hex() == (
        "93cb41d954fc401000009294ac426c6f636b52656d6f76656491cfec4f29beb1e71e61a34750550091b0416c6c426c6f636b73"
        "436c656172656401"
    )


def test_legacy_block_stored_is_positional_with_11_fields(golden_tokens: dict[str, Any]) -> None:
    payload = EventEncoder(legacy=True).encode(_golden_batch_records(golden_tokens), ts=1.0)
    _, events, rank = msgspec.msgpack.decode(payload)
    assert rank == 0
    assert events[0][0] == "BlockStored" and len(events[0]) == 12
    assert events[2] == ["BlockRemoved", events[1][1][1:2], "GPU", 0]
    assert events[3] == ["AllBlocksCleared"]


def test_raw_byte_hashes_when_int_hashes_disabled(golden_tokens: dict[str, Any]) -> None:
    records = _golden_batch_records(golden_tokens)
    _, events, _ = msgspec.msgpack.decode(EventEncoder(use_int_hashes=False).encode(records, ts=1.0))
    first = records[0]
    assert events[0]["block_hashes"] == [bytes(h) for h in first.block_hashes]
    assert events[1]["parent_block_hash"] == bytes(first.block_hashes[2])
    assert all(len(h) == 32 for h in events[0]["block_hashes"])
