"""The two upstream clusters: ``extproc`` (the picker, HTTP/2) and ``picked`` (the model servers)."""

from __future__ import annotations

from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
)
from envoy_data_plane.envoy.config.core.v3 import HealthCheck, HealthCheckGrpcHealthCheck, Http2ProtocolOptions
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 import RoundRobin
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey, MetadataKeyPathSegment

from extproc import wire
from extproc.envoy import keys
from extproc.envoy.options import ClusterMode, EnvoyOptions, OriginalDstSource, Transport, split_host_port
from extproc.envoy.typed import address, extension, is_ip, pack, seconds

CONNECT_TIMEOUT_S = 1.0
# Envoy's default circuit breakers allow 1024 concurrent requests per cluster; long LLM streams reach that
# early, and unless the picker ends its stream after the pick, each also holds an ext_proc stream (BUFFERED
# keeps it open for the whole response).
CIRCUIT_LIMIT = 10_000
PICKER_HEALTH_INTERVAL_S = 1.0
PICKER_STREAMS_PER_CONNECTION = 1
PICKER_HEALTH_TIMEOUT_S = 0.5
MAX_RETRIES_IN_FLIGHT = 100
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def clusters(opts: EnvoyOptions) -> list[Cluster]:
    """The picker cluster and the model-server cluster, in that order."""
    return [picker_cluster(opts), model_cluster(opts)]


def picker_cluster(opts: EnvoyOptions) -> Cluster:
    """The ext_proc picker: gRPC, so HTTP/2 via typed protocol options (the cluster field is deprecated).
    With transport ext_authz: plain HTTP/1.1 to the picker's authz port, without the gRPC health check."""
    kind = ClusterDiscoveryType.STATIC if is_ip(opts.picker_host) else ClusterDiscoveryType.STRICT_DNS
    if opts.transport is Transport.EXT_AUTHZ:
        return Cluster(
            name=keys.PICKER_CLUSTER,
            type=kind,
            connect_timeout=seconds(CONNECT_TIMEOUT_S),
            load_assignment=_assignment(keys.PICKER_CLUSTER, [f"{opts.picker_host}:{opts.picker_port}"]),
            circuit_breakers=_raised_limits(),
        )
    # One stream per connection: Envoy opens (and pools) a connection per concurrent ext_proc stream, and the
    # kernel spreads connections, not streams, over a picker's front workers (SO_REUSEPORT); with the default
    # (unlimited) every stream rode one connection to one front. Measured: no cost at c=1 or c=16 with one
    # picker process (bench.picker_latency, 1K tokens, side by side with the default).
    streams = Http2ProtocolOptions(max_concurrent_streams=PICKER_STREAMS_PER_CONNECTION)
    h2 = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(http2_protocol_options=streams))
    return Cluster(
        name=keys.PICKER_CLUSTER,
        type=kind,
        connect_timeout=seconds(CONNECT_TIMEOUT_S),
        load_assignment=_assignment(keys.PICKER_CLUSTER, [f"{opts.picker_host}:{opts.picker_port}"]),
        typed_extension_protocol_options={_HTTP_OPTIONS: pack(h2)},
        circuit_breakers=_raised_limits(),
        health_checks=[_picker_health_check()],
    )


def _picker_health_check() -> HealthCheck:
    """Active gRPC health checks of the picker's ``readiness`` service: with several picker replicas, one that
    died or is not ready yet stops receiving ext_proc streams within ~2 s instead of failing (and failing
    open) request after request. With one picker, Envoy's panic mode still tries it; fail-open covers the rest."""
    return HealthCheck(
        timeout=seconds(PICKER_HEALTH_TIMEOUT_S),
        interval=seconds(PICKER_HEALTH_INTERVAL_S),
        unhealthy_threshold=2,
        healthy_threshold=1,
        grpc_health_check=HealthCheckGrpcHealthCheck(service_name=wire.HEALTH_READINESS),
    )


def model_cluster(opts: EnvoyOptions) -> Cluster:
    """The model servers, as the cluster mode says."""
    if opts.cluster_mode is ClusterMode.ORIGINAL_DST:
        return _original_dst_cluster(opts)
    return Cluster(
        name=keys.MODEL_CLUSTER,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=seconds(CONNECT_TIMEOUT_S),
        load_assignment=_assignment(keys.MODEL_CLUSTER, list(opts.endpoints)),
        load_balancing_policy=_policy("envoy.load_balancing_policies.override_host", override_host()),
        circuit_breakers=_raised_limits(),
    )


def override_host() -> OverrideHost:
    """Honour the pick (header first, then ``envoy.lb`` metadata); round-robin when there is none.

    A comma-separated pick is a fallback list that retries walk in order; a pick outside the cluster is
    ignored. The host actually used is written back to ``envoy.lb`` / ``wire.SERVED_METADATA_KEY`` for the picker.
    """
    return OverrideHost(
        override_host_sources=[
            OverrideHostOverrideHostSource(header=wire.DESTINATION_HEADER),
            OverrideHostOverrideHostSource(metadata=_lb_key(wire.DESTINATION_METADATA_KEY)),
        ],
        fallback_policy=LoadBalancingPolicy(
            policies=[
                LoadBalancingPolicyPolicy(
                    typed_extension_config=extension("envoy.load_balancing_policies.round_robin", RoundRobin())
                )
            ]
        ),
        selected_host_key=_lb_key(wire.SERVED_METADATA_KEY),
    )


def _original_dst_cluster(opts: EnvoyOptions) -> Cluster:
    """Any ``ip:port`` the picker names; one host only (no fallback list; fail-open turns into 503 UH)."""
    if opts.original_dst_source is OriginalDstSource.METADATA:
        lb = ClusterOriginalDstLbConfig(metadata_key=_lb_key(wire.DESTINATION_METADATA_KEY))
    else:
        lb = ClusterOriginalDstLbConfig(use_http_header=True, http_header_name=wire.DESTINATION_HEADER)
    return Cluster(
        name=keys.MODEL_CLUSTER,
        type=ClusterDiscoveryType.ORIGINAL_DST,
        lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
        connect_timeout=seconds(CONNECT_TIMEOUT_S),
        original_dst_lb_config=lb,
        circuit_breakers=_raised_limits(),
    )


def _lb_key(key: str) -> MetadataKey:
    return MetadataKey(key=wire.LB_NAMESPACE, path=[MetadataKeyPathSegment(key=key)])


def _policy(name: str, config: OverrideHost) -> LoadBalancingPolicy:
    return LoadBalancingPolicy(policies=[LoadBalancingPolicyPolicy(typed_extension_config=extension(name, config))])


def _assignment(cluster: str, host_ports: list[str]) -> ClusterLoadAssignment:
    hosts = [split_host_port(hp) for hp in host_ports]
    lb_endpoints = [LbEndpoint(endpoint=Endpoint(address=address(h, p))) for h, p in hosts]
    return ClusterLoadAssignment(cluster_name=cluster, endpoints=[LocalityLbEndpoints(lb_endpoints=lb_endpoints)])


def _raised_limits() -> CircuitBreakers:
    limit = CIRCUIT_LIMIT
    thresholds = CircuitBreakersThresholds(
        max_connections=limit,
        max_pending_requests=limit,
        max_requests=limit,
        max_retries=MAX_RETRIES_IN_FLIGHT,
    )
    return CircuitBreakers(thresholds=[thresholds])
