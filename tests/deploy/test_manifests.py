"""Every file under ``deploy/`` (and docker-compose.yml) parses, every Envoy config or fragment in it passes
``envoy --mode validate``, and their cross-references (names, ports, flags, environment, hash settings)
agree with each other and with the picker's config schema (``RouterConfig``)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.config import RouterConfig
from extproc.envoy_config import EnvoyOptions, render_bootstrap, to_yaml
from tests.deploy.compose_local import flag, load_compose, mounted, profile_services
from tests.deploy.manifests import (
    DEPLOY,
    REPO,
    SHAPES,
    check_model_server,
    container,
    container_port,
    fqdn,
    k8s_picker,
    pods_selected,
    router_config,
    service_target,
    shape,
)
from tests.support.envoy import validate


def _load_render() -> Any:
    """``deploy/render.py`` by path (under pytest ``deploy`` may name this test package instead)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), REPO / "docker-compose.yml", REPO / "docker-compose.pd.yml"])
DOCKERFILES = sorted(DEPLOY.rglob("*.Dockerfile"))


# -- every file ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)
    for doc in docs:
        if isinstance(doc.get("apiVersion"), str):  # a Kubernetes object (Grafana's provisioning files say 1)
            assert doc.get("kind") and (
                doc.get("metadata", {}).get("name") or doc["kind"] in ("Kustomization", "Component")
            ), f"{path}: object without kind/name"


@pytest.mark.parametrize("path", sorted(render.RENDERED), ids=lambda p: str(p.relative_to(REPO)))
def test_rendered_files_are_fresh(path: Path) -> None:
    assert path.read_text() == render.RENDERED[path](), f"stale: run `python -m deploy.render` ({path})"


@pytest.mark.envoy
@pytest.mark.parametrize(
    "path",
    [
        DEPLOY / f
        for f in ("compose/envoy.yaml", "k8s/envoy/envoy.yaml", "compose/envoy-pd.yaml", "k8s/pd-envoy/envoy.yaml")
    ],
    ids=["compose", "k8s", "compose-pd", "k8s-pd"],
)
def test_envoy_bootstraps_validate(path: Path) -> None:
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "deprecated" not in (result.stdout + result.stderr).lower()


@pytest.mark.envoy
@pytest.mark.parametrize("mode", ["gateway", "sidecar"])
def test_istio_envoyfilter_fragments_validate_in_a_bootstrap(mode: str, tmp_path: Path) -> None:
    """Assemble what Istio would: its listener with our two filters inserted before the router, its picker
    cluster (named as Istio names it), and the vllm EDS cluster (a STATIC stand-in) with the MERGE applied."""
    envoyfilter = yaml.safe_load((DEPLOY / "istio" / f"envoyfilter-{mode}.yaml").read_text())
    patches = envoyfilter["spec"]["configPatches"]
    inserted = [p["patch"]["value"] for p in patches if p["applyTo"] == "HTTP_FILTER"]
    merge = next(p["patch"]["value"] for p in patches if p["applyTo"] == "CLUSTER")
    assert [f["name"] for f in inserted] == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc"]
    boot = render_bootstrap(EnvoyOptions(endpoints=("10.0.0.1:8000", "10.0.0.2:8000"), access_log_path=""))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    router = hcm["http_filters"][-1]
    hcm["http_filters"] = [copy.deepcopy(f) for f in inserted] + [router]
    clusters = boot["static_resources"]["clusters"]
    picker = next(c for c in clusters if c["name"] == "extproc")
    picker["name"] = picker["load_assignment"]["cluster_name"] = render.ISTIO_PICKER_CLUSTER
    model = next(c for c in clusters if c["name"] == "picked")
    model.update(copy.deepcopy(merge))
    path = tmp_path / "istio.yaml"
    path.write_text(to_yaml(boot))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- docker-compose.yml -----------------------------------------------------------------------------------------
def _compose_picker() -> RouterConfig:
    return router_config((DEPLOY / "compose" / "picker.yaml").read_text())


