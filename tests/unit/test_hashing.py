"""Block hashing: the SPEC's hand-checked vectors, edge cases, and our CBOR encoder against cbor2."""

from __future__ import annotations

import hashlib
import pickle

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.kvcache.hashing import BlockHasher, Unhashable, cbor_block, cbor_int, extra_keys_for, to_event_int
from extproc.types import HashScheme, LoraAdapter

SPEC_TOKENS = list(range(1000, 1040))  # SPEC §2.3: tokens 1000..1039, block size 16, seed unset


@pytest.mark.parametrize(
    ("algo", "seed", "none_hash_hex"),
    [
        ("sha256", None, "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"),
        ("sha256_cbor", None, "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"),
        ("sha256", "0", "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"),
        ("sha256_cbor", "0", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"),
    ],
    ids=["sha256-unset", "cbor-unset", "sha256-seed0", "cbor-seed0"],
)
def test_none_hash_matches_spec_table(algo: str, seed: str | None, none_hash_hex: str) -> None:
    assert BlockHasher(HashScheme(algo=algo, seed=seed)).none_hash().hex() == none_hash_hex


@pytest.mark.parametrize(
    ("algo", "expected"),
    [
        ("sha256", [7322446309363477352, 17027874615116373601]),
        ("sha256_cbor", [3753563854825738204, 2378715151359315973]),
    ],
    ids=["sha256", "sha256_cbor"],
)
def test_spec_block_vector(algo: str, expected: list[int]) -> None:
    assert BlockHasher(HashScheme(block_size=16, algo=algo)).hash_blocks(SPEC_TOKENS) == expected


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor", "builtin", "sha256_cbor_64bit", ""])
def test_other_algorithms_are_rejected(algo: str) -> None:
    with pytest.raises(ValueError, match="unsupported"):
        BlockHasher(HashScheme(algo=algo))


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher(HashScheme(block_size=0))


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize(
    ("n_tokens", "max_blocks", "expected_blocks"),
    [
        (0, None, 0),
        (15, None, 0),
        (16, None, 1),
        (47, None, 2),
        (64, 2, 2),
        (64, 0, 0),
        (64, -3, 0),
        (64, 99, 4),
    ],
    ids=["empty", "partial-only", "one", "tail-dropped", "capped", "cap-zero", "cap-negative", "cap-above"],
)
def test_full_blocks_only_and_max_blocks(
    algo: str, n_tokens: int, max_blocks: int | None, expected_blocks: int
) -> None:
    hasher = BlockHasher(HashScheme(block_size=16, algo=algo))
    tokens = list(range(n_tokens))
    got = hasher.hash_blocks(tokens, max_blocks=max_blocks)
    assert len(got) == expected_blocks
    assert got == hasher.hash_blocks(tokens)[:expected_blocks]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_reference_recipe_with_lora_and_salt(algo: str) -> None:
    """The chain spelled out naively (SPEC §2.7 pseudo-code) equals the optimized one."""
    lora = LoraAdapter("ad", "/p/ad")
    tokens = [5, 151643, 70000, 0, 23, 24, 255, 256, 65535, 65536] * 5
    ser = (lambda o: pickle.dumps(o, protocol=5)) if algo == "sha256" else (lambda o: cbor2.dumps(o, canonical=True))
    parent = hashlib.sha256(ser("vllm-none-hash")).digest()
    expected = []
    for i in range(0, 48, 8):
        extra = [("lora", "ad", "/p/ad")] + ([("cache_salt", "s")] if i == 0 else [])
        parent = hashlib.sha256(ser((parent, tuple(tokens[i : i + 8]), tuple(extra)))).digest()
        expected.append(parent)
    hasher = BlockHasher(HashScheme(block_size=8, algo=algo))
    assert hasher.hash_digests(tokens, lora=lora, cache_salt="s") == expected
    assert hasher.hash_blocks(tokens, lora=lora, cache_salt="s") == [to_event_int(d) for d in expected]


@pytest.mark.parametrize(
    ("lora", "salt", "first", "rest"),
    [
        (None, None, None, None),
        (None, "", None, None),
        (None, "t", (("cache_salt", "t"),), None),
        (LoraAdapter("a", "/a"), None, (("lora", "a", "/a"),), (("lora", "a", "/a"),)),
        (LoraAdapter("a", "/a"), "t", (("lora", "a", "/a"), ("cache_salt", "t")), (("lora", "a", "/a"),)),
    ],
    ids=["plain", "empty-salt", "salt", "lora", "lora-then-salt"],
)
def test_extra_keys_order_and_placement(
    lora: LoraAdapter | None, salt: str | None, first: object, rest: object
) -> None:
    assert extra_keys_for(lora, salt) == (first, rest)


def test_prefix_of_tokens_gives_prefix_of_hashes() -> None:
    hasher = BlockHasher(HashScheme(block_size=4, algo="sha256_cbor"))
    tokens = list(range(100, 140))
    assert hasher.hash_blocks(tokens[:21]) == hasher.hash_blocks(tokens)[:5]


def test_to_event_int_is_low_64_bits_big_endian() -> None:
    digest = bytes(range(32))
    assert to_event_int(digest) == int.from_bytes(digest, "big") & (2**64 - 1) == 0x18191A1B1C1D1E1F


def test_bool_tokens_do_not_poison_the_cbor_memo() -> None:
    hasher = BlockHasher(HashScheme(block_size=2, algo="sha256_cbor"))
    clean = BlockHasher(HashScheme(block_size=2, algo="sha256_cbor"))
    hasher.hash_blocks([True, 7])  # outside the contract; must not change later answers for ints
    assert hasher.hash_blocks([1, 7]) == clean.hash_blocks([1, 7])


tokens_st = st.lists(
    st.one_of(
        st.integers(min_value=0, max_value=300_000),
        st.integers(min_value=-(2**64), max_value=2**64 - 1),
        st.integers(min_value=-(2**70), max_value=2**70),
    ),
    max_size=300,
)
extras_st = st.one_of(
    st.none(),
    st.lists(st.tuples(st.sampled_from(["lora", "cache_salt"]), st.text(max_size=40)), min_size=1, max_size=3).map(
        tuple
    ),
)


@settings(max_examples=300, deadline=None)
@given(token=st.integers(min_value=-(2**70), max_value=2**70))
def test_cbor_int_equals_cbor2(token: int) -> None:
    assert cbor_int(token) == cbor2.dumps(token, canonical=True)


@settings(max_examples=300, deadline=None)
@given(parent=st.binary(min_size=0, max_size=40), tokens=tokens_st, extra=extras_st)
def test_cbor_block_equals_cbor2(parent: bytes, tokens: list[int], extra: object) -> None:
    ours = cbor_block(parent, [cbor_int(t) for t in tokens], cbor2.dumps(extra, canonical=True))
    assert ours == cbor2.dumps((parent, tuple(tokens), extra), canonical=True)


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=80), size=st.integers(1, 30))
def test_fast_cbor_chain_equals_cbor2_chain(tokens: list[int], size: int) -> None:
    hasher = BlockHasher(HashScheme(block_size=size, algo="sha256_cbor"))
    parent, expected = hasher.none_hash(), []
    for i in range(0, len(tokens) - size + 1, size):
        parent = hashlib.sha256(cbor2.dumps((parent, tuple(tokens[i : i + size]), None), canonical=True)).digest()
        expected.append(parent)
    assert hasher.hash_digests(tokens) == expected


