"""The P/D shapes, ``docker-compose.pd.yml`` and ``deploy/k8s/pd-envoy`` (``-sim``): their cross-references, and
each run through real Envoy with simulators standing in for the pods, as the other shapes are run.

The decode pods are llm-d's routing sidecar on 8000 in front of vLLM on 8200; in the simulator variants one
``vllm-sim --sim-pd-sidecar`` on 8000 plays both. Envoy sends only to decode pods; the picker names the prefill
pod in ``x-prefiller-host-port`` and the sidecar runs the prefill leg there.
"""

from __future__ import annotations

import contextlib
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
from extproc import wire
from extproc.config import RouterConfig
from extproc.envoy_config import EnvoyOptions
from tests.deploy.compose_local import PD_COMPOSE, flag, load_compose, profile_services, run_profile, with_flag
from tests.deploy.dns_server import LoopbackDns
from tests.deploy.manifests import (
    DEPLOY,
    Objects,
    check_model_server,
    container_named,
    fqdn,
    k8s_picker,
    router_config,
    service_target,
    shape,
)
from tests.deploy.test_k8s_shape import PICKER_NAME, Pods, envoy_config
from tests.support.chat import chat
from tests.support.envoy import EnvoyProcess
from tests.support.polling import until

NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:"
LONG = [{"role": "user", "content": " ".join(f"word{i}" for i in range(1200))}]  # ~3.6K tokens: disaggregated
SHORT = [{"role": "user", "content": "Hello there."}]  # below scheduling.pd.non_cached_tokens: run locally
DECODE_NAME, PREFILL_NAME = fqdn("vllm-decode-pods"), fqdn("vllm-prefill-pods")


def _aggregated_args() -> list[str]:
    """The one model-server command line of docker-compose.yml (= deploy/k8s/base's)."""
    return list(load_compose()["services"]["vllm-0"]["command"])


def _pd_args(port: int) -> list[str]:
    """What every P/D vLLM runs: the aggregated command line on ``port``, plus the NIXL connector."""
    return [*with_flag(_aggregated_args(), "--port", str(port)), f"--kv-transfer-config={NIXL}"]


def _sidecar_ports(args: list[str]) -> tuple[int, int]:
    """(the port the sidecar listens on, the port of the vLLM it fronts), from its flags."""
    assert flag(args, "--connector") == "nixlv2" and flag(args, "--secure-proxy") == "false", args
    return int(flag(args, "--port")), int(flag(args, "--vllm-port"))


# -- docker-compose.pd.yml --------------------------------------------------------------------------------------
def _compose_pd_picker() -> RouterConfig:
    return router_config((DEPLOY / "compose" / "picker-pd.yaml").read_text())


def test_compose_pd_profiles_declare_both_pools_and_the_sidecars() -> None:
    compose = load_compose(PD_COMPOSE)
    shared = ["envoy", "picker-a", "picker-b", "redis"]
    pools = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    gpu = [*shared, *(f"vllm-{p}" for p in pools), "sidecar-decode-0", "sidecar-decode-1"]
    assert sorted(profile_services(compose, "gpu")) == sorted(gpu)
    assert sorted(profile_services(compose, "sim")) == sorted([*shared, *(f"sim-{p}" for p in pools)])