def test_compose_model_servers_agree_with_the_picker_and_envoy() -> None:
    compose, config = load_compose(), _compose_picker()
    envoy = yaml.safe_load((DEPLOY / "compose" / "envoy.yaml").read_text())
    picked = next(c for c in envoy["static_resources"]["clusters"] if c["name"] == "picked")
    envoy_hosts = {
        f"{e['endpoint']['address']['socket_address']['address']}:"
        f"{e['endpoint']['address']['socket_address']['port_value']}"
        for g in picked["load_assignment"]["endpoints"]
        for e in g["lb_endpoints"]
    }
    endpoints = {e.address: e for e in config.endpoints}
    args_seen = []
    for profile, prefix in (("gpu", "vllm-"), ("sim", "sim-")):
        servers = {n: s for n, s in profile_services(compose, profile).items() if n.startswith(prefix)}
        assert len(servers) == 2, profile
        addresses = set()
        for name, svc in servers.items():
            args = list(svc["command"])
            args_seen.append(args)
            check_model_server(args, svc["environment"], config)
            ip, port = svc["networks"]["llm"]["ipv4_address"], flag(args, "--port")
            address = f"{ip}:{port}"
            addresses.add(address)
            assert flag(args, "--host") == "0.0.0.0"
            kv = json.loads(flag(args, "--kv-events-config"))
            events = endpoints[address].kv_events
            assert events is not None, f"{name}: the picker must subscribe to its KV events"
            assert events.endpoint == kv["endpoint"].replace("*", ip)
            assert events.replay_endpoint == kv["replay_endpoint"].replace("*", ip)
            assert events.topic == kv["topic"]
        assert addresses == set(endpoints) == envoy_hosts, f"{profile}: picker, Envoy and servers disagree"
    assert all(a == args_seen[0] for a in args_seen), "vLLM and the simulator run the same command line"
    entry = {n: s.get("entrypoint") for n, s in compose["services"].items() if n.startswith(("vllm-", "sim-"))}
    assert set(map(tuple, entry.values())) == {("vllm", "serve"), ("vllm-sim",)}


def test_compose_pickers_redis_and_envoy_agree() -> None:
    compose, config = load_compose(), _compose_picker()
    services = compose["services"]
    pickers = {n: s for n, s in services.items() if n.startswith("picker-")}
    assert len(pickers) == 2, "two picker replicas"
    envoy_boot = yaml.safe_load((DEPLOY / "compose" / "envoy.yaml").read_text())
    extproc = next(c for c in envoy_boot["static_resources"]["clusters"] if c["name"] == "extproc")
    sa = extproc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert extproc["type"] == "STRICT_DNS" and sa["port_value"] == config.listen.grpc_port
    for name, svc in pickers.items():
        assert sa["address"] in svc["networks"]["llm"]["aliases"], f"{name} must answer to Envoy's picker name"
        config_path = flag(list(svc["command"]), "--config")
        assert mounted(svc, config_path) == (DEPLOY / "compose" / "picker.yaml").resolve()
        health = svc["healthcheck"]["test"]
        assert health[2] == "/app/healthcheck.py" and health[3].endswith(f":{config.listen.grpc_port}")
    assert config.listen.host == "0.0.0.0"
    assert config.index.backend == "redis"
    match = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", getattr(config.index, "url", ""))
    assert match and match.group(1) in services and match.group(2) == "6379"
    assert services[match.group(1)]["command"][0] == "valkey-server"
    listener = envoy_boot["static_resources"]["listeners"][0]["address"]["socket_address"]
    admin = envoy_boot["admin"]["address"]["socket_address"]
    ports = services["envoy"]["ports"]
    assert f"{listener['port_value']}:{listener['port_value']}" in ports
    assert f"127.0.0.1:{admin['port_value']}:{admin['port_value']}" in ports, "admin on loopback only"
    assert services["envoy"]["command"] == ["-c", "/etc/envoy/envoy.yaml"]
    assert mounted(services["envoy"], "/etc/envoy/envoy.yaml") == (DEPLOY / "compose" / "envoy.yaml").resolve()


def test_compose_addresses_are_unique_per_profile_and_inside_the_subnet() -> None:
    import ipaddress

    compose = load_compose()
    subnet = ipaddress.ip_network(compose["networks"]["llm"]["ipam"]["config"][0]["subnet"])
    for profile in ("gpu", "sim"):
        ips = [s["networks"]["llm"]["ipv4_address"] for s in profile_services(compose, profile).values()]
        assert len(ips) == len(set(ips)), profile
        assert all(ipaddress.ip_address(ip) in subnet for ip in ips)


# -- Dockerfiles ------------------------------------------------------------------------------------------------
def _final_stage(text: str) -> str:
    return re.split(r"^FROM\s", text, flags=re.MULTILINE)[-1]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_run_non_root_with_a_console_script_and_existing_sources(path: Path) -> None:
    text = path.read_text()
    final = _final_stage(text)
    users = re.findall(r"^USER\s+(\S+)", final, re.MULTILINE)
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) > 0, "numeric non-root"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entry = json.loads(re.findall(r"^ENTRYPOINT\s+(\[.*\])", final, re.MULTILINE)[-1])
    assert entry[0] in scripts
    for line in re.findall(r"^COPY\s+(?!--from)(.+)$", text, re.MULTILINE):
        for source in line.split()[:-1]:
            if not source.startswith("--"):
                assert (REPO / source).exists(), f"{path.name}: COPY {source} does not exist"
    assert re.search(r"pip install \.(\s|$)", text), "the package without extras: no vllm in the image"
    ignored = (REPO / ".dockerignore").read_text().split()
    for needed in ("extproc", "vllm_sim", "bench", "deploy", "pyproject.toml"):
        assert needed not in ignored