def test_cbor_memo_limit_falls_back_to_direct_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import extproc.kvcache.hashing as hashing

    monkeypatch.setattr(hashing, "_MEMO_LIMIT", 3)
    hasher = BlockHasher(HashScheme(block_size=4, algo="sha256_cbor"))
    tokens = list(range(100_000, 100_012))
    first, second = hasher.hash_blocks(tokens), hasher.hash_blocks(tokens)
    assert first == second == BlockHasher(HashScheme(block_size=4, algo="sha256_cbor")).hash_blocks(tokens)
    assert len(hasher._memo) == 3


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_tuple_and_list_inputs_agree(algo: str) -> None:
    hasher = BlockHasher(HashScheme(block_size=16, algo=algo))
    assert hasher.hash_blocks(tuple(SPEC_TOKENS)) == hasher.hash_blocks(SPEC_TOKENS)


def test_a_salt_sha256_cbor_cannot_encode_is_unhashable() -> None:
    """A lone surrogate (JSON ``"\\ud800"``) has no CBOR text encoding: no block keys exist, here as in vLLM."""
    hasher = BlockHasher(HashScheme(block_size=4, algo="sha256_cbor"))
    with pytest.raises(Unhashable):
        hasher.hash_blocks(list(range(8)), cache_salt="\ud800")
    assert len(BlockHasher(HashScheme(block_size=4)).hash_blocks(list(range(8)), cache_salt="\ud800")) == 2
