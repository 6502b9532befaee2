"""Pure mapping functions of the adapter: tables and properties, no server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extproc.errors import BadRequest, NoEndpoint, Overloaded, RouterError
from extproc.protocol import inbound, outbound
from extproc.protocol.pb import core_pb2
from extproc.types import EndpointId, Route
from tests.protocol.extproc_wire import metadata


@given(body=st.binary(max_size=200_000), eos=st.booleans())
def test_streamed_chunks_reassemble_the_body(body: bytes, eos: bool) -> None:
    parts = [
        r.request_body.response.body_mutation.streamed_response
        for r in outbound.streamed_chunks(body, end_of_stream=eos)
    ]
    assert b"".join(p.body for p in parts) == body
    assert all(len(p.body) <= 62_000 for p in parts) and len(parts) == max(1, -(-len(body) // 62_000))
    assert [p.end_of_stream for p in parts] == [False] * (len(parts) - 1) + [eos]


def test_route_mutation_sets_header_metadata_and_summary() -> None:
    route = Route((EndpointId("1.1.1.1:80"), EndpointId("2.2.2.2:80")), {"X-Router-Reason": "cache"})
    common, md = outbound.route_mutation(route)
    keys = [(h.header.key, h.header.raw_value, h.append_action) for h in common.header_mutation.set_headers]
    overwrite = core_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert keys == [
        ("x-gateway-destination-endpoint", b"1.1.1.1:80,2.2.2.2:80", overwrite),
        ("x-router-reason", b"cache", overwrite),
    ]
    assert json.loads(json.dumps(dict(md.fields["envoy.lb"].struct_value))) == {
        "x-gateway-destination-endpoint": "1.1.1.1:80,2.2.2.2:80"
    }
    # a client's, never passed on (the sidecar still reads the older x-prefiller-url when the new one is absent)
    assert list(common.header_mutation.remove_headers) == ["x-prefiller-host-port", "x-prefiller-url"]


def test_the_prefill_pod_the_picker_names_is_set_not_removed() -> None:
    route = Route((EndpointId("1.1.1.1:80"),), {"x-prefiller-host-port": "3.3.3.3:80"})
    common, _ = outbound.route_mutation(route)
    assert ("x-prefiller-host-port", b"3.3.3.3:80") in [(h.header.key, h.header.raw_value)
                                                       for h in common.header_mutation.set_headers]  # fmt: skip
    assert list(common.header_mutation.remove_headers) == ["x-prefiller-url"]


@pytest.mark.parametrize(
    ("error", "status", "etype"),
    [
        (BadRequest("m", param="p"), 400, "invalid_request_error"),
        (Overloaded("m"), 429, "rate_limit_error"),
        (NoEndpoint("m"), 503, "server_error"),
    ],
    ids=["400", "429", "503"],
)
def test_error_response_is_openai_shaped(error: RouterError, status: int, etype: str) -> None:
    reply = outbound.error_response(error)
    assert reply.immediate_response.status.code == status
    assert json.loads(reply.immediate_response.body) == {
        "error": {"message": "m", "type": etype, "param": error.param, "code": error.code}
    }
    assert reply.immediate_response.details == f"extproc_{error.code}"


def test_header_dict_lowercases_joins_and_prefers_raw_value() -> None:
    headers = [
        core_pb2.HeaderValue(key="Accept", raw_value=b"a"),
        core_pb2.HeaderValue(key="accept", raw_value=b"b"),
        core_pb2.HeaderValue(key="x-old", value="plain"),
        core_pb2.HeaderValue(key=":path", raw_value=b"/v1/x"),
    ]
    assert inbound.header_dict(headers) == {"accept": "a, b", "x-old": "plain", ":path": "/v1/x"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [(["a:1", " b:2 "], ("a:1", "b:2")), ("a:1,,b:2", ("a:1", "b:2")), ([1, "a:1"], ("a:1",)), (True, ())],
    ids=["list-trimmed", "blank-items-dropped", "non-strings-ignored", "wrong-type"],
)
def test_subset_hint_shapes(value: object, expected: tuple[str, ...]) -> None:
    md = metadata({"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": value}})
    assert inbound.subset_hint(md) == expected


def test_served_endpoint() -> None:
    md = metadata({"envoy.lb": {"x-gateway-destination-endpoint-served": "1.2.3.4:5"}})
    assert inbound.served_endpoint(md) == "1.2.3.4:5"
    assert inbound.served_endpoint(core_pb2.Metadata()) is None
