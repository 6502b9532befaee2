"""``render_bootstrap``: the whole Envoy bootstrap as a plain dict, built from typed envoy-data-plane objects.

Shape (one listener, two clusters)::

    listener main → HCM [strip dest header → (subset hint) → ext_proc → router] → route / → cluster picked
    cluster extproc (the picker, h2)   cluster picked (model servers, override_host or ORIGINAL_DST)
"""

from __future__ import annotations

from typing import Any as AnyValue

import yaml
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.overload.v3 import OverloadManager, ResourceMonitor
from envoy_data_plane.envoy.config.route.v3 import (
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_authz.v3 import ExtAuthzPerRoute
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ExtProcPerRoute
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
)
from envoy_data_plane.envoy.extensions.resource_monitors.downstream_connections.v3 import (
    DownstreamConnectionsConfig,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate

from extproc.envoy import keys
from extproc.envoy.clusters import CIRCUIT_LIMIT, clusters
from extproc.envoy.filters import access_logs, http_filters, picker_filter
from extproc.envoy.options import EnvoyOptions, Transport
from extproc.envoy.typed import address, pack, plain, seconds

RETRY_ON = "connect-failure,refused-stream,reset-before-request"
"""Only failures where the request never reached a model server, so a retry cannot run a prompt twice."""

HOST_SELECTION_ATTEMPTS = 3  # how often the LB may re-pick to avoid a previously tried host
STREAM_IDLE_TIMEOUT_S = 300.0  # a stream with no bytes either way for this long is reset


def render_bootstrap(opts: EnvoyOptions) -> dict[str, AnyValue]:
    """The Envoy bootstrap for ``opts`` as a JSON-compatible dict (snake_case keys, ``@type`` on every Any).

    Pure: no I/O. ``to_yaml`` turns the result into the file Envoy reads with ``-c``.
    """
    boot = Bootstrap(
        admin=Admin(address=address(opts.admin_host, opts.admin_port)),
        static_resources=BootstrapStaticResources(listeners=[listener(opts)], clusters=clusters(opts)),
        overload_manager=_connection_limit(),
    )
    return plain(boot)


class _Dumper(yaml.SafeDumper):
    """Safe YAML that writes multi-line strings (the access-log format) double-quoted on one line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(config: dict[str, AnyValue]) -> str:
    """Block-style YAML with keys in the order rendered (the committed ``envoy/envoy.yaml`` format)."""
    return yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def listener(opts: EnvoyOptions) -> Listener:
    """The single HTTP listener clients talk to."""
    hcm = HttpConnectionManager(
        stat_prefix="ingress",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(STREAM_IDLE_TIMEOUT_S),
        route_config=RouteConfiguration(
            name="local", virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=routes(opts))]
        ),
        http_filters=http_filters(opts),
        access_log=access_logs(opts),
    )
    filt = Filter(name="envoy.filters.network.http_connection_manager", typed_config=pack(hcm))
    return Listener(
        name="main",
        address=address(opts.listen_host, opts.listen_port),
        filter_chains=[FilterChain(filters=[filt])],
    )


def routes(opts: EnvoyOptions) -> list[Route]:
    """Bypass routes (no ext_proc, round-robin) first, then the catch-all LLM route."""
    off = ExtAuthzPerRoute(disabled=True) if opts.transport is Transport.EXT_AUTHZ else ExtProcPerRoute(disabled=True)
    bypass = [
        Route(
            match=RouteMatch(prefix=prefix),
            route=route_action(opts),
            typed_per_filter_config={picker_filter(opts): pack(off)},
        )
        for prefix in opts.picker_bypass_prefixes
    ]
    # request_body_buffer_limit lifts the BUFFERED cap (else the listener's 1 MiB → 413) for this route only.
    main = Route(
        match=RouteMatch(prefix="/"),
        route=route_action(opts),
        request_body_buffer_limit=opts.body_limit_bytes,
    )
    return [*bypass, main]


def route_action(opts: EnvoyOptions) -> RouteAction:
    """To the model cluster, with no overall timeout (generations run long) and safe retries only."""
    return RouteAction(
        cluster=keys.MODEL_CLUSTER,
        timeout=seconds(0),
        retry_policy=retry_policy(opts),
    )


def retry_policy(opts: EnvoyOptions) -> RetryPolicy:
    """Retry where the request never reached a server; never re-pick a host already tried.

    Without the previous-hosts predicate the round-robin fallback can choose the dead host again.
    """
    previous = RetryPolicyRetryHostPredicate(
        name="envoy.retry_host_predicates.previous_hosts", typed_config=pack(PreviousHostsPredicate())
    )
    return RetryPolicy(
        retry_on=RETRY_ON,
        num_retries=opts.num_retries,
        per_try_timeout=seconds(0),
        retry_host_predicate=[previous],
        host_selection_retry_max_attempts=HOST_SELECTION_ATTEMPTS,
    )


def _connection_limit() -> OverloadManager:
    """A global downstream connection cap (Envoy 1.40 warns at startup when there is none)."""
    monitor = ResourceMonitor(
        name="envoy.resource_monitors.global_downstream_max_connections",
        typed_config=pack(DownstreamConnectionsConfig(max_active_downstream_connections=CIRCUIT_LIMIT)),
    )
    return OverloadManager(resource_monitors=[monitor])
