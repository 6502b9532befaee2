"""The Kubernetes shape (deploy/k8s/base + deploy/k8s/envoy) on loopback, with DNS standing in for the cluster.

A DNS server on 127.0.0.1 answers the headless Services' names the way cluster DNS does: one A record per
ready pod. "Pods" are processes on distinct loopback IPs (127.0.0.1, .2, .3) sharing one port, as pods share
the containerPort. They run the vLLM Deployment's args (through vllm-sim); the picker runs the ConfigMap's
config, discovering endpoints from DNS; Envoy runs the rendered bootstrap, whose STRICT_DNS clusters resolve the
same names. Only ports change (and Envoy's resolver is pointed at the loopback DNS). This checks that an
override_host cluster built from a headless Service's A records accepts the picker's ``ip:port`` picks, and
that a pod set changing in DNS reaches both the picker (scraping and KV events) and Envoy.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bench.procs import ManagedProcess, free_ports
from bench.stack_config import PICKER_READY, REPO
from bench.valkey import Valkey
from extproc.envoy_config import EnvoyOptions
from tests.deploy.compose_local import flag, with_flag
from tests.deploy.dns_server import LoopbackDns
from tests.support.chat import chat
from tests.support.envoy import EnvoyProcess
from tests.support.golden import golden_case
from tests.support.http import http_ok
from tests.support.polling import until

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.redis]

K8S = REPO / "deploy" / "k8s"
VLLM_NAME = "vllm-pods.llm.svc.cluster.local"
PICKER_NAME = "llm-picker-pods.llm.svc.cluster.local"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _container(kind: str, name: str, path: Path) -> dict[str, Any]:
    doc = next(d for d in _docs(path) if d["kind"] == kind and d["metadata"]["name"] == name)
    return dict(doc["spec"]["template"]["spec"]["containers"][0])


class Pods:
    """vLLM "pods": the Deployment's command and args through vllm-sim, one loopback IP each, one shared port."""

    def __init__(self, workdir: Path, container: dict[str, Any] | None = None) -> None:
        """``container``: the pod's model-server container (default: deploy/k8s/base's vLLM)."""
        self.workdir = workdir
        self.port, self.pub, self.replay = self._ports()
        self.running: dict[str, ManagedProcess] = {}
        container = container or _container("Deployment", "vllm", K8S / "base" / "vllm.yaml")
        self.args: list[str] = container["args"]
        self.env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}

    @staticmethod
    def _ports() -> tuple[int, int, int]:
        return tuple(free_ports(3))  # type: ignore[return-value]

    def start(self, ip: str) -> str:
        kv = json.loads(flag(self.args, "--kv-events-config"))
        kv["endpoint"] = kv["endpoint"].replace("*", ip).replace(":5557", f":{self.pub}")
        kv["replay_endpoint"] = kv["replay_endpoint"].replace("*", ip).replace(":6557", f":{self.replay}")
        argv = with_flag(with_flag(self.args, "--host", ip), "--port", str(self.port))
        argv = with_flag(argv, "--kv-events-config", json.dumps(kv))
        exe = str(Path(sys.executable).parent / "vllm-sim")
        # --sim-kv-events-bind: the pod's "tcp://*" became its own IP, and vLLM's rule would then connect
        proc = ManagedProcess(
            f"pod-{ip}",
            [exe, *argv, "--sim-kv-events-bind"],
            self.workdir / f"pod-{ip}.log",
            cwd=REPO,
            env={**os.environ, **self.env},
        )
        self.running[ip] = proc.start(lambda: http_ok(f"http://{ip}:{self.port}/health"), timeout_s=90)
        return f"{ip}:{self.port}"

    def stop(self) -> None:
        for proc in self.running.values():
            proc.stop()


def picker_config(dns_port: int, pods: Pods, grpc: int, metrics: int, redis_port: int) -> dict[str, Any]:
    config = yaml.safe_load((K8S / "base" / "picker-config.yaml").read_text())
    config["listen"] = {"host": "127.0.0.1", "grpc_port": grpc, "metrics_port": metrics}
    dns = config["discovery"]["dns"]
    assert dns["name"] == VLLM_NAME
    dns.update(port=pods.port, nameserver=f"127.0.0.1:{dns_port}", interval_s=0.2)
    dns["kv_events"]["endpoint"] = dns["kv_events"]["endpoint"].replace(":5557", f":{pods.pub}")
    dns["kv_events"]["replay_endpoint"] = dns["kv_events"]["replay_endpoint"].replace(":6557", f":{pods.replay}")
    config["index"]["url"] = f"redis://127.0.0.1:{redis_port}/0"
    return config


