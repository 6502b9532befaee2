"""The PrefixIndex contract when writers claim chains (``Chain``): answers stay exact, on every backend.

Hashes here come from a tree (each hash has one parent, as block hashes do) and every request is a path from a
root, as the router's are. The Redis backend may then bisect instead of walking; these tests hold it to the
same answers as a plain walk over a reference, through removals in the middle, continuations of unknown
parents, parents stored after their children, expiry and clears.
"""

from __future__ import annotations

import random

import pytest

from extproc.kvcache.index import Chain, PrefixIndex
from extproc.types import BlockHash, EndpointId
from tests.contract.harness import Harness

from .test_prefix_index import _reference_match, chain, nz

E1, E2, E3 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")


def path(n: int, base: int = 7_000_000) -> list[BlockHash]:
    """A prompt's ``n`` block hashes (one root-to-leaf path)."""
    return chain(n, base)


async def test_chained_prefixes_of_different_lengths(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(40)
    eps = [EndpointId(f"10.0.1.{i}:8000") for i in range(12)]
    for i, e in enumerate(eps):
        await index.store(e, blocks[: 3 * i + 1], chain=Chain.from_root())
    want = {e: min(40, 3 * i + 1) for i, e in enumerate(eps)}
    assert nz(await index.match(blocks, eps)) == want
    assert nz(await index.match(blocks[:5], eps)) == {e: min(5, n) for e, n in want.items()}
    assert nz(await index.match(blocks + path(3, base=9), eps)) == want  # longer than anything held


async def test_a_continuation_extends_its_parent_run(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(8)
    await index.store(E1, blocks[:4], chain=Chain.from_root())
    await index.store(E1, blocks[4:], chain=Chain.after(blocks[3]))
    assert nz(await index.match(blocks, [E1])) == {E1: 8}


async def test_a_continuation_of_an_unknown_parent_is_no_run_until_the_parent_comes(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(8)
    await index.store(E1, blocks[4:], chain=Chain.after(blocks[3]))  # e.g. after a purge
    await index.store(E2, blocks, chain=Chain.from_root())
    assert nz(await index.match(blocks, [E1, E2])) == {E2: 8}
    await index.store(E1, blocks[:4], chain=Chain.from_root())  # the parents arrive later
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 8, E2: 8}


async def test_removing_a_middle_block_cuts_the_run_and_storing_it_again_restores_it(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(10)
    await index.store(E1, blocks, chain=Chain.from_root())
    await index.store(E2, blocks, chain=Chain.from_root())
    await index.remove(E1, blocks[4:5])
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 4, E2: 10}
    await index.store(E1, blocks[4:5], chain=Chain.after(blocks[3]))
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 10, E2: 10}


async def test_leaf_first_eviction_shortens_the_run(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(10)
    await index.store(E1, blocks, chain=Chain.from_root())
    await index.remove(E1, blocks[:5:-1])  # blocks 9..6, tail first, as vLLM evicts
    assert nz(await index.match(blocks, [E1])) == {E1: 6}
    await index.remove(E1, blocks[5:6])
    await index.remove(E1, blocks[4:5])
    assert nz(await index.match(blocks, [E1])) == {E1: 4}


async def test_one_store_of_several_segments(harness: Harness) -> None:
    index = await harness.make()
    a, b = path(6), path(5, base=8_000_000)
    await index.store(E1, a[:3], chain=Chain.from_root())
    # One call: a's blocks 3..5 after a[2], then a second prompt's first blocks.
    await index.store(E1, a[3:] + b[:2], chain=Chain(((0, a[2]), (3, None))))
    assert nz(await index.match(a, [E1])) == {E1: 6}
    assert nz(await index.match(b, [E1])) == {E1: 2}


async def test_unclaimed_and_claimed_stores_mix(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(6)
    await index.store(E1, blocks[:3])  # no claim
    await index.store(E1, blocks[3:], chain=Chain.after(blocks[2]))
    await index.store(E2, [blocks[0], blocks[2]], chain=None)
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 6, E2: 1}


async def test_a_chained_entry_expires(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(6)
    await index.store(E1, blocks[:3], chain=Chain.from_root())
    await index.store(E1, blocks[3:], ttl_s=harness.ttl_unit_s, chain=Chain.after(blocks[2]))
    await index.store(E2, blocks[:2], ttl_s=harness.ttl_unit_s, chain=Chain.from_root())
    await index.store(E2, blocks[2:], chain=Chain.after(blocks[1]))  # children outlive their expiring parents
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 6, E2: 6}
    await harness.advance(harness.ttl_unit_s * 1.5)
    assert nz(await index.match(blocks, [E1, E2])) == {E1: 3}


async def test_clear_then_chained_stores_again(harness: Harness) -> None:
    index = await harness.make()
    blocks = path(6)
    await index.store(E1, blocks, chain=Chain.from_root())
    await index.remove(E1, blocks[1:2])
    await index.clear(E1)
    assert nz(await index.match(blocks, [E1])) == {}
    await index.store(E1, blocks[:4], chain=Chain.from_root())
    assert nz(await index.match(blocks, [E1])) == {E1: 4}


class Tree:
    """Random prompts sharing prefixes: node i's parent is some node before it (or none: a root)."""

    def __init__(self, rng: random.Random, size: int) -> None:
        self.parent: list[int | None] = []
        for i in range(size):
            self.parent.append(None if i == 0 or rng.random() < 0.1 else rng.randrange(max(0, i - 8), i))
        self.hash = [BlockHash(rng.getrandbits(64)) for _ in range(size)]

    def path(self, node: int) -> list[int]:
        out = []
        cur: int | None = node
        while cur is not None:
            out.append(cur)
            cur = self.parent[cur]
        return out[::-1]


@pytest.mark.parametrize("seed", range(6))
async def test_random_chained_operations_agree_with_a_reference(harness: Harness, seed: int) -> None:
    rng = random.Random(seed)
    tree = Tree(rng, 120)
    index: PrefixIndex = await harness.make()
    eps = [EndpointId(f"10.0.2.{i}:8000") for i in range(5)]
    held: dict[EndpointId, set[BlockHash]] = {e: set() for e in eps}
    for _ in range(60):
        e, roll = rng.choice(eps), rng.random()
        nodes = tree.path(rng.randrange(len(tree.parent)))
        if roll < 0.5:  # a chained store of part of a path (after an ancestor, held or not), maybe two parts
            cut = rng.randrange(len(nodes))
            part = nodes[cut:]
            parent = None if cut == 0 else tree.hash[nodes[cut - 1]]
            hashes = [tree.hash[x] for x in part]
            segments: list[tuple[int, BlockHash | None]] = [(0, parent)]
            if rng.random() < 0.3:
                other = tree.path(rng.randrange(len(tree.parent)))
                segments.append((len(hashes), None))
                hashes += [tree.hash[x] for x in other]
            await index.store(e, hashes, chain=Chain(tuple(segments)))
            held[e].update(hashes)
        elif roll < 0.6:  # an unclaimed store
            hashes = [tree.hash[x] for x in rng.sample(nodes, rng.randint(1, len(nodes)))]
            await index.store(e, hashes)
            held[e].update(hashes)
        elif roll < 0.8:  # leaf-first eviction of a path's tail
            tail = [tree.hash[x] for x in nodes[rng.randrange(len(nodes)) :]][::-1]
            await index.remove(e, tail)
            held[e].difference_update(tail)
        elif roll < 0.95:  # any block
            victim = tree.hash[rng.choice(nodes)]
            await index.remove(e, [victim])
            held[e].discard(victim)
        else:
            await index.clear(e)
            held[e].clear()
        request = [tree.hash[x] for x in tree.path(rng.randrange(len(tree.parent)))]
        assert nz(await index.match(request, eps)) == _reference_match(held, request, eps)
