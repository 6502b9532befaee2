"""``CachedHasher`` answers exactly as ``BlockHasher`` for any history of prompts, and reuses what it can."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.kvcache.hash_cache import CHUNK_BLOCKS, CachedHasher
from extproc.kvcache.hashing import BlockHasher
from extproc.types import HashScheme, LoraAdapter

LORA = LoraAdapter("sql", "/adapters/sql")


def schemes() -> st.SearchStrategy[HashScheme]:
    return st.builds(
        HashScheme,
        block_size=st.sampled_from([1, 4, 16]),
        algo=st.sampled_from(["sha256", "sha256_cbor"]),
        seed=st.sampled_from([None, "0"]),
    )


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[list[int], LoraAdapter | None, str | None]]:
    """Prompts that share prefixes with earlier ones (as real traffic does), some with LoRA or a salt."""
    base = draw(st.lists(st.integers(0, 2**20), min_size=0, max_size=600))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        cut = draw(st.integers(0, len(base)))
        tail = draw(st.lists(st.integers(0, 2**20), max_size=200))
        lora = draw(st.sampled_from([None, LORA]))
        salt = draw(st.sampled_from([None, "", "tenant-a"]))
        out.append((base[:cut] + tail, lora, salt))
        if draw(st.booleans()):
            base = base[:cut] + tail
    return out


@settings(max_examples=150, deadline=None)
@given(scheme=schemes(), history=histories(), as_array=st.booleans(), max_bytes=st.sampled_from([0, 3000, 1 << 20]))
def test_equal_to_the_plain_hasher_for_any_history(scheme, history, as_array, max_bytes) -> None:
    plain, cached = BlockHasher(scheme), CachedHasher(BlockHasher(scheme), max_bytes=max_bytes)
    for tokens, lora, salt in history:
        given_tokens = array("I", tokens) if as_array else tokens
        assert cached.hash_blocks(given_tokens, lora=lora, cache_salt=salt) == plain.hash_blocks(
            tokens, lora=lora, cache_salt=salt
        )
    assert cached.stats.bytes <= max(max_bytes, 0) or cached.stats.entries == 0


def test_a_repeat_prompt_hashes_nothing_and_an_extension_only_its_new_chunk() -> None:
    scheme = HashScheme(block_size=16, algo="sha256_cbor")
    cached = CachedHasher(BlockHasher(scheme))
    rng = random.Random(0)
    doc = [rng.randrange(150_000) for _ in range(16 * CHUNK_BLOCKS * 4)]  # 4 whole chunks
    cached.hash_blocks(doc)
    assert cached.start(doc).missing_blocks == 0
    grown = doc + [rng.randrange(150_000) for _ in range(16 * 3)]
    pending = cached.start(grown)
    assert len(pending.known) == 4 * CHUNK_BLOCKS and pending.missing_blocks == 3
    assert cached.finish(pending) == BlockHasher(scheme).hash_blocks(grown)


def test_a_divergence_rehashes_at_most_one_chunk_before_it() -> None:
    scheme = HashScheme(block_size=16)
    cached = CachedHasher(BlockHasher(scheme))
    doc = list(range(16 * CHUNK_BLOCKS * 3))
    cached.hash_blocks(doc)
    edited = doc.copy()
    edited[16 * (CHUNK_BLOCKS + 5)] += 1  # block 37 differs: chunk 0 is reused, chunks 1-2 are hashed
    pending = cached.start(edited)
    assert len(pending.known) == CHUNK_BLOCKS
    assert cached.finish(pending) == BlockHasher(scheme).hash_blocks(edited)


def test_salt_and_lora_are_part_of_the_key() -> None:
    scheme = HashScheme(block_size=4)
    cached = CachedHasher(BlockHasher(scheme))
    tokens = list(range(4 * CHUNK_BLOCKS * 2))
    cached.hash_blocks(tokens)
    for lora, salt in ((LORA, None), (None, "s"), (LORA, "s")):
        assert cached.start(tokens, lora=lora, cache_salt=salt).known == []
        assert cached.hash_blocks(tokens, lora=lora, cache_salt=salt) == BlockHasher(scheme).hash_blocks(
            tokens, lora=lora, cache_salt=salt
        )


def test_bools_and_huge_ids_are_hashed_but_never_cached() -> None:
    scheme = HashScheme(block_size=1, algo="sha256_cbor")
    cached = CachedHasher(BlockHasher(scheme))
    for tokens in ([True, 2, 3], [2**40, 1]):
        assert cached.hash_blocks(tokens) == BlockHasher(scheme).hash_blocks(tokens)
    assert cached.stats.entries == 0
    assert cached.hash_blocks([1, 2, 3]) == BlockHasher(scheme).hash_blocks([1, 2, 3])  # not [True, 2, 3]'s


def test_the_cache_stays_within_its_budget() -> None:
    cached = CachedHasher(BlockHasher(HashScheme(block_size=16)), max_bytes=64 * 1024)
    rng = random.Random(1)
    for _ in range(50):
        cached.hash_blocks([rng.randrange(1000) for _ in range(16 * CHUNK_BLOCKS)])
    assert 0 < cached.stats.bytes <= 64 * 1024
    assert cached.stats.miss_blocks == 50 * CHUNK_BLOCKS


def test_growing_sessions_recall_their_whole_chunks_in_one_step_and_stay_one_entry_each() -> None:
    scheme = HashScheme(block_size=16)
    cached, plain = CachedHasher(BlockHasher(scheme)), BlockHasher(scheme)
    rng = random.Random(2)
    tools = [rng.randrange(150_000) for _ in range(16 * CHUNK_BLOCKS * 2)]  # two chunks every session shares
    sessions = [tools + [rng.randrange(150_000) for _ in range(16 * CHUNK_BLOCKS * 3)] for _ in range(3)]
    for turn in range(6):
        for s, context in enumerate(sessions):
            sessions[s] = context + [rng.randrange(150_000) for _ in range(rng.randint(20, 700))]
            pending = cached.start(sessions[s])
            whole = (len(context) // 16) // CHUNK_BLOCKS * CHUNK_BLOCKS
            if turn:  # the previous turn's whole chunks at least, from the remembered turn (never walked)
                assert len(pending.known) >= whole and pending._recalled is not None
            assert cached.finish(pending) == plain.hash_blocks(sessions[s])
    assert len(cached._prompts) == 3  # each session's latest turn replaced its earlier ones


@pytest.mark.parametrize("edit_at", [0, 16 * CHUNK_BLOCKS * 4 + 3, 16 * CHUNK_BLOCKS * 5 - 1, -1])
def test_a_remembered_prompt_edited_anywhere_hashes_as_the_plain_hasher(edit_at: int) -> None:
    scheme = HashScheme(block_size=16, algo="sha256_cbor")
    cached = CachedHasher(BlockHasher(scheme))
    doc = list(range(16 * CHUNK_BLOCKS * 6 + 5))
    cached.hash_blocks(doc)
    edited = doc.copy()
    edited[edit_at] += 1
    for prompt in (edited, doc[: 16 * CHUNK_BLOCKS * 5], doc + [1, 2, 3] * 40, doc):
        assert cached.hash_blocks(prompt) == BlockHasher(scheme).hash_blocks(prompt)
