"""The scrape configs and the dashboard wiring under ``deploy/``: Prometheus reaches every picker's metrics
port and every model server in the compose shape, and selects the right pods and ports in the Kubernetes
shapes; Grafana in compose loads ``deploy/grafana/*.json`` from the compose Prometheus. (What the dashboard's
queries name is ``tests/unit/test_dashboard.py``.)"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import yaml

from extproc.config import RouterConfig
from tests.deploy.compose_local import load_compose, mounted, profile_services
from tests.deploy.manifests import DEPLOY, container_port, shape


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _jobs(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in config["scrape_configs"]}


def _static_targets(job: dict[str, Any]) -> set[str]:
    return {t for group in job["static_configs"] for t in group["targets"]}


def test_compose_prometheus_scrapes_every_picker_and_model_server() -> None:
    compose = load_compose()
    services = profile_services(compose, "observability")
    prometheus = services["prometheus"]
    flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config = _yaml(mounted(prometheus, flag.split("=", 1)[1]))
    jobs = _jobs(config)
    picker = RouterConfig.model_validate(_yaml(DEPLOY / "compose" / "picker.yaml"))
    pickers = {s["networks"]["llm"]["ipv4_address"] for n, s in services.items() if n.startswith("picker-")}
    assert _static_targets(jobs["llm-picker"]) == {f"{ip}:{picker.listen.metrics_port}" for ip in pickers}
    assert _static_targets(jobs["model-servers"]) == {e.address for e in picker.endpoints}


def test_compose_grafana_loads_the_dashboards_from_the_compose_prometheus() -> None:
    compose = load_compose()
    services = profile_services(compose, "observability")
    grafana = services["grafana"]
    provisioning = mounted(grafana, "/etc/grafana/provisioning")
    dashboards = mounted(grafana, "/var/lib/grafana/dashboards")
    assert (dashboards / "router-fleet.json").is_file()
    provider = _yaml(provisioning / "dashboards" / "router.yaml")["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    source = _yaml(provisioning / "datasources" / "prometheus.yaml")["datasources"][0]
    prometheus_ip = services["prometheus"]["networks"]["llm"]["ipv4_address"]
    assert source["url"] == f"http://{prometheus_ip}:9090" and source["isDefault"] is True


def test_compose_observability_addresses_are_unique_and_inside_the_subnet() -> None:
    compose = load_compose()
    subnet = ipaddress.ip_network(compose["networks"]["llm"]["ipam"]["config"][0]["subnet"])
    for profile in ("gpu", "sim"):
        both = {**profile_services(compose, profile), **profile_services(compose, "observability")}
        ips = [s["networks"]["llm"]["ipv4_address"] for s in both.values()]
        assert len(ips) == len(set(ips)) and all(ipaddress.ip_address(ip) in subnet for ip in ips), profile


def _pod_labels_and_ports(app: str) -> tuple[dict[str, str], Any]:
    deployment = next(d for d in shape("k8s/base").all("Deployment")
                      if d["spec"]["template"]["metadata"]["labels"].get("app") == app)  # fmt: skip
    return deployment["spec"]["template"]["metadata"]["labels"], deployment


def test_k8s_pod_monitors_select_the_picker_and_vllm_pods_by_a_declared_port() -> None:
    component = DEPLOY / "k8s" / "components" / "monitoring"
    assert _yaml(component / "kustomization.yaml")["resources"] == ["podmonitors.yaml"]
    monitors = {m["metadata"]["name"]: m for m in yaml.safe_load_all((component / "podmonitors.yaml").read_text())}
    for name, app, port in (("llm-picker", "llm-picker", "metrics"), ("vllm", "vllm", "http")):
        spec = monitors[name]["spec"]
        labels, deployment = _pod_labels_and_ports(app)
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        endpoint = spec["podMetricsEndpoints"][0]
        assert endpoint["port"] == port and container_port(deployment, port) > 0


def test_k8s_plain_scrape_config_keeps_the_same_pods_and_ports() -> None:
    jobs = _jobs(_yaml(DEPLOY / "prometheus" / "kubernetes.yaml"))
    for job, app, port in (("llm-picker", "llm-picker", "metrics"), ("model-servers", "vllm", "http")):
        rules = {tuple(r["source_labels"]): r for r in jobs[job]["relabel_configs"] if r.get("action") == "keep"}
        assert rules[("__meta_kubernetes_pod_label_app",)]["regex"] == app
        assert rules[("__meta_kubernetes_pod_container_port_name",)]["regex"] == port
        _, deployment = _pod_labels_and_ports(app)
        assert container_port(deployment, port) > 0
