"""The seam between the ext_proc adapter and the router: what the servicer calls, and what it may get back."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from extproc.types import EndpointId, HttpRequest, PassThrough, Route


class RouteHandler(Protocol):
    """Decides where one HTTP request goes; the servicer calls ``route`` once per request.

    When: after the request headers (header-only requests, body mode NONE) or once the whole body has arrived
    (BUFFERED, FULL_DUPLEX_STREAMED).
    Returns: ``Route`` (pick and fallbacks, plus summary headers for the upstream) or ``PassThrough``.
    Raises: ``extproc.errors.RouterError`` subclasses, which become HTTP errors for the client. Any other
    exception (or exceeding the servicer's ``route_timeout_s``) is logged and the request passes through
    untouched, so Envoy's fallback balancing serves it.
    """

    async def route(self, request: HttpRequest) -> Route | PassThrough: ...


@runtime_checkable
class ServedListener(Protocol):
    """Optional extra a ``RouteHandler`` may implement: learn which endpoint Envoy actually used.

    When: a ``response_headers`` message carries ``envoy.lb`` / ``x-gateway-destination-endpoint-served``
    (needs ``close_after_pick=False`` and Envoy's ``response_header_mode: SEND``). Quick; may be async.
    """

    def on_served(self, request_id: str, endpoint: EndpointId) -> object: ...


@runtime_checkable
class BodyListener(Protocol):
    """Optional extra a ``RouteHandler`` may implement: a request's body is on its way.

    When: once per request decided on its body (BUFFERED), in the event loop's turn after the one that answered
    its headers, before the body's message is read. Our HTTP/2 server has written the headers reply to the socket
    by then (grpc.aio may still hold it), so the picker would otherwise wait out that round trip to Envoy: work
    done here (e.g. reading load answers that arrived) is work the decision does not do on the request's path.
    Quick and synchronous; it must not raise.
    """

    def body_coming(self) -> None: ...
