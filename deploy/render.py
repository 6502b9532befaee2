"""Render the Envoy bootstraps shipped under ``deploy/`` (compose, Kubernetes). Run from the repo root:

    .venv/bin/python -m deploy.render     # rewrites every file in RENDERED (compose, k8s, P/D, Istio)

Both start from ``extproc envoy-config``'s renderer (``render_bootstrap``), so they carry the same filter chain,
retries and limits as every other Envoy we ship. ``tests/deploy/test_manifests.py`` fails if a committed file
differs from a fresh render, and runs ``envoy --mode validate`` on each.

- **compose**: model servers at fixed container IPs on the compose network; the picker cluster is the DNS
  alias ``picker`` that both picker replicas carry, so STRICT_DNS yields one host per replica.
- **P/D** (``docker-compose.pd.yml``, ``deploy/k8s/pd-envoy``): the same, with the model-server cluster listing
  only the decode pods (their sidecar port): Envoy never sends to a prefill pod, the sidecar does.
- **Kubernetes**: the model-server cluster is STRICT_DNS on the vLLM pods' headless Service. Its A records are
  the ready pods' IPs, so the cluster's hosts are exactly the ``ip:port`` values the picker names, which is all
  override_host needs. The picker cluster is STRICT_DNS on the picker's headless Service, so Envoy balances
  ext_proc streams over the picker pods (a ClusterIP would pin every stream to one pod per connection).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extproc.envoy_config import BodyMode, EnvoyOptions, keys, render_bootstrap, to_yaml

DEPLOY = Path(__file__).resolve().parent

# compose: the user-defined network's fixed addresses (docker-compose.yml, networks.llm)
COMPOSE_MODEL_SERVERS = ("172.28.0.11:8000", "172.28.0.12:8000")
COMPOSE_PICKER = ("picker", 9002)
# docker-compose.pd.yml: the decode pods (the llm-d sidecar's port), on that file's own network
COMPOSE_PD_DECODE = ("172.29.0.21:8000", "172.29.0.22:8000")

# Kubernetes (namespace llm; deploy/k8s/base + deploy/k8s/envoy)
K8S_NAMESPACE = "llm"
K8S_MODEL_SERVERS = (f"vllm-pods.{K8S_NAMESPACE}.svc.cluster.local", 8000)
K8S_PICKER = (f"llm-picker-pods.{K8S_NAMESPACE}.svc.cluster.local", 9002)
K8S_PD_DECODE = (f"vllm-decode-pods.{K8S_NAMESPACE}.svc.cluster.local", 8000)  # deploy/k8s/pd-envoy: the sidecars
DNS_REFRESH_S = 5  # how soon a new or removed model-server pod shows up in Envoy's cluster
HEADER = "# Rendered by `python -m deploy.render`; regenerate it rather than edit it (see docs/deploy.md).\n"


def compose_options(endpoints: tuple[str, ...] = COMPOSE_MODEL_SERVERS) -> EnvoyOptions:
    return EnvoyOptions(
        endpoints=endpoints,
        listen_host="0.0.0.0",
        listen_port=10000,
        admin_host="0.0.0.0",
        admin_port=9901,
        picker_host=COMPOSE_PICKER[0],
        picker_port=COMPOSE_PICKER[1],
        access_log_path="/dev/stdout",
    )


def compose_bootstrap() -> dict[str, Any]:
    return render_bootstrap(compose_options())


def k8s_bootstrap(model_servers: tuple[str, int] = K8S_MODEL_SERVERS) -> dict[str, Any]:
    """Our bootstrap with the model-server cluster turned into STRICT_DNS over the headless Service."""
    placeholder = "192.0.2.1:8000"  # replaced below; EnvoyOptions wants IP literals for model servers
    boot = render_bootstrap(
        EnvoyOptions(
            endpoints=(placeholder,),
            listen_host="0.0.0.0",
            listen_port=10000,
            admin_host="0.0.0.0",
            admin_port=9901,
            picker_host=K8S_PICKER[0],
            picker_port=K8S_PICKER[1],
            access_log_path="/dev/stdout",
        )
    )
    for cluster in boot["static_resources"]["clusters"]:
        if cluster["name"] in (keys.MODEL_CLUSTER, keys.PICKER_CLUSTER):
            cluster.pop("type", None)
            cluster["cluster_type"] = _strict_dns()
        if cluster["name"] == keys.MODEL_CLUSTER:
            host, port = model_servers
            lb_endpoint = {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [lb_endpoint]}]
    return boot


def _strict_dns() -> dict[str, Any]:
    """STRICT_DNS as the DNS cluster extension (the Cluster-level ``dns_refresh_rate`` is deprecated on 1.40):
    every A record becomes a host, re-resolved every ``DNS_REFRESH_S``."""
    return {
        "name": "envoy.clusters.dns",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster",
            "dns_refresh_rate": f"{DNS_REFRESH_S}s",
            "respect_dns_ttl": False,
            "dns_lookup_family": "V4_ONLY",
            "all_addresses_in_single_endpoint": False,
        },
    }


# Istio: Envoy fragments patched into Istio's own config (EnvoyFilter). Istio names its outbound clusters
# ``outbound|<port>||<service FQDN>``; the model servers' cluster is its EDS cluster for the vllm Service.
ISTIO_PICKER_CLUSTER = f"outbound|9002||llm-picker.{K8S_NAMESPACE}.svc.cluster.local"
ISTIO_MODEL_SERVICE = (f"vllm.{K8S_NAMESPACE}.svc.cluster.local", 8000)


def istio_options() -> EnvoyOptions:
    """What the EnvoyFilters carry: FULL_DUPLEX_STREAMED (no request-body buffer limit to raise, and the mode
    Istio's own GIE support uses), fail-closed as an InferencePool's default, override_host on the pool."""
    return EnvoyOptions(
        endpoints=("192.0.2.1:8000",),  # unused: Istio's EDS cluster supplies the hosts
        body_mode=BodyMode.FULL_DUPLEX_STREAMED,
        failure_mode_allow=False,
        message_timeout_s=10.0,
    )


def istio_fragments() -> dict[str, Any]:
    """``{"strip": filter, "ext_proc": filter, "load_balancing_policy": policy}`` from our renderer, with the
    ext_proc gRPC service pointed at Istio's cluster for the picker Service."""
    boot = render_bootstrap(istio_options())
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f for f in hcm["http_filters"]}
    ext_proc = filters["envoy.filters.http.ext_proc"]
    ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = ISTIO_PICKER_CLUSTER
    model = next(c for c in boot["static_resources"]["clusters"] if c["name"] == keys.MODEL_CLUSTER)
    return {
        "strip": filters["envoy.filters.http.header_mutation"],
        "ext_proc": ext_proc,
        "load_balancing_policy": model["load_balancing_policy"],
    }


