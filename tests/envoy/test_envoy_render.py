"""The rendered bootstrap: key properties of the dict, and real `envoy --mode validate` on a few variants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.stack_config import REPO
from extproc import wire
from extproc.cli import main
from extproc.envoy_config import RETRY_ON, EnvoyOptions, keys, render_bootstrap, to_yaml
from tests.support.envoy import validate

ENDPOINTS = ("127.0.0.1:8001", "127.0.0.1:8002")
DEMO_ARGS = ["envoy-config", "--endpoints", ",".join(ENDPOINTS), "--picker", "127.0.0.1:9002"]
"""The committed ``envoy/envoy.yaml`` is exactly what these arguments render (see envoy/README.md)."""

VARIANTS = {
    "default": {},
    "tenant_from_envoy": {"tenant_header": wire.TENANT_HEADER, "tenant": "premium"},
    "duplex": {"body_mode": "full_duplex_streamed"},
    "original_dst_metadata": {"cluster_mode": "original_dst", "endpoints": ()},
    "original_dst_header_fail_closed": {
        "cluster_mode": "original_dst",
        "original_dst_source": "header",
        "failure_mode_allow": False,
    },
    "gie_subset_served_bypass_dns_picker": {
        "subset_hint": ("127.0.0.1:8002",),
        "send_response_headers": True,
        "picker_bypass_prefixes": ("/health",),
        "picker_host": "extproc",
        "access_log_path": "",
    },
    "ext_authz_bypass_tenant": {
        "transport": "ext_authz",
        "picker_bypass_prefixes": ("/health",),
        "tenant_header": "x-tenant",
    },
    "ext_authz_original_dst_header": {
        "transport": "ext_authz",
        "cluster_mode": "original_dst",
        "original_dst_source": "header",
        "endpoints": (),
    },
}


def _opts(**overrides: Any) -> EnvoyOptions:
    return EnvoyOptions(**{"endpoints": ENDPOINTS, **overrides})


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def _filter(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [f["typed_config"] for f in _hcm(config)["http_filters"] if f["name"] == name]
    return found  # type: ignore[no-any-return]


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return found  # type: ignore[no-any-return]


def _main_route(config: dict[str, Any]) -> dict[str, Any]:
    route: dict[str, Any] = _hcm(config)["route_config"]["virtual_hosts"][0]["routes"][-1]
    return route


@pytest.mark.envoy
@pytest.mark.parametrize("overrides", list(VARIANTS.values()), ids=list(VARIANTS))
def test_variant_passes_envoy_validate(overrides: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(render_bootstrap(_opts(**overrides))))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_strip_filter_runs_before_ext_proc_and_router_is_last() -> None:
    names = [f["name"] for f in _hcm(render_bootstrap(_opts(subset_hint=ENDPOINTS[:1])))["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.set_metadata",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    strip = _filter(render_bootstrap(_opts()), "envoy.filters.http.header_mutation")
    picks = [wire.DESTINATION_HEADER, wire.PREFILLER_HEADER, wire.LEGACY_PREFILLER_HEADER]
    assert strip["mutations"]["request_mutations"] == [{"remove": h} for h in picks]  # only the picker sets them


def test_a_client_sent_tenant_header_is_stripped_and_can_be_set_by_envoy() -> None:
    strip = _filter(render_bootstrap(_opts(tenant_header=wire.TENANT_HEADER)), "envoy.filters.http.header_mutation")
    removed = [wire.DESTINATION_HEADER, wire.PREFILLER_HEADER, wire.LEGACY_PREFILLER_HEADER, wire.TENANT_HEADER]
    assert strip["mutations"]["request_mutations"] == [{"remove": h} for h in removed]
    fixed = _filter(render_bootstrap(_opts(tenant_header=wire.TENANT_HEADER, tenant="premium")),
                    "envoy.filters.http.header_mutation")  # fmt: skip
    assert fixed["mutations"]["request_mutations"][-1] == {
        "append": {"header": {"key": wire.TENANT_HEADER, "value": "premium"},
                   "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}  # fmt: skip


def test_ext_proc_defaults() -> None:
    ext = _filter(render_bootstrap(_opts()), "envoy.filters.http.ext_proc")
    assert ext["@type"].endswith("ext_proc.v3.ExternalProcessor")
    assert ext["failure_mode_allow"] is True
    assert ext["message_timeout"] == "2s"
    assert ext["allow_mode_override"] is True
    assert ext["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert ext["processing_mode"]["request_trailer_mode"] == "SKIP"
    assert ext["processing_mode"]["response_header_mode"] == "SKIP"
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == [wire.LB_NAMESPACE]
    assert ext["metadata_options"]["forwarding_namespaces"]["untyped"] == [wire.SUBSET_HINT_NAMESPACE]
    assert ext["grpc_service"]["envoy_grpc"]["cluster_name"] == keys.PICKER_CLUSTER


def test_served_endpoint_needs_response_headers_and_lb_forwarding() -> None:
    ext = _filter(render_bootstrap(_opts(send_response_headers=True)), "envoy.filters.http.ext_proc")
    assert ext["processing_mode"]["response_header_mode"] == "SEND"
    assert ext["metadata_options"]["forwarding_namespaces"]["untyped"] == [
        wire.SUBSET_HINT_NAMESPACE,
        wire.LB_NAMESPACE,
    ]


def test_duplex_sends_trailers_and_fail_closed_is_rendered() -> None:
    ext = _filter(render_bootstrap(_opts(body_mode="full_duplex_streamed")), "envoy.filters.http.ext_proc")
    assert ext["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert ext["processing_mode"]["request_trailer_mode"] == "SEND"  # Envoy rejects duplex without it
    closed = _filter(render_bootstrap(_opts(failure_mode_allow=False)), "envoy.filters.http.ext_proc")
    assert "failure_mode_allow" not in closed  # proto3 default false is omitted


def test_route_limits_timeout_and_retries() -> None:
    route = _main_route(render_bootstrap(_opts()))
    assert route["match"] == {"prefix": "/"}
    assert route["request_body_buffer_limit"] == 32 * 1024 * 1024
    assert route["route"]["timeout"] == "0s"
    retry = route["route"]["retry_policy"]
    assert retry["retry_on"] == RETRY_ON == "connect-failure,refused-stream,reset-before-request"
    assert retry["num_retries"] == 2
    assert [p["name"] for p in retry["retry_host_predicate"]] == ["envoy.retry_host_predicates.previous_hosts"]
    assert int(retry["host_selection_retry_max_attempts"]) == 3  # int64: proto-JSON renders it as "3"


def test_override_host_cluster() -> None:
    cluster = _cluster(render_bootstrap(_opts()), keys.MODEL_CLUSTER)
    assert cluster["type"] == "STATIC"
    hosts = [
        e["endpoint"]["address"]["socket_address"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert [f"{h['address']}:{h['port_value']}" for h in hosts] == list(ENDPOINTS)
    (policy,) = cluster["load_balancing_policy"]["policies"]
    override = policy["typed_extension_config"]["typed_config"]
    assert override["override_host_sources"] == [
        {"header": wire.DESTINATION_HEADER},
        {"metadata": {"key": wire.LB_NAMESPACE, "path": [{"key": wire.DESTINATION_HEADER}]}},
    ]
    (fallback,) = override["fallback_policy"]["policies"]
    assert fallback["typed_extension_config"]["name"] == "envoy.load_balancing_policies.round_robin"
    assert override["selected_host_key"]["path"] == [{"key": wire.SERVED_METADATA_KEY}]


def test_picker_cluster_is_http2_and_dns_when_named() -> None:
    picker = _cluster(render_bootstrap(_opts(picker_host="extproc")), keys.PICKER_CLUSTER)
    assert picker["type"] == "STRICT_DNS"
    (h2,) = picker["typed_extension_protocol_options"].values()
    # one stream per connection: Envoy opens a connection per concurrent stream, and the kernel spreads
    # connections over a picker's front workers (SO_REUSEPORT)
    assert h2["explicit_http_config"] == {"http2_protocol_options": {"max_concurrent_streams": 1}}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("metadata", {"metadata_key": {"key": "envoy.lb", "path": [{"key": wire.DESTINATION_HEADER}]}}),
        ("header", {"use_http_header": True, "http_header_name": wire.DESTINATION_HEADER}),
    ],
    ids=["metadata", "header"],
)
def test_original_dst_sources(source: str, expected: dict[str, Any]) -> None:
    config = render_bootstrap(_opts(cluster_mode="original_dst", original_dst_source=source))
    cluster = _cluster(config, keys.MODEL_CLUSTER)
    assert (cluster["type"], cluster["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
    assert cluster["original_dst_lb_config"] == expected
    assert _hcm(config)["http_filters"][0]["name"] == "envoy.filters.http.header_mutation"  # strip stays


def test_bypass_routes_disable_ext_proc_and_come_first() -> None:
    routes = _hcm(render_bootstrap(_opts(picker_bypass_prefixes=("/health",))))["route_config"]["virtual_hosts"][0]
    first, last = routes["routes"]
    assert first["match"] == {"prefix": "/health"}
    assert first["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"] is True
    assert last["match"] == {"prefix": "/"} and "typed_per_filter_config" not in last


def test_subset_hint_metadata() -> None:
    meta = _filter(render_bootstrap(_opts(subset_hint=("127.0.0.1:8002",))), "envoy.filters.http.set_metadata")
    assert meta["metadata"] == [
        {"metadata_namespace": wire.SUBSET_HINT_NAMESPACE, "value": {wire.SUBSET_HINT_KEY: ["127.0.0.1:8002"]}}
    ]


def test_envoy_health_checks_the_pickers_readiness() -> None:
    picker = next(
        c for c in render_bootstrap(_opts())["static_resources"]["clusters"] if c["name"] == keys.PICKER_CLUSTER
    )
    (check,) = picker["health_checks"]
    assert check["grpc_health_check"]["service_name"] == wire.HEALTH_READINESS == "readiness"


def test_ext_authz_replaces_ext_proc_and_passes_only_what_the_picker_reads_and_writes() -> None:
    config = render_bootstrap(_opts(transport="ext_authz", tenant_header="x-tenant", picker_port=9003))
    names = [f["name"] for f in _hcm(config)["http_filters"]]
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_authz", "envoy.filters.http.router"]
    authz = _filter(config, "envoy.filters.http.ext_authz")
    assert authz["http_service"]["server_uri"] == {"uri": "http://127.0.0.1:9003", "cluster": "extproc",
                                                   "timeout": "2s"}  # fmt: skip
    assert [p["exact"] for p in authz["allowed_headers"]["patterns"]] == [
        wire.REQUEST_ID_HEADER, "content-type", wire.TENANT_HEADER, "x-tenant"]  # fmt: skip
    upstream = authz["http_service"]["authorization_response"]["allowed_upstream_headers"]["patterns"]
    assert upstream == [{"exact": wire.DESTINATION_HEADER}, {"exact": wire.PREFILLER_HEADER}, {"prefix": "x-router-"}]
    assert authz["with_request_body"]["max_request_bytes"] == 32 * 1024 * 1024 and authz["failure_mode_allow"]
    picker = _cluster(config, "extproc")
    assert "typed_extension_protocol_options" not in picker and "health_checks" not in picker  # HTTP/1.1


def test_yaml_round_trips() -> None:
    config = render_bootstrap(_opts())
    assert yaml.safe_load(to_yaml(config)) == config


@pytest.mark.parametrize(
    "overrides",
    [
        {"endpoints": ()},
        {"endpoints": ("127.0.0.1:0",)},
        {"endpoints": ("localhost:8001",)},
        {"endpoints": ("127.0.0.1:8001", "127.0.0.1:8001")},
        {"listen_port": 70000},
        {"message_timeout_s": 0},
        {"subset_hint": ("nope",)},
        {"cluster_mode": "original_dst", "picker_bypass_prefixes": ("/health",)},
        {"picker_bypass_prefixes": ("health",)},
        {"unknown_knob": 1},
        {"transport": "ext_authz", "body_mode": "full_duplex_streamed"},
        {"transport": "ext_authz", "cluster_mode": "original_dst", "endpoints": ()},
        {"transport": "ext_authz", "send_response_headers": True},
        {"transport": "ext_authz", "subset_hint": ("127.0.0.1:8002",)},
        {"transport": "grpc"},
    ],
    ids=[
        "no-endpoints", "port-0", "hostname-endpoint", "duplicate", "bad-listen-port", "zero-timeout",
        "bad-subset", "bypass-with-original-dst", "bypass-without-slash", "unknown-field",
        "authz-duplex", "authz-metadata-dst", "authz-response-path", "authz-subset", "unknown-transport",
    ],
)  # fmt: skip
def test_invalid_options_are_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _opts(**overrides)


# -- the command line --------------------------------------------------------------------------------------


@pytest.mark.envoy
def test_committed_drop_in_passes_envoy_validate() -> None:
    result = validate(REPO / "envoy" / "envoy.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_drop_in_matches_a_fresh_render(tmp_path: Path) -> None:
    out = tmp_path / "envoy.yaml"
    assert main([*DEMO_ARGS, "-o", str(out)]) == 0
    committed = (REPO / "envoy" / "envoy.yaml").read_text()
    assert committed == out.read_text(), (
        f"envoy/envoy.yaml drifted: run extproc {' '.join(DEMO_ARGS)} -o envoy/envoy.yaml"
    )


def test_cli_prints_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*DEMO_ARGS, "--body-mode", "full_duplex_streamed", "--cluster", "override_host"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert _filter(config, "envoy.filters.http.ext_proc")["processing_mode"]["request_trailer_mode"] == "SEND"


@pytest.mark.parametrize(
    "args",
    [
        ["--endpoints", "127.0.0.1:80x1"],
        ["--endpoints", ""],
        ["--endpoints", "127.0.0.1"],
        ["--endpoints", "127.0.0.1:8001", "--admin-port", "70000"],
        ["--endpoints", "127.0.0.1:8001", "--listen", "127.0.0.1:99999"],
        ["--endpoints", "127.0.0.1:8001", "--picker", "extproc"],
    ],
    ids=["malformed-port", "no-endpoints", "no-port", "bad-admin-port", "bad-listen-port", "picker-no-port"],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "envoy.yaml"
    assert main(["envoy-config", *args, "-o", str(out)]) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err.startswith("extproc: ")
