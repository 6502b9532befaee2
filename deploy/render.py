"""Render the Envoy bootstraps shipped under ``deploy/`` (compose, Kubernetes). Run from the repo root:

    .venv/bin/python -m deploy.render     # rewrites deploy/compose/envoy.yaml and deploy/k8s/envoy/envoy.yaml

Both start from ``extproc envoy-config``'s renderer (``render_bootstrap``), so they carry the same filter chain,
retries and limits as every other Envoy we ship. ``tests/deploy/test_manifests.py`` fails if a committed file
differs from a fresh render, and runs ``envoy --mode validate`` on each.

- **compose**: model servers at fixed container IPs on the compose network; the picker cluster is the DNS
  alias ``picker`` that both picker replicas carry, so STRICT_DNS yields one host per replica.
- **Kubernetes**: the model-server cluster is STRICT_DNS on the vLLM pods' headless Service. Its A records are
  the ready pods' IPs, so the cluster's hosts are exactly the ``ip:port`` values the picker names, which is all
  override_host needs. The picker cluster is STRICT_DNS on the picker's headless Service, so Envoy balances
  ext_proc streams over the picker pods (a ClusterIP would pin every stream to one pod per connection).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from extproc.envoy import keys
from extproc.envoy_config import EnvoyOptions, render_bootstrap, to_yaml

DEPLOY = Path(__file__).resolve().parent

# compose: the user-defined network's fixed addresses (docker-compose.yml, networks.llm)
COMPOSE_MODEL_SERVERS = ("172.28.0.11:8000", "172.28.0.12:8000")
COMPOSE_PICKER = ("picker", 9002)

# Kubernetes (namespace llm; deploy/k8s/base + deploy/k8s/envoy)
K8S_NAMESPACE = "llm"
K8S_MODEL_SERVERS = (f"vllm-pods.{K8S_NAMESPACE}.svc.cluster.local", 8000)
K8S_PICKER = (f"llm-picker-pods.{K8S_NAMESPACE}.svc.cluster.local", 9002)
DNS_REFRESH_S = 5  # how soon a new or removed model-server pod shows up in Envoy's cluster


def compose_options() -> EnvoyOptions:
    return EnvoyOptions(
        endpoints=COMPOSE_MODEL_SERVERS,
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


def k8s_bootstrap() -> dict[str, Any]:
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
            host, port = K8S_MODEL_SERVERS
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


RENDERED = {
    DEPLOY / "compose" / "envoy.yaml": compose_bootstrap,
    DEPLOY / "k8s" / "envoy" / "envoy.yaml": k8s_bootstrap,
}


HEADER = "# Rendered by `python -m deploy.render`; regenerate it rather than edit it (see docs/deploy.md).\n"


def render_text(boot: dict[str, Any]) -> str:
    return HEADER + to_yaml(boot)


def main() -> int:
    for path, build in RENDERED.items():
        path.write_text(render_text(build()))
        print(f"wrote {path.relative_to(DEPLOY.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