def istio_envoyfilter(mode: str) -> dict[str, Any]:
    """The EnvoyFilter for ``mode`` "gateway" (the ingress gateway) or "sidecar" (clients' sidecars)."""
    gateway = mode == "gateway"
    context = "GATEWAY" if gateway else "SIDECAR_OUTBOUND"
    parts = istio_fragments()

    def listener() -> dict[str, Any]:
        match: dict[str, Any] = {
            "filterChain": {
                "filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"},
                }
            }
        }
        if not gateway:
            match["portNumber"] = ISTIO_MODEL_SERVICE[1]  # only the outbound listener for the model port
        return match

    insert = [
        {
            "applyTo": "HTTP_FILTER",
            "match": {"context": context, "listener": listener()},
            "patch": {"operation": "INSERT_BEFORE", "value": parts[name]},
        }
        for name in ("strip", "ext_proc")  # each lands just before the router: strip, then ext_proc
    ]
    cluster = {
        "applyTo": "CLUSTER",
        "match": {
            "context": context,
            "cluster": {"service": ISTIO_MODEL_SERVICE[0], "portNumber": ISTIO_MODEL_SERVICE[1]},
        },
        "patch": {"operation": "MERGE", "value": {"load_balancing_policy": parts["load_balancing_policy"]}},
    }
    selector = {"istio": "ingressgateway"} if gateway else {"llm-client": "true"}
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {
            "name": f"llm-picker-{mode}",
            "namespace": "istio-system" if gateway else K8S_NAMESPACE,
        },
        "spec": {"workloadSelector": {"labels": selector}, "configPatches": [*insert, cluster]},
    }


_ISTIO_NOTES = {
    "gateway": (
        "# Istio ingress gateway: every request through the gateway is sent to the picker (ext_proc, before the\n"
        "# router; a client's x-gateway-destination-endpoint is stripped first), and the vllm Service's cluster\n"
        "# honours the pick (override_host: header, then envoy.lb metadata; round robin without one).\n"
        "#   kubectl apply -k deploy/istio          (with deploy/istio/routing.yaml's Gateway + VirtualService)\n"
    ),
    "sidecar": (
        "# Istio sidecar mode: the same filters in the outbound sidecar of every pod labelled llm-client=true\n"
        "# (namespace llm), for clients that call vllm.llm.svc.cluster.local:8000 directly, without a gateway.\n"
        "#   kubectl apply -f deploy/istio/envoyfilter-sidecar.yaml\n"
    ),
}


def istio_text(mode: str) -> str:
    return HEADER + _ISTIO_NOTES[mode] + to_yaml(istio_envoyfilter(mode))


RENDERED: dict[Path, Callable[[], str]] = {
    DEPLOY / "compose" / "envoy.yaml": lambda: HEADER + to_yaml(compose_bootstrap()),
    DEPLOY / "k8s" / "envoy" / "envoy.yaml": lambda: HEADER + to_yaml(k8s_bootstrap()),
    DEPLOY / "compose" / "envoy-pd.yaml": lambda: (
        HEADER + to_yaml(render_bootstrap(compose_options(COMPOSE_PD_DECODE)))
    ),
    DEPLOY / "k8s" / "pd-envoy" / "envoy.yaml": lambda: HEADER + to_yaml(k8s_bootstrap(K8S_PD_DECODE)),
    DEPLOY / "istio" / "envoyfilter-gateway.yaml": lambda: istio_text("gateway"),
    DEPLOY / "istio" / "envoyfilter-sidecar.yaml": lambda: istio_text("sidecar"),
}


def main() -> int:
    for path, build in RENDERED.items():
        path.write_text(build())
        print(f"wrote {path.relative_to(DEPLOY.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
