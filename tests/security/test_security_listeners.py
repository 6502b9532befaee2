"""Listeners bind only where configured: the ext_proc gRPC port and the metrics port on ``listen.host``, no
metrics listener when ``metrics_port`` is off, and the KV-event subscriber binds nothing unless an event
source asks for bind mode (then only on the address it names). Read from /proc: the sockets this process
is actually listening on, before and after.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from pathlib import Path

import pytest
import zmq.asyncio

from extproc.app import App
from extproc.kvcache.ingest import Ingest
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.subscriber import EventSource, KvEventSubscriber
from extproc.types import EndpointId, HashScheme
from tests.support.config import router_config

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def _decode(hex_addr: str) -> tuple[str, int]:
    host_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        ip6 = ipaddress.IPv6Address(words)
        host = str(ip6.ipv4_mapped or ip6)  # gRPC listens on ::ffff:127.0.0.1: still IPv4 loopback only
    return host, int(port_hex, 16)


def listening() -> set[tuple[str, int]]:
    """(host, port) of every TCP socket this process listens on."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                out.add(_decode(fields[1]))
    return out


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics-on", "metrics-off"])
async def test_app_listens_only_on_the_configured_host_and_ports(metrics: bool) -> None:
    before = listening()
    config = router_config(listen={"host": "127.0.0.1", "grpc_port": 0, "metrics_port": 0 if metrics else None})
    app = App(config)
    await app.start()
    try:
        opened = listening() - before
    finally:
        await app.stop()
    expected = {("127.0.0.1", app.grpc_port)} | ({("127.0.0.1", app.metrics_port)} if metrics else set())
    assert opened == expected
    assert listening() - before == set(), "stop() closes every listener"


async def test_event_subscriber_binds_only_in_bind_mode_and_only_where_told() -> None:
    ctx = zmq.asyncio.Context()
    sub = KvEventSubscriber(Ingest(MemoryPrefixIndex(), lambda _e: HashScheme()), context=ctx)
    before = listening()
    try:
        sub.add(EventSource(EndpointId("127.0.0.1:18001"), "tcp://127.0.0.1:1"))  # connect mode: dials out
        await asyncio.sleep(0.3)
        assert listening() - before == set()
        sub.add(EventSource(EndpointId("127.0.0.1:18002"), "tcp://127.0.0.1:*", bind=True))
        for _ in range(100):
            if sub.bound_address(EndpointId("127.0.0.1:18002")):
                break
            await asyncio.sleep(0.02)
        bound = sub.bound_address(EndpointId("127.0.0.1:18002"))
        assert bound is not None
        await asyncio.sleep(0.05)
        opened = listening() - before
    finally:
        await sub.close()
        ctx.destroy(linger=0)
    assert opened == {("127.0.0.1", int(bound.rsplit(":", 1)[1]))}
