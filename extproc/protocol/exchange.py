"""One ext_proc stream (= one HTTP request): a small state machine from messages in to replies out.

Body modes, as Envoy states them in ``protocol_config`` on the first message:
- NONE (and STREAMED, GRPC): decide on the headers; the body, if any, is not ours to wait for.
- BUFFERED (and BUFFERED_PARTIAL; also assumed when Envoy sends no ``protocol_config``): answer the headers
  with an empty reply, decide on the one body message (a ``BodyListener`` handler is told the body is coming
  once the reply is out: the round trip before the body is the picker's to use).
- FULL_DUPLEX_STREAMED: answer nothing until the body ends (``end_of_stream`` or ``request_trailers``), then
  send the headers reply carrying the decision, then echo the body back in <= 62,000-byte chunks.
A request whose headers end the stream (``GET /v1/models``) is decided on the headers in every mode.
After the decision the exchange is ``finished`` (the servicer closes the stream: "close-after-pick") unless
``close_after_pick`` is off, in which case response-path messages get empty replies.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass

from google.protobuf import struct_pb2

from extproc.errors import BodyTooLarge, RouterError
from extproc.protocol import constants, inbound, outbound
from extproc.protocol.handler import BodyListener, RouteHandler, ServedListener
from extproc.protocol.pb import external_processor_pb2, processing_mode_pb2
from extproc.types import EndpointId, Route

pb = external_processor_pb2
Mode = processing_mode_pb2.ProcessingMode
_DECIDE_AT_HEADERS = frozenset({Mode.NONE, Mode.STREAMED, Mode.GRPC})
log = logging.getLogger(__name__)
Replies = list[pb.ProcessingResponse]


@dataclass(frozen=True, slots=True)
class ProcessorOptions:
    """How the servicer treats every stream."""

    max_body_bytes: int = constants.DEFAULT_MAX_BODY_BYTES  # larger bodies get 413 (Envoy has no cap in FULL_DUPLEX)
    route_timeout_s: float | None = None  # fail open (pass through) when the handler takes longer
    close_after_pick: bool = True  # end the stream once answered; False keeps it for the response path


@dataclass(slots=True)
class _Decision:
    """Either an ImmediateResponse (``refusal``) or the mutation to apply (empty for pass-through)."""

    refusal: pb.ProcessingResponse | None
    common: pb.CommonResponse
    metadata: struct_pb2.Struct | None = None


class Exchange:
    """State of one stream; ``receive`` is called for each message in order and returns the replies."""

    def __init__(self, handler: RouteHandler, options: ProcessorOptions) -> None:
        self._handler = handler
        self._options = options
        self._mode: int | None = None  # request body mode from protocol_config
        self._response_mode: int | None = None
        self._headers: dict[str, str] = {}
        self._request_id = ""
        self._body = bytearray()
        self._subset: tuple[EndpointId, ...] | None = None
        self._decided = False
        self._received_at_s: float | None = None  # the first message's arrival (the router's answer budget)
        self.finished = False

    async def receive(self, message: pb.ProcessingRequest) -> Replies:
        """Replies to send for ``message``, in order (possibly none); sets ``finished`` when done."""
        if self._received_at_s is None:
            self._received_at_s = time.monotonic()
        if message.HasField("protocol_config") and self._mode is None:
            self._mode = message.protocol_config.request_body_mode
            self._response_mode = message.protocol_config.response_body_mode
        if message.HasField("metadata_context") and self._subset is None:
            self._subset = inbound.subset_hint(message.metadata_context)
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._on_headers(message.request_headers)
        if kind == "request_body":
            return await self._on_body(message.request_body)
        if kind == "request_trailers":
            return await self._on_trailers()
        return await self._on_response_path(kind, message)

    async def _on_headers(self, headers: pb.HttpHeaders) -> Replies:
        self._headers = inbound.header_dict(headers.headers.headers)
        self._request_id = inbound.request_id_of(self._headers)
        if headers.end_of_stream or self._mode in _DECIDE_AT_HEADERS:
            decision = await self._decide()
            return self._finish(decision, [outbound.headers_reply(decision.common, decision.metadata)])
        if self._mode == Mode.FULL_DUPLEX_STREAMED:
            return []  # the headers reply must carry the decision: hold it until the body is complete
        if isinstance(self._handler, BodyListener):  # after this reply is written, while Envoy sends the body
            asyncio.get_running_loop().call_soon(self._handler.body_coming)
        return [outbound.headers_reply(pb.CommonResponse(), None)]

    async def _on_body(self, body: pb.HttpBody) -> Replies:
        if self._decided:  # e.g. STREAMED chunks with close_after_pick off: let them pass
            return [outbound.body_reply(pb.CommonResponse(), None)]
        if len(self._body) + len(body.body) > self._options.max_body_bytes:
            limit = self._options.max_body_bytes
            err = BodyTooLarge(f"Request body exceeds the limit of {limit} bytes.", param=None)
            return self._finish(_Decision(outbound.error_response(err), pb.CommonResponse()), [])
        self._body += body.body
        if self._mode != Mode.FULL_DUPLEX_STREAMED:
            decision = await self._decide()
            return self._finish(decision, [outbound.body_reply(decision.common, decision.metadata)])
        if not body.end_of_stream:
            return []
        return await self._finish_duplex(trailers=False)

    async def _on_trailers(self) -> Replies:
        if self._decided:
            return [outbound.trailers_reply()]
        if self._mode == Mode.FULL_DUPLEX_STREAMED:
            return await self._finish_duplex(trailers=True)
        # BUFFERED request ended by trailers before any body reply: the headers already went, so only the
        # envoy.lb metadata can still carry the pick
        decision = await self._decide()
        return self._finish(decision, [outbound.trailers_reply(decision.metadata)])

    async def _finish_duplex(self, *, trailers: bool) -> Replies:
        decision = await self._decide()
        replies = [outbound.headers_reply(decision.common, decision.metadata)]
        replies += outbound.streamed_chunks(bytes(self._body), end_of_stream=not trailers)
        if trailers:
            replies.append(outbound.trailers_reply())
        return self._finish(decision, replies)

    def _finish(self, decision: _Decision, replies: Replies) -> Replies:
        self._decided = True
        if decision.refusal is not None:
            self.finished = True
            return [decision.refusal]
        self.finished = self._options.close_after_pick
        return replies

    async def _decide(self) -> _Decision:
        request = inbound.build_request(
            self._headers, bytes(self._body), self._subset, self._request_id, self._received_at_s
        )
        try:
            async with asyncio.timeout(self._options.route_timeout_s):  # no extra task, unlike wait_for
                answer = await self._handler.route(request)
        except RouterError as err:
            return _Decision(outbound.error_response(err), pb.CommonResponse())
        except Exception:  # fail open: Envoy's own balancing serves the request
            log.exception("route handler failed; passing request %s through", request.request_id)
            return _Decision(None, pb.CommonResponse())
        if isinstance(answer, Route) and answer.endpoints:
            common, metadata = outbound.route_mutation(answer)
            return _Decision(None, common, metadata)
        return _Decision(None, pb.CommonResponse())

    async def _on_response_path(self, kind: str | None, message: pb.ProcessingRequest) -> Replies:
        if kind == "response_headers":
            await self._notify_served(message)
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
        if kind == "response_body":
            return [self._response_body_reply(message.response_body)]
        if kind == "response_trailers":
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []  # a message kind we do not know: nothing to answer

    def _response_body_reply(self, body: pb.HttpBody) -> pb.ProcessingResponse:
        if self._response_mode != Mode.FULL_DUPLEX_STREAMED:
            return pb.ProcessingResponse(response_body=pb.BodyResponse())
        chunk = pb.StreamedBodyResponse(body=body.body, end_of_stream=body.end_of_stream)
        common = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=chunk))
        return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))

    async def _notify_served(self, message: pb.ProcessingRequest) -> None:
        endpoint = inbound.served_endpoint(message.metadata_context)
        if endpoint is None or not isinstance(self._handler, ServedListener):
            return
        request_id = self._request_id
        try:
            result = self._handler.on_served(request_id, endpoint)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_served hook failed for request %s", request_id)
