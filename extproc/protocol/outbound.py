"""Pure mapping from the router's answers (``Route``, ``PassThrough``, ``RouterError``) to ext_proc messages.

This is the one place a ``RouterError`` becomes an HTTP response: an ImmediateResponse with the error's status
and an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

from google.protobuf import struct_pb2

from extproc import wire
from extproc.errors import RouterError
from extproc.protocol import constants
from extproc.protocol.pb import core_pb2, external_processor_pb2, http_status_pb2
from extproc.types import Route

pb = external_processor_pb2
_OVERWRITE = core_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def set_header(key: str, value: str) -> core_pb2.HeaderValueOption:
    """A header that replaces any same-named one (``raw_value`` bytes, as Envoy prefers)."""
    return core_pb2.HeaderValueOption(
        header=core_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def route_mutation(route: Route) -> tuple[pb.CommonResponse, struct_pb2.Struct]:
    """The destination header plus summary headers, and the same destination as ``envoy.lb`` metadata.

    Shapes: header ``x-gateway-destination-endpoint: "ip:port,ip:port"`` and metadata
    ``{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port,ip:port"}}``.
    """
    value = ",".join(route.endpoints)
    headers = [set_header(wire.DESTINATION_HEADER, value)]
    headers += [set_header(k.lower(), v) for k, v in route.headers.items()]
    # A client's own x-prefiller-host-port (or its older spelling, which the sidecar still reads) would send the
    # decode sidecar's prefill leg wherever it says: only the picker names a prefill pod, so one we did not set goes.
    ours = {k.lower() for k in route.headers}
    remove = [h for h in (wire.PREFILLER_HEADER, wire.LEGACY_PREFILLER_HEADER) if h not in ours]
    common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=headers, remove_headers=remove))
    metadata = struct_pb2.Struct()
    metadata.update({wire.LB_NAMESPACE: {wire.DESTINATION_METADATA_KEY: value}})
    return common, metadata


def error_type(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(err: RouterError) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as UTF-8 JSON."""
    error = {"message": err.message, "type": error_type(err.status), "param": err.param, "code": err.code}
    payload: Mapping[str, object] = {"error": error}
    return json.dumps(payload).encode()


def error_response(err: RouterError) -> pb.ProcessingResponse:
    """An ImmediateResponse answering the client with ``err`` (Envoy logs ``details`` as response details)."""
    immediate = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=err.status),  # type: ignore[arg-type]  # open enum: any int
        headers=pb.HeaderMutation(set_headers=[set_header("content-type", constants.JSON_CONTENT_TYPE)]),
        body=error_body(err),
        details="extproc_" + re.sub(r"[^A-Za-z0-9_.-]", "_", err.code),
    )
    return pb.ProcessingResponse(immediate_response=immediate)


def headers_reply(common: pb.CommonResponse, metadata: struct_pb2.Struct | None) -> pb.ProcessingResponse:
    """The answer to ``request_headers`` (carrying the decision when it is made at the headers)."""
    reply = pb.HeadersResponse(response=common)
    return pb.ProcessingResponse(request_headers=reply, dynamic_metadata=metadata)


def body_reply(common: pb.CommonResponse, metadata: struct_pb2.Struct | None) -> pb.ProcessingResponse:
    """The answer to a BUFFERED ``request_body`` (carrying the decision)."""
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata)


def streamed_chunks(body: bytes, *, end_of_stream: bool) -> Iterator[pb.ProcessingResponse]:
    """FULL_DUPLEX_STREAMED echo: ``body`` as ``streamed_response`` chunks of at most 62,000 bytes.

    An empty body is one empty chunk. ``end_of_stream`` marks the last chunk; pass False when trailers follow.
    """
    size = constants.STREAMED_CHUNK_BYTES
    starts = range(0, len(body), size) if body else range(1)
    for start in starts:
        last = start + size >= len(body)
        chunk = pb.StreamedBodyResponse(body=body[start : start + size], end_of_stream=end_of_stream and last)
        common = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=chunk))
        yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))


def trailers_reply(metadata: struct_pb2.Struct | None = None) -> pb.ProcessingResponse:
    """An answer to ``request_trailers`` leaving them unchanged (``metadata``: a decision made this late)."""
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse(), dynamic_metadata=metadata)
