"""A tiny authoritative DNS server on 127.0.0.1 for tests: A records per name, UDP and TCP, changeable live.

    async with LoopbackDns({"vllm-pods.llm.svc.cluster.local": ["127.0.0.1", "127.0.0.2"]}) as dns:
        dns.port                       # UDP and TCP on 127.0.0.1:port
        dns.records[name] = [...]      # answers change at once
        dns.servfail.add(name)         # answer SERVFAIL for name
        dns.silent = True              # drop every query (a timeout for the client)

Unknown names get NXDOMAIN. Over UDP, an answer with more than ``udp_max_records`` records is sent truncated
(TC bit, no records), as a real server does past 512 bytes, so the client must retry over TCP.
Also usable from synchronous tests: ``start_in_thread()`` / ``stop_thread()`` run it on its own loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import threading
from typing import Any


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    labels = []
    while data[offset]:
        length = data[offset]
        labels.append(data[offset + 1 : offset + 1 + length].decode())
        offset += 1 + length
    return ".".join(labels).lower(), offset + 1


class LoopbackDns:
    def __init__(self, records: dict[str, list[str]] | None = None, udp_max_records: int = 8) -> None:
        self.records: dict[str, list[str]] = {k.lower(): v for k, v in (records or {}).items()}
        self.servfail: set[str] = set()
        self.silent = False
        self.udp_max_records = udp_max_records
        self.queries: list[tuple[str, str]] = []  # (transport, name)
        self.port = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def answer(self, query: bytes, transport: str) -> bytes | None:
        qid, _flags, qdcount = struct.unpack_from("!HHH", query)
        name, end = _read_name(query, 12)
        qtype, _ = struct.unpack_from("!HH", query, end)
        question = query[12 : end + 4]
        self.queries.append((transport, name))
        if self.silent:
            return None
        addresses = self.records.get(name)
        rcode = 2 if name in self.servfail else (3 if addresses is None else 0)
        answers = [] if qtype != 1 or rcode else list(addresses or [])
        truncated = transport == "udp" and len(answers) > self.udp_max_records
        if truncated:
            answers = []
        flags = 0x8000 | 0x0400 | 0x0100 | 0x0080 | rcode | (0x0200 if truncated else 0)
        out = struct.pack("!HHHHHH", qid, flags, 1, len(answers), 0, 0) + question
        for ip in answers:  # name as a pointer to the question (offset 12), type A, class IN, ttl 5
            out += struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + ipaddress.IPv4Address(ip).packed
        return out

    # -- asyncio -------------------------------------------------------------------------------------------
    async def start(self) -> LoopbackDns:
        loop = asyncio.get_running_loop()
        server = self

        class Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: Any) -> None:
                reply = server.answer(data, "udp")
                if reply is not None:
                    self.transport.sendto(reply, addr)

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                reply = server.answer(await reader.readexactly(length), "tcp")
                if reply is not None:
                    writer.write(struct.pack("!H", len(reply)) + reply)
                    await writer.drain()
            finally:
                writer.close()

        # one port for both: bind TCP first on a free port, then UDP on the same number
        for _ in range(20):
            self._tcp = await asyncio.start_server(tcp, "127.0.0.1", 0)
            self.port = self._tcp.sockets[0].getsockname()[1]
            try:
                transport, _ = await loop.create_datagram_endpoint(
                    Udp, local_addr=("127.0.0.1", self.port), family=socket.AF_INET
                )
            except OSError:
                self._tcp.close()
                continue
            self._transport = transport  # type: ignore[assignment]
            return self
        raise RuntimeError("no port free for both UDP and TCP")

    async def stop(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()

    async def __aenter__(self) -> LoopbackDns:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- from synchronous code -----------------------------------------------------------------------------
    def start_in_thread(self) -> LoopbackDns:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="loopback-dns", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("loopback DNS did not start")
        return self

    def stop_thread(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