def envoy_config(
    dns_port: int, ports: dict[str, int], listen: int, admin: int, log: Path, path: Path = K8S / "envoy" / "envoy.yaml"
) -> dict[str, Any]:
    """The rendered bootstrap at ``path`` on loopback: ``ports`` maps each STRICT_DNS name to its local port."""
    boot = copy.deepcopy(yaml.safe_load(path.read_text()))
    boot["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin}
    listener = boot["static_resources"]["listeners"][0]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen}
    for access_log in listener["filter_chains"][0]["filters"][0]["typed_config"]["access_log"]:
        access_log["typed_config"]["path"] = str(log)
    for cluster in boot["static_resources"]["clusters"]:
        sa = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        sa["port_value"] = ports[sa["address"]]
        dns = cluster["cluster_type"]["typed_config"]
        dns["dns_refresh_rate"] = "0.5s"  # the manifest's 5 s, shortened for the test
        dns["typed_dns_resolver_config"] = {
            "name": "envoy.network.dns_resolver.cares",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns_port}}],
                "dns_resolver_options": {"no_default_search_domain": True},
            },
        }
    return boot


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    dns = LoopbackDns().start_in_thread()
    pods = Pods(tmp_path)
    redis = Valkey()
    picker: ManagedProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        redis.start()
        dns.records[VLLM_NAME] = ["127.0.0.1", "127.0.0.2"]
        dns.records[PICKER_NAME] = ["127.0.0.1"]
        for ip in dns.records[VLLM_NAME]:
            pods.start(ip)
        grpc, metrics, listen, admin = free_ports(4)
        path = tmp_path / "picker.yaml"
        path.write_text(yaml.safe_dump(picker_config(dns.port, pods, grpc, metrics, redis.port)))
        args = _container("Deployment", "llm-picker", K8S / "base" / "picker.yaml")["args"]
        argv = [str(Path(sys.executable).parent / "extproc"), *with_flag(args, "--config", str(path))]
        picker = ManagedProcess("picker", argv, tmp_path / "picker.log", cwd=REPO)
        picker.start(lambda: bool(picker.log_matches(PICKER_READY.pattern)), timeout_s=90)
        log = tmp_path / "envoy" / "access.log"
        boot = envoy_config(dns.port, {VLLM_NAME: pods.port, PICKER_NAME: grpc}, listen, admin, log)
        opts = EnvoyOptions(endpoints=("127.0.0.1:1",), listen_port=listen, admin_port=admin, access_log_path=str(log))
        envoy = EnvoyProcess(opts, tmp_path / "envoy", config=boot).start()
        yield {"dns": dns, "pods": pods, "envoy": envoy, "picker": picker, "metrics": metrics}
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        pods.stop()
        redis.stop()
        dns.stop_thread()


def _envoy_hosts(envoy: EnvoyProcess, cluster: str = "picked") -> set[str]:
    with urllib.request.urlopen(envoy.admin_url + "/clusters", timeout=2) as resp:
        lines = resp.read().decode().splitlines()
    return {line.split("::")[1] for line in lines if line.startswith(f"{cluster}::") and "::cx_active::" in line}


def _picker_metrics(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
        return str(resp.read().decode())


def _picker_healthy(metrics_port: int) -> set[str]:
    return {
        line.split('"')[1]
        for line in _picker_metrics(metrics_port).splitlines()
        if line.startswith("router_endpoint_healthy{") and line.endswith(" 1.0")
    }


def _precise_endpoints(metrics_port: int) -> int:
    """How many endpoints the picker follows by their KV events (``router_precise_endpoints``)."""
    for line in _picker_metrics(metrics_port).splitlines():
        if line.startswith("router_precise_endpoints "):
            return int(float(line.split()[1]))
    return 0


SLOW = {"timeout_s": 60.0, "poll_s": 0.2}  # the waits of this test: up to 60 s each, polled every 0.2 s


async def test_headless_service_endpoints_follow_the_cache_and_track_pods(cluster: dict[str, Any]) -> None:
    envoy, pods, dns = cluster["envoy"], cluster["pods"], cluster["dns"]
    first_two = {f"127.0.0.1:{pods.port}", f"127.0.0.2:{pods.port}"}
    await until(lambda: _envoy_hosts(envoy) == first_two, what="Envoy's STRICT_DNS cluster to list both pods", **SLOW)
    assert _envoy_hosts(envoy, "extproc") == {f"127.0.0.1:{_container_port(envoy)}"}
    await until(
        lambda: _precise_endpoints(cluster["metrics"]) == 2, what="the picker to follow both pods' KV events", **SLOW
    )

    summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
    url = envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        s1, _ = await chat(session, url, summary["messages"])
        s2, second = await chat(session, url, conclusion["messages"])
    assert (s1, s2) == (200, 200)
    log = envoy.wait_for_access_log(2)
    assert log[0].upstream in first_two and log[1].upstream == log[0].upstream
    assert [e.reason for e in log] == ["load", "cache"], "the picks were the picker's, honoured by override_host"
    assert int(second["usage"]["prompt_tokens_details"]["cached_tokens"]) >= len(conclusion["token_ids"]) - 48

    # The Deployment rolls: both pods go, a new one comes up at another IP. DNS says so; both sides follow.
    new = pods.start("127.0.0.3")
    dns.records[VLLM_NAME] = ["127.0.0.3"]
    await until(lambda: _envoy_hosts(envoy) == {new}, what="Envoy to drop the old pods and add the new one", **SLOW)
    await until(
        lambda: new in _picker_healthy(cluster["metrics"]), what="the picker to discover and scrape the new pod", **SLOW
    )
    await until(
        lambda: _precise_endpoints(cluster["metrics"]) == 1,
        what="KV events: the new pod followed, old ones not",
        **SLOW,
    )
    async with aiohttp.ClientSession() as session:
        results = [await chat(session, url, [{"role": "user", "content": f"After the roll {i}"}]) for i in range(3)]
    assert [s for s, _ in results] == [200] * 3
    after = envoy.wait_for_access_log(5)[2:]
    assert {e.upstream for e in after} == {new}
    assert all(e.dest.split(",") == [new] for e in after), "the picker names only the pod DNS now returns"


def _container_port(envoy: EnvoyProcess) -> int:
    clusters = envoy._config["static_resources"]["clusters"]  # type: ignore[index]
    sa = next(c for c in clusters if c["name"] == "extproc")["load_assignment"]["endpoints"][0]
    return int(sa["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"])
