"""DNS endpoint discovery: the model servers are the A records of one name (a Kubernetes headless Service,
whose A records are its ready pods' IPs), each at the same port.

``DnsResolver`` asks one nameserver directly (UDP, then TCP when the answer is truncated, as a headless
Service with many pods makes it); it never consults or changes the system resolver's configuration beyond
reading the first ``nameserver`` line of ``/etc/resolv.conf`` when none is given. ``DnsDiscovery`` re-resolves
every ``interval_s`` and reports each change of the ``ip:port`` set; a failed lookup keeps the last set, and
only an answer that really has no records (NXDOMAIN, or NOERROR with no A record) empties it.

Wire format (RFC 1035 §4): a 12-byte header ``id, flags, qdcount, ancount, nscount, arcount`` (big-endian u16
each), the question ``name type=A(1) class=IN(1)``, then resource records ``name type class ttl(u32) rdlength
rdata``; names are length-prefixed labels ending in a zero byte, or a 2-byte pointer (top bits ``11``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from extproc.tasks import stop_task
from extproc.types import EndpointId

log = logging.getLogger(__name__)

DNS_PORT = 53
_TYPE_A = 1
_CLASS_IN = 1
_FLAG_RD = 0x0100  # recursion desired: a cluster resolver (CoreDNS) answers for any name
_FLAG_QR = 0x8000
_FLAG_TC = 0x0200
_RCODE_NXDOMAIN = 3
_MAX_UDP = 4096


class DnsError(Exception):
    """The lookup failed (timeout, refused, SERVFAIL, malformed answer): the endpoint set is unknown."""


@dataclass(frozen=True, slots=True)
class DnsAnswer:
    rcode: int
    truncated: bool
    addresses: tuple[str, ...]  # IPv4 addresses of the A records, in answer order


def encode_query(query_id: int, name: str) -> bytes:
    """An A/IN query for ``name`` (trailing dot optional). Raises ``DnsError`` for an invalid name."""
    labels = [label for label in name.rstrip(".").split(".") if label]
    if not labels or any(len(label.encode()) > 63 for label in labels):
        raise DnsError(f"invalid DNS name {name!r}")
    qname = b"".join(bytes([len(label.encode())]) + label.encode() for label in labels) + b"\0"
    header = struct.pack("!HHHHHH", query_id, _FLAG_RD, 1, 0, 0, 0)
    return header + qname + struct.pack("!HH", _TYPE_A, _CLASS_IN)


def _skip_name(data: bytes, offset: int) -> int:
    """Offset just past the (possibly compressed) name at ``offset``."""
    while True:
        if offset >= len(data):
            raise DnsError("truncated name")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2
        if length == 0:
            return offset + 1
        offset += 1 + length


def parse_response(data: bytes, query_id: int) -> DnsAnswer:
    """Decode an answer to our query ``query_id``. Raises ``DnsError`` if it is not one or is malformed."""
    if len(data) < 12:
        raise DnsError("short DNS message")
    rid, flags, qdcount, ancount, _, _ = struct.unpack_from("!HHHHHH", data)
    if rid != query_id or not flags & _FLAG_QR:
        raise DnsError("not the answer to our query")
    try:
        offset = 12
        for _ in range(qdcount):
            offset = _skip_name(data, offset) + 4
        addresses = []
        for _ in range(ancount):
            offset = _skip_name(data, offset)
            rtype, rclass, _ttl, rdlength = struct.unpack_from("!HHIH", data, offset)
            offset += 10
            rdata = data[offset : offset + rdlength]
            if len(rdata) != rdlength:
                raise DnsError("truncated record")
            offset += rdlength
            if rtype == _TYPE_A and rclass == _CLASS_IN and rdlength == 4:
                addresses.append(str(ipaddress.IPv4Address(rdata)))
    except struct.error as exc:
        raise DnsError(f"malformed DNS message: {exc}") from None
    return DnsAnswer(flags & 0x000F, bool(flags & _FLAG_TC), tuple(addresses))


def system_nameserver(resolv_conf: Path = Path("/etc/resolv.conf")) -> tuple[str, int]:
    """The first ``nameserver`` of ``resolv_conf`` (in a pod: the cluster DNS). Raises ``DnsError``."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError as exc:
        raise DnsError(f"cannot read {resolv_conf}: {exc}") from None
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            return parts[1], DNS_PORT
    raise DnsError(f"no nameserver in {resolv_conf}")


