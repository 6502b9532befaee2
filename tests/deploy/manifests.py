"""Loading ``deploy/``'s manifests for cross-reference checks: a small kustomize reader (resources and
configMapGenerator files; enough for our kustomizations) and lookups over the resulting objects."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.stack_config import REPO
from extproc.config import RouterConfig
from tests.deploy.compose_local import flag

DEPLOY = REPO / "deploy"
SHAPES = ["k8s/base", "k8s/envoy", "k8s/envoy-sim", "k8s/pd-envoy", "k8s/pd-envoy-sim", "istio", "envoy-gateway", "gie"]


def read_kustomization(folder: Path) -> list[dict[str, Any]]:
    """The objects ``kustomize build folder`` would emit, without name hashes, components, or patches other
    than ``$patch: delete`` (which removes the object it names)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            objects.extend(read_kustomization(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in spec.get("patches", []):
        doc = yaml.safe_load(patch.get("patch", "")) or {}
        if doc.get("$patch") == "delete":
            gone = (doc["kind"], doc["metadata"]["name"])
            objects = [o for o in objects if (o["kind"], o["metadata"]["name"]) != gone]
    namespace = spec.get("namespace")
    for gen in spec.get("configMapGenerator", []):
        data = {}
        for item in gen["files"]:
            key, _, source = item.partition("=")
            data[key] = (folder / (source or key)).read_text()
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": gen["name"], "namespace": gen.get("namespace", namespace)},
            "data": data,
        }
        if gen.get("behavior") == "replace":
            objects = [o for o in objects if not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == gen["name"])]
        objects.append(cm)
    if namespace:
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("namespace", namespace)
    return objects


@dataclass
class Objects:
    items: list[dict[str, Any]]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.items if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.items if o["kind"] == kind]

    def has(self, kind: str, name: str) -> bool:
        return any(o["kind"] == kind and o["metadata"]["name"] == name for o in self.items)


def shape(name: str) -> Objects:
    return Objects(read_kustomization(DEPLOY / name))


def container(deployment: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][index])


def container_named(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """A container or (native sidecar) init container of the pod template, by name."""
    spec = deployment["spec"]["template"]["spec"]
    return dict(next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name))


def container_port(deployment: dict[str, Any], name_or_number: str | int) -> int:
    """The port a name or number reaches in the pod: any container's, native sidecars' included."""
    spec = deployment["spec"]["template"]["spec"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for port in c.get("ports", []):
            if name_or_number in (port["name"], port["containerPort"]):
                return int(port["containerPort"])
    raise KeyError(name_or_number)


def pods_selected(objects: Objects, selector: dict[str, str]) -> list[dict[str, Any]]:
    """Deployments whose pod template labels match ``selector``."""
    return [
        d for d in objects.all("Deployment") if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]


def service_target(objects: Objects, service: str, port: int) -> tuple[dict[str, Any], int]:
    """(the Deployment a Service's ``port`` reaches, the container port it lands on)."""
    svc = objects.get("Service", service)
    spec_port = next(p for p in svc["spec"]["ports"] if p["port"] == port)
    deployments = pods_selected(objects, svc["spec"]["selector"])
    assert len(deployments) == 1, f"Service {service} selects {len(deployments)} Deployments"
    return deployments[0], container_port(deployments[0], spec_port.get("targetPort", port))


def fqdn(service: str, namespace: str = "llm") -> str:
    return f"{service}.{namespace}.svc.cluster.local"


def router_config(text: str) -> RouterConfig:
    return RouterConfig.model_validate(yaml.safe_load(text))


def model_args(config: RouterConfig) -> dict[str, str]:
    model = config.models[0]
    return {
        "model": model.name,
        "--block-size": str(model.block_size),
        "--prefix-caching-hash-algo": str(model.hash_algo),
        "PYTHONHASHSEED": str(model.hash_seed),
    }


def check_model_server(args: list[str], env: dict[str, str], config: RouterConfig) -> None:
    """A model server's command line and environment hash blocks as the picker expects."""
    want = model_args(config)
    assert args[0] == want["model"], "served model = the picker's models[0].name"
    assert flag(args, "--block-size") == want["--block-size"]
    assert flag(args, "--prefix-caching-hash-algo") == want["--prefix-caching-hash-algo"]
    assert "--enable-prefix-caching" in args
    assert "--enable-prompt-tokens-details" in args, "clients (and our tests) read cached_tokens"
    assert env.get("PYTHONHASHSEED") == want["PYTHONHASHSEED"], "NONE_HASH seed = models[0].hash_seed"
    kv = json.loads(flag(args, "--kv-events-config"))
    assert kv["enable_kv_cache_events"] is True and kv["publisher"] == "zmq"


def k8s_picker(objects: Objects) -> tuple[dict[str, Any], RouterConfig]:
    deployment = objects.get("Deployment", "llm-picker")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    mount = next(m for m in container(deployment)["volumeMounts"] if m["name"] == "config")
    path = flag(container(deployment)["args"], "--config")
    assert path.startswith(mount["mountPath"] + "/")
    data = objects.get("ConfigMap", volume["configMap"]["name"])["data"]
    return deployment, router_config(data[path.rsplit("/", 1)[1]])