def test_compose_pd_servers_sidecars_picker_and_envoy_agree() -> None:
    compose, config = load_compose(PD_COMPOSE), _compose_pd_picker()
    services = compose["services"]
    roles = {e.address: e.role for e in config.endpoints}
    events = {e.address: e.kv_events for e in config.endpoints}
    envoy = yaml.safe_load((DEPLOY / "compose" / "envoy-pd.yaml").read_text())
    picked = next(c for c in envoy["static_resources"]["clusters"] if c["name"] == "picked")
    envoy_hosts = {
        f"{e['endpoint']['address']['socket_address']['address']}:{e['endpoint']['address']['socket_address']['port_value']}"
        for g in picked["load_assignment"]["endpoints"]
        for e in g["lb_endpoints"]
    }
    for i in (0, 1):
        prefill, decode = services[f"vllm-prefill-{i}"], services[f"vllm-decode-{i}"]
        sidecar, sim_prefill, sim_decode = (
            services[f"{n}-{i}"] for n in ("sidecar-decode", "sim-prefill", "sim-decode")
        )
        assert sidecar["image"].startswith(SIDECAR_IMAGE) and sidecar["network_mode"] == f"service:vllm-decode-{i}"
        listen, vllm_port = _sidecar_ports(list(sidecar["command"]))
        assert list(prefill["command"]) == _pd_args(8000) == list(sim_prefill["command"])
        assert list(decode["command"]) == _pd_args(vllm_port), "the sidecar fronts the decode vLLM's port"
        assert list(sim_decode["command"]) == [*_pd_args(listen), "--sim-pd-sidecar"], "the sim plays the sidecar"
        for svc, sim, role in ((prefill, sim_prefill, "prefill"), (decode, sim_decode, "decode")):
            ip = svc["networks"]["llm"]["ipv4_address"]
            assert (
                sim["networks"]["llm"]["ipv4_address"] == ip and svc["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == ip
            )
            check_model_server(list(svc["command"]), svc["environment"], config)
            address = f"{ip}:{listen if role == 'decode' else flag(list(svc['command']), '--port')}"
            assert roles[address] == role, f"{address}: the picker's role"
            kv = json.loads(flag(list(svc["command"]), "--kv-events-config"))
            ev = events[address]
            assert ev is not None and ev.endpoint == kv["endpoint"].replace("*", ip)
            assert ev.replay_endpoint == kv["replay_endpoint"].replace("*", ip)
    decode_endpoints = {a for a, r in roles.items() if r == "decode"}
    assert envoy_hosts == decode_endpoints, "Envoy sends only to the decode pods' sidecars"
    assert len(roles) == 4 and config.index.backend == "redis"
    for name in ("picker-a", "picker-b"):
        assert services[name]["volumes"] == ["./deploy/compose/picker-pd.yaml:/etc/extproc/picker.yaml:ro"]
    assert services["envoy"]["volumes"] == ["./deploy/compose/envoy-pd.yaml:/etc/envoy/envoy.yaml:ro"]


def _prompt_tokens(backend: str) -> float:
    """The backend's ``vllm:prompt_tokens_total``: how much it has prefilled."""
    with urllib.request.urlopen(f"http://{backend}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:prompt_tokens_total"))


def _decision_lines(picker_log: Path | None) -> str:
    """The picker's decision lines (``pd`` says why a request was or was not split), for a failure's message."""
    if picker_log is None or not picker_log.exists():
        return "(no picker log)"
    return "\n".join(x for x in picker_log.read_text(errors="replace").splitlines() if '"request_id"' in x)


async def _short_then_long(url: str, prefill: list[str], picker_log: Path | None = None) -> tuple[int, int]:
    """A short request with forged prefill headers (both spellings), then a long one; (short's status, the long
    one's prompt tokens). Asserts the short one ran on the decode pod alone and the long one was prefilled on a
    prefill pod; a failure quotes the picker's decision lines from ``picker_log``."""
    forged = {wire.PREFILLER_HEADER: prefill[0], wire.LEGACY_PREFILLER_HEADER: f"http://{prefill[0]}"}
    async with aiohttp.ClientSession() as session:
        status, _ = await chat(session, url, SHORT, headers=forged)
        assert sum(_prompt_tokens(p) for p in prefill) == 0, "a client cannot make the sidecar prefill anywhere"
        long_status, answer = await chat(session, url, LONG, max_tokens=8)
    assert long_status == 200, answer
    prompt = int(answer["usage"]["prompt_tokens"])
    prefilled = sum(_prompt_tokens(p) for p in prefill)
    assert prefilled == prompt, (
        f"one prefill pod ran the prefill leg; the picker decided:\n{_decision_lines(picker_log)}"
    )
    return status, prompt


