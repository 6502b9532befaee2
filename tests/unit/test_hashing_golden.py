"""Every vector of ``../shared/vllm/golden-hashes.json`` (vLLM 0.33.0's own hashing code) against ours."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.kvcache.hashing import BlockHasher, to_event_int
from extproc.types import HashScheme, LoraAdapter
from tests.support.golden import golden, golden_case


def _tokens(case: str) -> list[int]:
    return list(golden_case(case)["token_ids"])


def _vectors() -> list[Any]:
    return list(golden("golden-hashes.json")["vectors"])


def _vector_id(v: dict[str, Any]) -> str:
    lora = "lora" if v["lora"] else "nolora"
    return f"{v['case']}-{v['algo']}-seed={v['pythonhashseed']}-B{v['block_size']}-salt={v['cache_salt']}-{lora}"


VECTORS = _vectors()


def _hasher_and_args(v: dict[str, Any]) -> tuple[BlockHasher, dict[str, Any]]:
    hasher = BlockHasher(HashScheme(block_size=v["block_size"], algo=v["algo"], seed=v["pythonhashseed"]))
    lora = LoraAdapter(name=v["lora"][0], path=v["lora"][1]) if v["lora"] else None
    return hasher, {"lora": lora, "cache_salt": v["cache_salt"]}


def test_golden_file_has_every_combination() -> None:
    combos = {(v["algo"], v["pythonhashseed"], v["block_size"], v["cache_salt"], bool(v["lora"])) for v in VECTORS}
    assert len(VECTORS) == 168 and len(combos) == 24


@pytest.mark.parametrize("vector", VECTORS, ids=[_vector_id(v) for v in VECTORS])
def test_event_block_hashes_match_vllm(vector: dict[str, Any]) -> None:
    hasher, kwargs = _hasher_and_args(vector)
    tokens = _tokens(vector["case"])
    assert hasher.none_hash().hex() == vector["none_hash_hex"]
    assert hasher.hash_blocks(tokens, **kwargs) == vector["event_block_hashes"]


@pytest.mark.parametrize("vector", VECTORS, ids=[_vector_id(v) for v in VECTORS])
def test_full_digests_match_vllm(vector: dict[str, Any]) -> None:
    hasher, kwargs = _hasher_and_args(vector)
    digests = hasher.hash_digests(_tokens(vector["case"]), **kwargs)
    assert [d.hex() for d in digests[: len(vector["digests_hex"])]] == vector["digests_hex"]
    assert [to_event_int(d) for d in digests] == vector["event_block_hashes"]