class DnsResolver:
    """A-record lookups against one nameserver (``host``, ``port``), each bounded by ``timeout_s``."""

    def __init__(self, nameserver: tuple[str, int], timeout_s: float = 1.0) -> None:
        self._server = nameserver
        self._timeout_s = timeout_s
        self._family = socket.AF_INET6 if ":" in nameserver[0] else socket.AF_INET

    async def resolve(self, name: str) -> tuple[str, ...]:
        """The IPv4 addresses ``name`` has now; empty if it has none. Raises ``DnsError`` on failure."""
        query_id = random.randrange(1 << 16)
        query = encode_query(query_id, name)
        try:
            answer = await asyncio.wait_for(self._udp(query, query_id), self._timeout_s)
            if answer.truncated:
                answer = await asyncio.wait_for(self._tcp(query, query_id), self._timeout_s)
        except (TimeoutError, OSError) as exc:
            raise DnsError(f"lookup of {name} at {self._server[0]}:{self._server[1]} failed: {exc!r}") from None
        if answer.rcode == _RCODE_NXDOMAIN:
            return ()
        if answer.rcode != 0:
            raise DnsError(f"lookup of {name} answered rcode {answer.rcode}")
        return answer.addresses

    async def _udp(self, query: bytes, query_id: int) -> DnsAnswer:
        loop = asyncio.get_running_loop()
        with socket.socket(self._family, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, self._server)
            await loop.sock_sendall(sock, query)
            while True:  # skip stray datagrams (late answers to an earlier, timed-out query)
                data = await loop.sock_recv(sock, _MAX_UDP)
                with contextlib.suppress(DnsError):
                    return parse_response(data, query_id)

    async def _tcp(self, query: bytes, query_id: int) -> DnsAnswer:
        reader, writer = await asyncio.open_connection(*self._server)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return parse_response(await reader.readexactly(length), query_id)
        except asyncio.IncompleteReadError as exc:
            raise DnsError("DNS server closed the TCP connection early") from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class DnsDiscovery:
    """Keeps the endpoint set ``{ip:port for each A record of name}`` current; owns one background loop.

    ``on_change(endpoints)`` is called with the whole new set after the first successful lookup and after
    every change; it must be quick (it runs on the event loop).
    """

    def __init__(
        self,
        resolver: DnsResolver,
        name: str,
        port: int,
        *,
        interval_s: float,
        on_change: Callable[[frozenset[EndpointId]], None],
    ) -> None:
        self._resolver = resolver
        self._name = name
        self._port = port
        self._interval_s = interval_s
        self._on_change = on_change
        self._current: frozenset[EndpointId] | None = None
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> frozenset[EndpointId] | None:
        """The last set found (None before the first successful lookup)."""
        return self._current

    async def refresh(self) -> bool:
        """One lookup; reports a changed set. Returns False (and keeps the last set) if the lookup failed."""
        try:
            addresses = await self._resolver.resolve(self._name)
        except DnsError as exc:
            if not self._failing:
                log.warning("discovery: %s; keeping %d known endpoints", exc, len(self._current or ()))
            self._failing = True
            return False
        if self._failing:
            log.info("discovery: %s resolves again", self._name)
        self._failing = False
        found = frozenset(EndpointId(f"{ip}:{self._port}") for ip in addresses)
        if found != self._current:
            log.info("discovery: %s -> %s", self._name, sorted(found))
            self._current = found
            self._on_change(found)
        return True

    async def start(self) -> None:
        """One lookup now (so the first endpoints are known before serving), then the loop."""
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name=f"dns discovery {self._name}")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop discovery
                log.exception("discovery loop of %s", self._name)