@pytest.mark.envoy
@pytest.mark.slow
@pytest.mark.redis
async def test_compose_pd_sim_profile_disaggregates_a_long_prompt_through_envoy(tmp_path: Path) -> None:
    with run_profile("sim", tmp_path, compose=PD_COMPOSE) as stack:
        assert stack.envoy is not None
        decode = {stack.local(f"172.29.0.{n}:8000") for n in (21, 22)}
        prefill = [stack.local(f"172.29.0.{n}:8000") for n in (11, 12)]
        status, _ = await _short_then_long(stack.envoy.url("/v1/chat/completions"), prefill)
        log = stack.envoy.wait_for_access_log(2)
    assert status == 200
    assert {e.upstream for e in log} <= decode, f"Envoy only ever sends to a decode pod: {log}"


# -- deploy/k8s/pd-envoy ----------------------------------------------------------------------------------------
def _pd_sim_decode() -> dict[str, Any]:
    """The decode container as deploy/k8s/components/pd-sim patches it."""
    docs = yaml.safe_load_all((DEPLOY / "k8s" / "components" / "pd-sim" / "vllm-sim-pd.yaml").read_text())
    patch = next(d for d in docs if d["metadata"]["name"] == "vllm-decode")
    return dict(next(c for c in patch["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"))


def test_k8s_pd_pools_sidecar_picker_and_envoy_agree() -> None:
    objects: Objects = shape("k8s/pd-envoy")
    assert not objects.has("Deployment", "vllm") and not objects.has("Service", "vllm-pods"), "one pool per role"
    _, config = k8s_picker(objects)
    dns = config.discovery.dns
    assert dns is not None and [p.name for p in config.discovery.pools] == [PREFILL_NAME]
    prefill_dns = config.discovery.pools[0]
    assert (dns.name, dns.role, prefill_dns.role) == (DECODE_NAME, "decode", "prefill")
    for name, found in ((DECODE_NAME, dns), (PREFILL_NAME, prefill_dns)):
        service = objects.get("Service", name.split(".")[0])
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"][wire.ROLE_LABEL] == found.role, "the Service's selector is the role"
    decode, port = service_target(objects, "vllm-decode-pods", dns.port)
    sidecar, vllm = container_named(decode, "routing-sidecar"), container_named(decode, "vllm")
    assert sidecar["image"].startswith(SIDECAR_IMAGE) and sidecar["restartPolicy"] == "Always"
    assert _sidecar_ports(sidecar["args"]) == (port, int(flag(vllm["args"], "--port")))
    prefill, prefill_port = service_target(objects, "vllm-prefill-pods", prefill_dns.port)
    assert prefill_port == int(flag(container_named(prefill, "vllm")["args"], "--port"))
    for deployment, args_port in ((prefill, 8000), (decode, int(flag(vllm["args"], "--port")))):
        server = container_named(deployment, "vllm")
        env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
        assert server["args"] == _pd_args(args_port)
        check_model_server(server["args"], env, config)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels[wire.ROLE_LABEL] == ("prefill" if deployment is prefill else "decode")
    assert _pd_sim_decode()["args"] == [*_pd_args(port), "--sim-pd-sidecar"], "the sim plays the sidecar on its port"
    boot = yaml.safe_load(objects.get("ConfigMap", "envoy-config")["data"]["envoy.yaml"])
    picked = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "picked")
    sa = picked["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert (sa["address"], sa["port_value"]) == (DECODE_NAME, dns.port), "Envoy resolves only the decode pods"


def _pd_picker_config(dns_port: int, decode: Pods, prefill: Pods, listen: tuple[int, int], redis: int) -> str:
    """deploy/k8s/pd-envoy's picker config with loopback ports: ``listen`` = (gRPC, metrics)."""
    config = yaml.safe_load((DEPLOY / "k8s" / "pd-envoy" / "picker-config.yaml").read_text())
    config["listen"] = {"host": "127.0.0.1", "grpc_port": listen[0], "metrics_port": listen[1]}
    for entry, pods in ((config["discovery"]["dns"], decode), (config["discovery"]["pools"][0], prefill)):
        entry.update(port=pods.port, nameserver=f"127.0.0.1:{dns_port}", interval_s=0.2)
        for key, local in (("endpoint", f":{pods.pub}"), ("replay_endpoint", f":{pods.replay}")):
            entry["kv_events"][key] = entry["kv_events"][key].rsplit(":", 1)[0] + local
    config["index"]["url"] = f"redis://127.0.0.1:{redis}/0"
    return yaml.safe_dump(config)


@pytest.fixture
def pd_cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """deploy/k8s/pd-envoy-sim on loopback: decode "pods" 127.0.0.1/.2, a prefill "pod" 127.0.0.3. Everything
    started is stopped in reverse order (ExitStack), by its own handle."""
    prefill_container = container_named(shape("k8s/pd-envoy").get("Deployment", "vllm-prefill"), "vllm")
    with contextlib.ExitStack() as started:
        dns = LoopbackDns().start_in_thread()
        started.callback(dns.stop_thread)
        redis = Valkey()
        redis.start()
        started.callback(redis.stop)
        dns.records.update({DECODE_NAME: ["127.0.0.1", "127.0.0.2"], PREFILL_NAME: ["127.0.0.3"]})
        dns.records[PICKER_NAME] = ["127.0.0.1"]
        decode, prefill = Pods(tmp_path, _pd_sim_decode()), Pods(tmp_path, prefill_container)
        for pods, ips in ((decode, dns.records[DECODE_NAME]), (prefill, dns.records[PREFILL_NAME])):
            started.callback(pods.stop)
            for ip in ips:
                pods.start(ip)
        grpc, metrics, listen, admin = free_ports(4)
        path = tmp_path / "picker.yaml"
        path.write_text(_pd_picker_config(dns.port, decode, prefill, (grpc, metrics), redis.port))
        argv = [str(Path(sys.executable).parent / "extproc"), "serve", "--config", str(path)]
        picker = ManagedProcess("picker", argv, tmp_path / "picker.log", cwd=REPO, env={**os.environ})
        started.callback(picker.stop)
        picker.start(lambda: bool(picker.log_matches(PICKER_READY.pattern)), timeout_s=90)
        log = tmp_path / "envoy" / "access.log"
        ports = {DECODE_NAME: decode.port, PICKER_NAME: grpc}
        boot = envoy_config(dns.port, ports, listen, admin, log, path=DEPLOY / "k8s" / "pd-envoy" / "envoy.yaml")
        opts = EnvoyOptions(endpoints=("127.0.0.1:1",), listen_port=listen, admin_port=admin, access_log_path=str(log))
        envoy = EnvoyProcess(opts, tmp_path / "envoy", config=boot)
        started.callback(envoy.stop)
        envoy.start()
        yield {"envoy": envoy, "decode": decode, "prefill": prefill, "metrics": metrics, "log": picker.log_path}


def _healthy(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
        lines = resp.read().decode().splitlines()
    return sum(1 for x in lines if x.startswith("router_endpoint_healthy{") and x.endswith(" 1.0"))


@pytest.mark.envoy
@pytest.mark.slow
@pytest.mark.redis
async def test_k8s_pd_shape_disaggregates_through_envoy_over_the_role_services(pd_cluster: dict[str, Any]) -> None:
    envoy, decode, prefill = pd_cluster["envoy"], pd_cluster["decode"], pd_cluster["prefill"]
    decode_pods = {f"127.0.0.{n}:{decode.port}" for n in (1, 2)}
    await until(lambda: _healthy(pd_cluster["metrics"]) == 3, what="the picker to find both pools", timeout_s=60.0)
    prefill_pods = [f"127.0.0.3:{prefill.port}"]
    status, _ = await _short_then_long(envoy.url("/v1/chat/completions"), prefill_pods, pd_cluster["log"])
    assert status == 200
    log = envoy.wait_for_access_log(2)
    assert {e.upstream for e in log} <= decode_pods, f"Envoy only ever sends to a decode pod: {log}"
