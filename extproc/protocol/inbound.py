"""Pure mapping from ext_proc request messages to the router's ``HttpRequest``."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from google.protobuf import struct_pb2

from extproc import wire
from extproc.protocol.pb import core_pb2
from extproc.types import EndpointId, HttpRequest


def header_dict(headers: Iterable[core_pb2.HeaderValue]) -> dict[str, str]:
    """``{lower-case name: value}``; Envoy sends values as ``raw_value`` bytes, older peers as ``value``.

    Repeated headers are joined with ``", "`` (RFC 9110 list semantics). Bytes that are not UTF-8 are
    replaced, never raised on.
    """
    out: dict[str, str] = {}
    for header in headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        key = header.key.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def metadata_value(metadata: core_pb2.Metadata, namespace: str, key: str) -> object | None:
    """One value from ``filter_metadata[namespace][key]`` as plain Python (str, list, ...), or None."""
    if namespace not in metadata.filter_metadata:
        return None
    fields: Mapping[str, struct_pb2.Value] = metadata.filter_metadata[namespace].fields
    if key not in fields:
        return None
    return _plain(fields[key])


def _plain(value: struct_pb2.Value) -> object:
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    return None


def subset_hint(metadata: core_pb2.Metadata) -> tuple[EndpointId, ...] | None:
    """The gateway's eligible endpoints (GIE subset hint), or None when no hint was sent.

    Accepts a list of ``ip:port`` strings or one comma-separated string; blanks are dropped, order kept.
    An empty tuple means "a hint was sent and nothing is eligible".
    """
    raw = metadata_value(metadata, wire.SUBSET_HINT_NAMESPACE, wire.SUBSET_HINT_KEY)
    if raw is None:
        return None
    items = raw if isinstance(raw, list) else [raw]
    parts = (p.strip() for item in items if isinstance(item, str) for p in item.split(","))
    return tuple(EndpointId(p) for p in parts if p)


def served_endpoint(metadata: core_pb2.Metadata) -> EndpointId | None:
    """``envoy.lb`` / ``x-gateway-destination-endpoint-served`` from a response-path message, if present."""
    raw = metadata_value(metadata, wire.LB_NAMESPACE, wire.SERVED_METADATA_KEY)
    return EndpointId(raw) if isinstance(raw, str) and raw else None


def request_id_of(headers: Mapping[str, str]) -> str:
    """The request's ``x-request-id`` (Envoy sets one), or a fresh random id."""
    return headers.get(wire.REQUEST_ID_HEADER) or uuid.uuid4().hex


def build_request(
    headers: Mapping[str, str],
    body: bytes,
    subset: tuple[EndpointId, ...] | None,
    request_id: str,
    received_at_s: float | None = None,
) -> HttpRequest:
    """The router's view of one request."""
    return HttpRequest(
        method=headers.get(":method", ""),
        path=headers.get(":path", ""),
        headers=dict(headers),
        body=body,
        request_id=request_id,
        subset=subset,
        received_at_s=received_at_s,
    )
