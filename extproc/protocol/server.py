"""The grpc.aio server: our ExternalProcessor servicer plus the gRPC health service.

Usage (from the composition root)::

    options = ProcessorOptions(max_body_bytes=32 << 20, route_timeout_s=2.0)
    server = await start_server(router, host="0.0.0.0", port=9002, options=options, ready=False)
    ...                                   # when the router has its endpoints and tokenizers:
    await server.set_ready(True)
    ...
    await server.stop(grace_s=5)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc import wire
from extproc.protocol import constants
from extproc.protocol.exchange import Exchange, ProcessorOptions
from extproc.protocol.h2_server import start_h2_server
from extproc.protocol.handler import RouteHandler
from extproc.protocol.pb import external_processor_pb2, external_processor_pb2_grpc

pb = external_processor_pb2
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ExternalProcessorService:
    """``envoy.service.ext_proc.v3.ExternalProcessor``: one ``Process`` call per HTTP request."""

    def __init__(self, handler: RouteHandler, options: ProcessorOptions) -> None:
        self._handler = handler
        self._options = options

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Answer each message; return (ending the stream) once the exchange is finished."""
        exchange = Exchange(self._handler, self._options)
        async for message in request_iterator:
            for reply in await exchange.receive(message):
                yield reply
            if exchange.finished:
                return


class RunningServer:
    """A started server: its bound ``port``, readiness control, and ``stop``."""

    def __init__(self, server: grpc.aio.Server, checker: health.aio.HealthServicer, port: int) -> None:
        self._server = server
        self._health = checker
        self.port = port

    async def set_ready(self, ready: bool) -> None:
        """Flip the ``readiness`` health status (gateways stop sending traffic while NOT_SERVING)."""
        await self._health.set(wire.HEALTH_READINESS, _SERVING if ready else _NOT_SERVING)

    async def stop(self, grace_s: float | None = None) -> None:
        """Report NOT_SERVING everywhere, then stop; open streams get ``grace_s`` to finish."""
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)


def max_receive(options: ProcessorOptions, max_receive_bytes: int | None = None) -> int:
    """The largest gRPC message accepted: ``max_receive_bytes``, else 64 MiB or the body limit + 1 MiB."""
    # A BUFFERED body arrives as one gRPC message; leave room for headers and framing.
    return max_receive_bytes or max(constants.DEFAULT_MAX_RECEIVE_BYTES, options.max_body_bytes + (1 << 20))


async def _health_servicer(ready: bool) -> health.aio.HealthServicer:
    servicer = health.aio.HealthServicer()
    for name in constants.ALWAYS_SERVING:
        await servicer.set(name, _SERVING)
    await servicer.set(wire.HEALTH_READINESS, _SERVING if ready else _NOT_SERVING)
    return servicer


async def start_server(
    handler: RouteHandler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    options: ProcessorOptions = ProcessorOptions(),  # noqa: B008  (frozen dataclass)
    max_receive_bytes: int | None = None,
    ready: bool = True,
) -> RunningServer:
    """Build and start the server on ``host:port`` (0 = any free port; see ``RunningServer.port``).

    ``max_receive_bytes`` defaults to 64 MiB, or ``options.max_body_bytes`` + 1 MiB if larger (grpcio's own
    default of 4 MiB would reject BUFFERED bodies). ``ready=False`` starts ``readiness`` as NOT_SERVING.
    Raises ``RuntimeError`` if the port cannot be bound.
    """
    limit = max_receive(options, max_receive_bytes)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit)])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(  # type: ignore[no-untyped-call]
        ExternalProcessorService(handler, options), server
    )
    health_servicer = await _health_servicer(ready)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"cannot bind ext_proc server to {host}:{port}")
    await server.start()
    return RunningServer(server, health_servicer, bound)


GrpcServerKind = Literal["grpcio", "h2"]
"""Which gRPC stack serves ext_proc: grpcio's ``grpc.aio`` (the reference) or our own over ``h2``
(``extproc.protocol.h2_server``: the same exchange for a fraction of the CPU)."""


class ExtProcServer(Protocol):
    """What the composition root needs of a started ext_proc server, whichever stack serves it."""

    port: int

    async def set_ready(self, ready: bool) -> None: ...

    async def stop(self, grace_s: float | None = None) -> None: ...


async def start_ext_proc(
    handler: RouteHandler,
    *,
    kind: GrpcServerKind,
    host: str = "127.0.0.1",
    port: int = 0,
    options: ProcessorOptions = ProcessorOptions(),  # noqa: B008  (frozen dataclass)
    ready: bool = True,
) -> ExtProcServer:
    """``start_server`` or ``h2_server.start_h2_server`` by ``kind``; the same health services and limits."""
    if kind == "h2":
        return await start_h2_server(
            handler, host=host, port=port, options=options, max_receive_bytes=max_receive(options), ready=ready
        )
    return await start_server(handler, host=host, port=port, options=options, ready=ready)
