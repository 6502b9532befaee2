"""The PrefixIndex behaviour contract, run against every backend (see conftest.py)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from extproc.types import BlockHash, EndpointId
from tests.contract.harness import Harness

E1, E2, E3 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
MASK64 = 2**64 - 1


def hs(*values: int) -> list[BlockHash]:
    return [BlockHash(v) for v in values]


def chain(n: int, base: int = 1_000_000) -> list[BlockHash]:
    """``n`` distinct, well-spread 64-bit hashes."""
    return [BlockHash((base + i) * 0x9E3779B97F4A7C15 & MASK64) for i in range(n)]


def nz(result: Mapping[EndpointId, int]) -> dict[EndpointId, int]:
    """Backends may omit endpoints holding nothing; compare without zeros."""
    return {e: n for e, n in result.items() if n}


async def test_longest_leading_run(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(6)
    await index.store(E1, blocks[:4])
    assert nz(await index.match(blocks, [E1])) == {E1: 4}
    assert nz(await index.match(blocks[:2], [E1])) == {E1: 2}
    assert nz(await index.match(chain(1, base=5) + blocks, [E1])) == {}  # block 0 missing: no run


async def test_gap_stops_the_run(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(6)
    await index.store(E1, [blocks[0], blocks[1], blocks[3], blocks[4], blocks[5]])
    assert nz(await index.match(blocks, [E1])) == {E1: 2}


async def test_endpoints_are_independent(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(5)
    await index.store(E1, blocks)
    await index.store(E2, blocks[:2])
    await index.store(E3, blocks[1:])  # missing block 0: holds no leading run
    assert nz(await index.match(blocks, [E1, E2, E3])) == {E1: 5, E2: 2}


async def test_endpoint_dropping_out_early_does_not_stop_others(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(8)
    await index.store(E1, blocks[:1])
    await index.store(E2, blocks[:3])
    await index.store(E3, blocks)
    assert nz(await index.match(blocks, [E1, E2, E3])) == {E1: 1, E2: 3, E3: 8}


async def test_only_requested_endpoints_are_returned(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(3)
    await index.store(E1, blocks)
    await index.store(E2, blocks)
    assert nz(await index.match(blocks, [E2])) == {E2: 3}
    assert set(await index.match(blocks, [E2, E3])) <= {E2, E3}


async def test_unknown_endpoints_and_hashes(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(3)
    assert nz(await index.match(blocks, [E1, E2])) == {}
    await index.store(E1, blocks)
    assert nz(await index.match(chain(3, base=7), [E1])) == {}
    assert nz(await index.match(blocks, [EndpointId("nobody:1")])) == {}
    await index.remove(E2, blocks)  # unknown endpoint: no error
    await index.remove(E1, chain(2, base=9))  # unknown hashes: no error
    await index.clear(E3)
    assert nz(await index.match(blocks, [E1])) == {E1: 3}


async def test_empty_inputs(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(3)
    await index.store(E1, [])
    await index.remove(E1, [])
    assert nz(await index.match([], [E1])) == {}
    await index.store(E1, blocks)
    assert nz(await index.match([], [E1])) == {}
    assert nz(await index.match(blocks, [])) == {}


async def test_store_is_idempotent(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(4)
    await index.store(E1, blocks)
    await index.store(E1, blocks)
    await index.store(E1, blocks[:2])
    assert nz(await index.match(blocks, [E1])) == {E1: 4}
    await index.remove(E1, blocks[3:])
    assert nz(await index.match(blocks, [E1])) == {E1: 3}


async def test_duplicate_hashes_in_a_request(harness: Harness) -> None:
    index = await harness.make()
    a, b = chain(2)
    await index.store(E1, [a, b])
    assert nz(await index.match([a, a, b], [E1])) == {E1: 3}


async def test_remove_truncates_the_run_on_that_endpoint_only(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(5)
    await index.store(E1, blocks)
    await index.store(E2, blocks)
    await index.remove(E1, [blocks[2]])
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 2, E2: 5}
    await index.remove(E1, [blocks[0]])
    assert nz(await index.match(blocks, [E1, E2])) == {E2: 5}


async def test_clear_forgets_only_that_endpoint(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(4)
    await index.store(E1, blocks)
    await index.store(E2, blocks)
    await index.clear(E1)
    assert nz(await index.match(blocks, [E1, E2])) == {E2: 4}
    await index.store(E1, blocks[:1])  # usable again after a clear
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 1, E2: 4}
    await index.clear(E1)
    await index.clear(E1)  # twice: no error
    await index.clear(E2)
    assert nz(await index.match(blocks, [E1, E2])) == {}


async def test_ttl_expiry(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(4)
    ttl = harness.ttl_unit_s
    await index.store(E1, blocks, ttl_s=ttl)
    await index.store(E2, blocks)  # no ttl: never expires
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 4, E2: 4}
    await harness.advance(ttl * 1.5)
    assert nz(await index.match(blocks, [E1, E2])) == {E2: 4}


async def test_ttl_refresh_extends_expiry(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(3)
    ttl = harness.ttl_unit_s
    await index.store(E1, blocks, ttl_s=ttl)
    await harness.advance(ttl * 0.6)
    await index.store(E1, blocks[:2], ttl_s=ttl)  # refresh the first two only
    await harness.advance(ttl * 0.6)  # block 2 expired, blocks 0-1 still valid
    assert nz(await index.match(blocks, [E1])) == {E1: 2}


async def test_expired_block_in_the_middle_truncates_the_run(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(4)
    ttl = harness.ttl_unit_s
    await index.store(E1, blocks)
    await index.store(E1, [blocks[1]], ttl_s=ttl)  # re-stored with a ttl: now expires
    await harness.advance(ttl * 1.5)
    assert nz(await index.match(blocks, [E1])) == {E1: 1}


async def test_store_without_ttl_after_ttl_makes_it_permanent(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(2)
    ttl = harness.ttl_unit_s
    await index.store(E1, blocks, ttl_s=ttl)
    await index.store(E1, blocks)
    await harness.advance(ttl * 1.5)
    assert nz(await index.match(blocks, [E1])) == {E1: 2}


async def test_expired_entries_can_be_stored_again(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(2)
    ttl = harness.ttl_unit_s
    await index.store(E1, blocks, ttl_s=ttl)
    await harness.advance(ttl * 1.5)
    await index.store(E1, blocks, ttl_s=ttl)
    assert nz(await index.match(blocks, [E1])) == {E1: 2}
    await index.clear(E1)
    assert nz(await index.match(blocks, [E1])) == {}


async def test_large_inputs(harness: Harness) -> None:
    index = await harness.make()
    blocks = chain(8192)
    await index.store(E1, blocks)
    await index.store(E2, blocks[:5000] + blocks[5001:])
    await index.store(E3, blocks[:100])
    assert nz(await index.match(blocks, [E1, E2, E3])) == {E1: 8192, E2: 5000, E3: 100}
    await index.remove(E1, blocks[8000:])
    assert nz(await index.match(blocks, [E1])) == {E1: 8000}
    await index.clear(E1)
    assert nz(await index.match(blocks, [E1, E2])) == {E2: 5000}


async def test_many_endpoints_each_with_its_own_run(harness: Harness) -> None:
    """20 endpoints (more than any small-set fast path), endpoint i holding the first i blocks."""
    index = await harness.make()
    blocks = chain(25)
    eps = [EndpointId(f"10.1.0.{i}:8000") for i in range(20)]
    for i, e in enumerate(eps):
        await index.store(e, blocks[:i])
    await index.store(eps[19], blocks[5:6], ttl_s=harness.ttl_unit_s)  # block 5 will expire on eps[19]
    expected = {e: i for i, e in enumerate(eps) if i}
    assert nz(await index.match(blocks, eps)) == expected
    assert nz(await index.match(blocks, eps[::-1] + eps)) == expected  # order and duplicates do not matter
    await harness.advance(harness.ttl_unit_s * 1.5)
    assert nz(await index.match(blocks, eps)) == {**expected, eps[19]: 5}
    assert nz(await index.match(blocks, eps[15:])) == {eps[15]: 15, eps[16]: 16, eps[17]: 17, eps[18]: 18,
                                                       eps[19]: 5}  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([MASK64, MASK64 - 1, 2**63, 2**63 - 1], id="near-2**64"),
        pytest.param([0, 1, MASK64], id="zero-and-max"),
        pytest.param([2**32, 2**32 - 1, 2**53 + 1, 2**53], id="float-precision-traps"),
    ],
)
async def test_64_bit_hash_values(harness: Harness, values: list[int]) -> None:
    index = await harness.make()
    blocks = hs(*values)
    await index.store(E1, blocks)
    assert nz(await index.match(blocks, [E1])) == {E1: len(values)}
    # A neighbouring value must not collide (e.g. through float conversion): 2**53+1 vs 2**53.
    for v in values:
        await index.store(E2, hs(v))
        neighbour = next(n for n in (v ^ 1, v ^ 2, v ^ 3) if n not in values)
        assert nz(await index.match(hs(neighbour), [E2])) == {}
        await index.clear(E2)
    await index.remove(E1, blocks[1:2])
    assert nz(await index.match(blocks, [E1])) == {E1: 1}


def _reference_match(
    held: Mapping[EndpointId, set[int]], hashes: Sequence[int], endpoints: Sequence[EndpointId]
) -> dict[EndpointId, int]:
    out: dict[EndpointId, int] = {}
    for e in endpoints:
        n = 0
        for h in hashes:
            if h not in held.get(e, set()):
                break
            n += 1
        if n:
            out[e] = n
    return out


@pytest.mark.parametrize("seed", range(4))
async def test_random_operations_agree_with_a_reference(harness: Harness, seed: int) -> None:
    """Random store/remove/clear/match sequences over a small key space, checked against a naive model."""
    rng = random.Random(seed)
    index = await harness.make()
    universe = chain(12)
    endpoints = [E1, E2, E3]
    held: dict[EndpointId, set[int]] = {e: set() for e in endpoints}
    for _ in range(60):
        op = rng.random()
        e = rng.choice(endpoints)
        picked = rng.sample(universe, rng.randint(0, 6))
        if op < 0.45:
            await index.store(e, picked)
            held[e] |= set(picked)
        elif op < 0.65:
            await index.remove(e, picked)
            held[e] -= set(picked)
        elif op < 0.7:
            await index.clear(e)
            held[e].clear()
        else:
            query = universe[: rng.randint(0, 12)]
            asked = rng.sample(endpoints, rng.randint(0, 3))
            assert nz(await index.match(query, asked)) == _reference_match(held, query, asked)


# -- capacity / LRU (every backend) -------------------------------------------------------------------------


async def test_capacity_evicts_least_recently_stored(harness: Harness) -> None:
    index = await harness.make(capacity_blocks=4)
    a, b, c, d, e = chain(5)
    await index.store(E1, [a, b])
    await index.store(E1, [c, d])
    await index.store(E1, [a, b])  # refresh: now c, d are the oldest
    await index.store(E1, [e])
    # Within one store the tail counts as older (vLLM evicts a request's tail first): d goes before c.
    assert nz(await index.match([c, d], [E1])) == {E1: 1}
    assert nz(await index.match([a, b], [E1])) == {E1: 2}
    assert nz(await index.match([e], [E1])) == {E1: 1}
    await index.store(E1, [a])  # a refreshed; the oldest now: c
    await index.store(E1, [d])
    assert nz(await index.match([c], [E1])) == {}
    assert nz(await index.match([a, b], [E1])) == {E1: 2}


async def test_capacity_keeps_the_prefix_of_an_oversized_store(harness: Harness) -> None:
    index = await harness.make(capacity_blocks=3)
    blocks = chain(10)
    await index.store(E1, blocks)
    assert nz(await index.match(blocks, [E1])) == {E1: 3}


async def test_capacity_is_per_endpoint(harness: Harness) -> None:
    caps = {E1: 2, E2: None}
    index = await harness.make(capacity_blocks=lambda ep: caps.get(ep))
    blocks = chain(6)
    await index.store(E1, blocks)
    await index.store(E2, blocks)
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 2, E2: 6}