def test_the_picker_image_exposes_and_probes_the_configured_ports() -> None:
    text = (DEPLOY / "docker" / "picker.Dockerfile").read_text()
    config = _compose_picker()
    exposed = re.findall(r"^EXPOSE\s+(.+)$", text, re.MULTILINE)[-1].split()
    assert str(config.listen.grpc_port) in exposed and str(config.listen.metrics_port) in exposed
    assert f"127.0.0.1:{config.listen.grpc_port}" in re.findall(r"^HEALTHCHECK.*$", text, re.MULTILINE)[-1]


def test_the_picker_never_imports_vllm() -> None:
    code = (
        "import sys, extproc.app, extproc.cli, extproc.router, extproc.protocol.server, extproc.backends.dns;"
        "bad = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Kubernetes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SHAPES)
def test_kustomize_builds_each_shape(name: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    result = subprocess.run([kubectl, "kustomize", str(DEPLOY / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds


@pytest.mark.parametrize("name", ["k8s/envoy", "istio", "envoy-gateway", "gie"])
def test_k8s_picker_vllm_and_redis_agree(name: str) -> None:
    objects = shape(name)
    picker, config = k8s_picker(objects)
    vllm = objects.get("Deployment", "vllm")
    env = {e["name"]: e["value"] for e in container(vllm)["env"] if "value" in e}
    args = container(vllm)["args"]
    check_model_server(args, env, config)
    compose_args = load_compose()["services"]["vllm-0"]["command"]
    assert args == compose_args, "one model-server command line in compose and Kubernetes"
    dns = config.discovery.dns
    assert dns is not None and not config.endpoints, "Kubernetes endpoints come from DNS"
    headless = objects.get("Service", "vllm-pods")
    assert headless["spec"]["clusterIP"] == "None" and dns.name == fqdn("vllm-pods")
    target, port = service_target(objects, "vllm-pods", dns.port)
    assert target is vllm and port == int(flag(args, "--port"))
    kv = json.loads(flag(args, "--kv-events-config"))
    assert dns.kv_events is not None
    assert dns.kv_events.endpoint == kv["endpoint"].replace("*", "{ip}")
    assert dns.kv_events.replay_endpoint == kv["replay_endpoint"].replace("*", "{ip}")
    assert container_port(vllm, "kv-events") == int(kv["endpoint"].rsplit(":", 1)[1])
    match = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", getattr(config.index, "url", ""))
    assert match and match.group(1) == fqdn("redis")
    service_target(objects, "redis", int(match.group(2)))
    probes = container(picker)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probes[probe]["grpc"]["port"] == config.listen.grpc_port
    assert probes["readinessProbe"]["grpc"]["service"] == "readiness"
    assert probes["livenessProbe"]["grpc"]["service"] == "liveness"
    assert picker["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = objects.get("Service", "llm-picker")
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "grpc"
    assert service_target(objects, "llm-picker", grpc["port"]) == (picker, config.listen.grpc_port)


def test_k8s_envoy_reaches_the_picker_and_the_model_servers_by_their_headless_services() -> None:
    objects = shape("k8s/envoy")
    envoy = objects.get("Deployment", "envoy")
    boot = yaml.safe_load(objects.get("ConfigMap", "envoy-config")["data"]["envoy.yaml"])
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}

    def target(cluster: str) -> tuple[str, int]:
        sa = clusters[cluster]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
            "socket_address"
        ]
        return sa["address"], sa["port_value"]

    _, config = k8s_picker(objects)
    assert target("extproc") == (fqdn("llm-picker-pods"), config.listen.grpc_port)
    assert objects.get("Service", "llm-picker-pods")["spec"]["clusterIP"] == "None"
    assert target("picked") == (fqdn("vllm-pods"), config.discovery.dns.port)  # type: ignore[union-attr]
    for name in ("extproc", "picked"):
        assert clusters[name]["cluster_type"]["name"] == "envoy.clusters.dns", "STRICT_DNS: one host per pod"
    assert "override_host" in json.dumps(clusters["picked"]["load_balancing_policy"])
    listen = boot["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    assert service_target(objects, "envoy", 80) == (envoy, listen)
    assert container(envoy)["readinessProbe"]["httpGet"]["port"] == "admin"
    assert container_port(envoy, "admin") == boot["admin"]["address"]["socket_address"]["port_value"]
    assert container(envoy)["args"][:2] == ["-c", "/etc/envoy/envoy.yaml"]


def test_every_service_selects_pods_and_targets_a_declared_port() -> None:
    for name in SHAPES:
        objects = shape(name)
        for svc in objects.all("Service"):
            for port in svc["spec"]["ports"]:
                service_target(objects, svc["metadata"]["name"], port["port"])
            assert pods_selected(objects, svc["spec"]["selector"]), f"{name}: {svc['metadata']['name']}"


def test_istio_manifests_name_the_picker_and_model_services() -> None:
    objects = shape("istio")
    gateway = objects.get("EnvoyFilter", "llm-picker-gateway")
    text = json.dumps(gateway)
    host, port = render.ISTIO_PICKER_CLUSTER.split("|")[3], int(render.ISTIO_PICKER_CLUSTER.split("|")[1])
    assert host == fqdn("llm-picker")
    _, picker_port = service_target(objects, "llm-picker", port)
    assert render.ISTIO_PICKER_CLUSTER in text
    cluster_patch = next(p for p in gateway["spec"]["configPatches"] if p["applyTo"] == "CLUSTER")
    service, model_port = cluster_patch["match"]["cluster"]["service"], cluster_patch["match"]["cluster"]["portNumber"]
    assert service == fqdn("vllm")
    service_target(objects, "vllm", model_port)
    route = objects.get("VirtualService", "llm")["spec"]["http"][0]["route"][0]["destination"]
    assert (route["host"], route["port"]["number"]) == (service, model_port)
    sidecar = yaml.safe_load((DEPLOY / "istio" / "envoyfilter-sidecar.yaml").read_text())
    assert sidecar["spec"]["configPatches"][0]["match"]["context"] == "SIDECAR_OUTBOUND"
    assert sidecar["metadata"]["namespace"] == "llm"


def test_envoy_gateway_references_resolve() -> None:
    objects = shape("envoy-gateway")
    route = objects.get("HTTPRoute", "llm-route")
    assert objects.has("Gateway", route["spec"]["parentRefs"][0]["name"])
    backend_ref = route["spec"]["rules"][0]["backendRefs"][0]
    service_target(objects, backend_ref["name"], backend_ref["port"])
    for kind in ("EnvoyExtensionPolicy", "BackendTrafficPolicy"):
        for policy in objects.all(kind):
            for ref in policy["spec"]["targetRefs"]:
                assert objects.has(ref["kind"], ref["name"])
    ext = objects.get("EnvoyExtensionPolicy", "llm-picker")["spec"]["extProc"][0]
    backend = objects.get("Backend", ext["backendRefs"][0]["name"])
    endpoint = backend["spec"]["endpoints"][0]["fqdn"]
    assert endpoint["hostname"] == fqdn("llm-picker")
    _, config = k8s_picker(objects)
    assert service_target(objects, "llm-picker", endpoint["port"])[1] == config.listen.grpc_port
    assert "envoy.lb" in ext["metadata"]["writableNamespaces"]
    assert not (ext.get("failOpen") and ext["processingMode"]["request"]["body"] == "FullDuplexStreamed")
    override = objects.get("BackendTrafficPolicy", "llm-endpoint-override")["spec"]["loadBalancer"]
    assert override["endpointOverride"]["extractFrom"] == [{"header": "x-gateway-destination-endpoint"}]
    limit = objects.get("ClientTrafficPolicy", "llm-body-limit")["spec"]["connection"]["bufferLimit"]
    assert int(limit.removesuffix("Mi")) * 1024 * 1024 >= config.limits.max_body_bytes


def test_gie_pool_points_at_the_picker_and_the_vllm_pods() -> None:
    objects = shape("gie")
    pool = objects.get("InferencePool", "vllm-qwen3")["spec"]
    vllm = objects.get("Deployment", "vllm")
    assert pods_selected(objects, pool["selector"]["matchLabels"]) == [vllm]
    assert [p["number"] for p in pool["targetPorts"]] == [container_port(vllm, "http")]
    picker, config = k8s_picker(objects)
    ref = pool["endpointPickerRef"]
    assert ref["kind"] == "Service" and service_target(objects, ref["name"], ref["port"]["number"]) == (
        picker,
        config.listen.grpc_port,
    )
    assert config.protocol.close_after_pick is False, "GIE: the served endpoint comes back on the response path"
    route = objects.get("HTTPRoute", "llm-route")
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["kind"], backend["name"]) == ("InferencePool", "vllm-qwen3")
    assert objects.has("Gateway", route["spec"]["parentRefs"][0]["name"])
