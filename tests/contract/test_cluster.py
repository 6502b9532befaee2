"""The Redis backend on a local 3-primary Valkey Cluster (``redis+cluster://``), beyond the contract suite
(which runs against the cluster too, as the ``redis-cluster`` harness): one namespace = one slot = one node,
namespaces spread over nodes, and the shared load and the event-stream leases on the same cluster."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.crc import key_slot

from extproc.redis.client import client_for, redis_client
from extproc.redis.leases import StreamLeases
from extproc.redis.prefix_index import FencedOut, RedisPrefixIndex
from extproc.redis.shared_load import SharedLoad
from extproc.types import BlockHash, EndpointId
from tests.support.polling import until
from tests.support.valkey_cluster import ValkeyCluster, command

pytestmark = pytest.mark.redis

E1, E2 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")
H = [BlockHash(i * 7919 + 3) for i in range(64)]


def _node_of(cluster: ValkeyCluster, slot: int) -> int:
    return next(port for (lo, hi), port in cluster.slot_map().items() if lo <= slot <= hi)


def _namespaces_on_distinct_nodes(cluster: ValkeyCluster, run: str) -> list[tuple[str, int, int]]:
    """One namespace per node: (namespace, its slot, the port of the node serving it)."""
    found: dict[int, tuple[str, int, int]] = {}
    for i in range(1000):
        ns = f"pool{i}-{run}"
        slot = key_slot(f"{{{ns}}}:m".encode())
        port = _node_of(cluster, slot)
        found.setdefault(port, (ns, slot, port))
        if len(found) == 3:
            break
    return sorted(found.values(), key=lambda f: f[2])


def test_the_scheme_picks_the_client() -> None:
    assert isinstance(redis_client("redis+cluster://127.0.0.1:7000"), aioredis.RedisCluster)
    assert isinstance(redis_client("rediss+cluster://127.0.0.1:7000"), aioredis.RedisCluster)
    assert isinstance(redis_client("redis://127.0.0.1:6379/0"), aioredis.Redis)


async def test_namespaces_land_on_different_nodes_and_work_side_by_side(valkey_cluster: ValkeyCluster) -> None:
    placed = _namespaces_on_distinct_nodes(valkey_cluster, str(time.monotonic_ns()))
    print("\nslot ranges -> node:", valkey_cluster.slot_map())
    for ns, slot, port in placed:
        print(f"namespace {ns!r}: slot {slot} -> node 127.0.0.1:{port}")
    assert len({port for _, _, port in placed}) == 3

    indexes = [await RedisPrefixIndex.connect(valkey_cluster.url, namespace=ns, timeout_s=2.0) for ns, _, _ in placed]
    try:
        # Different contents per namespace, written concurrently: each stays in its own namespace.
        await asyncio.gather(*(ix.store(E1, H[: 8 * (k + 1)]) for k, ix in enumerate(indexes)))
        await indexes[1].store(E2, H[:5])
        results = await asyncio.gather(*(ix.match(H, [E1, E2]) for ix in indexes))
        assert results[0] == {E1: 8}
        assert results[1] == {E1: 16, E2: 5}
        assert results[2] == {E1: 24}

        # Each namespace's keys live on its own node only (COUNTKEYSINSLOT counts that node's own keyspace).
        for ns, slot, port in placed:
            for other in valkey_cluster.ports:
                with redis.Redis(host="127.0.0.1", port=other, socket_timeout=5.0) as node:
                    n = int(command(node, "CLUSTER", "COUNTKEYSINSLOT", slot))
                assert (n > 0) == (other == port), (ns, slot, port, other, n)

        await indexes[0].clear(E1)
        assert await indexes[0].match(H, [E1]) == {}
        assert await indexes[2].match(H, [E1]) == {E1: 24}  # untouched by the other namespace's clear
    finally:
        for ix in indexes:
            await ix.close()


async def test_shared_load_on_the_cluster(valkey_cluster: ValkeyCluster) -> None:
    placed = _namespaces_on_distinct_nodes(valkey_cluster, f"load{time.monotonic_ns()}")
    loads = [
        SharedLoad.from_url(valkey_cluster.url, namespace=ns, prefill_tokens_per_s=1.0, timeout_s=2.0)
        for ns, _, _ in placed
    ]
    try:
        for k, load in enumerate(loads):
            await load.add(E1, 1000 * (k + 1))
        for k, load in enumerate(loads):
            queued = await load.queued([E1, E2])
            assert queued[E2] == 0.0
            assert 1000 * (k + 1) - 50 <= queued[E1] <= 1000 * (k + 1)  # drains at 1 token/s
        await loads[0].forget(E1)
        assert (await loads[0].queued([E1]))[E1] == 0.0
    finally:
        for load in loads:
            await load.close()


async def test_concurrent_first_calls_on_a_fresh_client_all_answer(valkey_cluster: ValkeyCluster) -> None:
    """A router's first burst lands on a cold cluster client. redis-py 8.1 routes a cold client's keyed calls
    to its default node (MOVED) and every 5th MOVED closes all its connections, in-flight calls' included:
    before ``call_within`` initialized the client first, most of these rounds lost calls."""
    for round_ in range(5):
        load = SharedLoad.from_url(
            valkey_cluster.url, namespace=f"cold{round_}{time.monotonic_ns()}", prefill_tokens_per_s=1.0, timeout_s=5.0
        )
        try:
            done = await asyncio.gather(*(load.add(E1, 10) for _ in range(32)), return_exceptions=True)
            assert [d for d in done if d is not None] == []
            assert 300 <= (await load.queued([E1]))[E1] <= 320  # every add counted: 320, draining 1 token/s
        finally:
            await load.close()


async def test_leases_and_fencing_on_the_cluster(valkey_cluster: ValkeyCluster) -> None:
    ns = f"lease{time.monotonic_ns()}"
    client_a, client_b = client_for(valkey_cluster.url, 2.0), client_for(valkey_cluster.url, 2.0)
    index_a = RedisPrefixIndex(client_a, namespace=ns, timeout_s=2.0)
    index_b = RedisPrefixIndex(client_b, namespace=ns, timeout_s=2.0)
    a = StreamLeases(client_a, "a", namespace=ns, ttl_s=0.6, timeout_s=2.0)
    b = StreamLeases(client_b, "b", namespace=ns, ttl_s=0.6, timeout_s=2.0)
    try:
        for leases in (a, b):
            leases.follow(E1)
        a.hearing(E1, True)
        a.start()
        await until(lambda: (s := a.status(E1)) is not None and s.token is not None)
        assert a.take(E1)
        assert await a.writes(index_a).store(E1, H[:4])  # fenced write with a's token: accepted
        first = a.status(E1)
        assert first is not None and first.token is not None
        await a.close()  # releases: b (now hearing the engine) takes over with the next token
        b.hearing(E1, True)
        b.start()
        await until(lambda: (s := b.status(E1)) is not None and s.token is not None)
        second = b.status(E1)
        assert second is not None and second.token == first.token + 1
        with pytest.raises(FencedOut):
            await index_a.store(E1, H[4:8], fence=first.token)  # the deposed token is refused
        assert await index_b.match(H, [E1]) == {E1: 4}
    finally:
        await a.close()
        await b.close()
        await index_a.close()
        await index_b.close()


async def test_an_unreachable_cluster_is_unavailable_not_a_crash() -> None:
    """redis-py's cluster errors (``RedisClusterException``) are not ``RedisError``s: they must still map to
    the backends' own 'Redis is down' errors, so callers fall back instead of failing the request."""
    from extproc.kvcache.index import IndexUnavailable
    from extproc.redis.shared_load import SharedLoadUnavailable
    from tests.support.ports import free_port

    url = f"redis+cluster://127.0.0.1:{free_port()}"  # nothing listens there
    index = RedisPrefixIndex.from_url(url, timeout_s=1.0)
    load = SharedLoad.from_url(url, namespace="down", prefill_tokens_per_s=1.0, timeout_s=1.0)
    try:
        with pytest.raises(IndexUnavailable):
            await index.match(H, [E1])
        with pytest.raises(IndexUnavailable):
            await RedisPrefixIndex.connect(url, timeout_s=1.0)
        with pytest.raises(SharedLoadUnavailable):
            await load.queued([E1])
    finally:
        await index.close()
        await load.close()


def test_a_cluster_url_with_a_db_is_refused() -> None:
    from pydantic import ValidationError

    from tests.support.config import router_config

    router_config(index={"backend": "redis", "url": "redis+cluster://127.0.0.1:7000/0"})
    with pytest.raises(ValidationError, match="only db 0"):
        router_config(index={"backend": "redis", "url": "redis+cluster://127.0.0.1:7000/3"})


async def test_the_app_runs_its_index_load_and_leases_on_the_cluster(valkey_cluster: ValkeyCluster) -> None:
    from extproc.app import App
    from tests.support.config import router_config

    ns = f"app{time.monotonic_ns()}"
    index_cfg = {"backend": "redis", "url": valkey_cluster.url, "namespace": ns, "timeout_s": 2.0}
    app = App(router_config(index=index_cfg))
    try:
        assert isinstance(app.precise, RedisPrefixIndex) and app.feed.leases is not None
        assert app.shared_load is not None
        await app.precise.store(E1, H[:3])
        assert await app.precise.match(H, [E1]) == {E1: 3}
        await app.shared_load.add(E1, 100)
        assert (await app.shared_load.queued([E1]))[E1] > 0
    finally:
        await app.stop()
