"""A real Envoy in front of two tiny upstreams, calling our ext_proc server: the product-rendered bootstrap.

Used only by test_extproc_envoy.py (marked ``envoy``). Envoy runs the bootstrap ``extproc envoy-config``
renders (``tests/support/envoy.start_envoy`` over ``EnvoyOptions``), made strict for these tests: fail
closed (a picker error reaches the client) and a 5 s message timeout. Everything binds to 127.0.0.1; every
process and server started here is stopped on exit.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from extproc.wire import DESTINATION_HEADER, REASON_HEADER
from tests.support.envoy import start_envoy


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "port": request.transport.get_extra_info("sockname")[1] if request.transport else None,
            "len": len(body),
            "sha": hashlib.sha256(body).hexdigest(),
            "dest": request.headers.get(DESTINATION_HEADER),
            "reason": request.headers.get(REASON_HEADER),
        }
    )


@asynccontextmanager
async def upstreams(n: int) -> AsyncIterator[list[int]]:
    """``n`` HTTP servers on free ports answering any request with JSON describing what they received."""
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", _echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        for _ in range(n):
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield [int(address[1]) for address in runner.addresses]
    finally:
        await runner.cleanup()


@asynccontextmanager
async def envoy(
    workdir: Path, extproc_port: int, models: list[int], body_mode: str, *, response_headers: bool = False
) -> AsyncIterator[str]:
    """Envoy with ext_proc in ``body_mode`` (``BUFFERED`` or ``FULL_DUPLEX_STREAMED``), fail-closed, and
    override_host over the ``models`` ports; yields its base URL once it is ready, stops it on exit.

    ``response_headers``: also send response headers to ext_proc, with the served endpoint in ``envoy.lb``.
    """
    endpoints = [f"127.0.0.1:{port}" for port in models]
    proc = await asyncio.to_thread(
        start_envoy, endpoints, workdir, picker_port=extproc_port, body_mode=body_mode.lower(),
        failure_mode_allow=False, message_timeout_s=5.0, send_response_headers=response_headers,
    )  # fmt: skip
    try:
        yield proc.url()
    finally:
        await asyncio.to_thread(proc.stop)
