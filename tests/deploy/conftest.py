"""Fixtures for deployment-shape tests: simulated backends, the picker (``extproc serve``) and real Envoy wired
the way a GIE gateway wires an endpoint picker. Everything binds 127.0.0.1 on free ports and is stopped by PID.

Like the e2e suite's stack (``tests/e2e/conftest.py``); only the Envoy wiring differs.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.procs import ManagedProcess, free_ports
from tests.e2e.conftest import MODEL
from tests.support.envoy import EnvoyProcess, start_envoy

REPO = Path(__file__).resolve().parents[2]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_sim(port: int, workdir: Path) -> ManagedProcess:
    """One simulated vLLM on 127.0.0.1:port reporting cached tokens."""
    argv = [sys.executable, "-m", "vllm_sim", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--tokenizer", str(REPO / "tokenizer_cache" / MODEL), "--enable-prompt-tokens-details"]
    proc = ManagedProcess(f"sim-{port}", argv, workdir / f"sim-{port}.log", cwd=REPO)
    return proc.start(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), timeout_s=60)


def start_picker(endpoints: list[dict[str, Any]], workdir: Path,
                 overrides: dict[str, Any]) -> tuple[ManagedProcess, int, int]:
    """``extproc serve`` on free ports; ``overrides`` merge into the config's top-level sections."""
    grpc_port, metrics_port = free_ports(2)
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "grpc_port": grpc_port, "metrics_port": metrics_port},
        "models": [{"name": MODEL}],
        "endpoints": endpoints,
        "tokenizer_cache_dir": str(REPO / "tokenizer_cache"),
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "picker.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
    proc = ManagedProcess("picker", argv, workdir / "picker.log", cwd=REPO)
    proc.start(lambda: bool(proc.log_matches(r"extproc: ready on")), timeout_s=60)
    return proc, grpc_port, metrics_port


@dataclass
class GieStack:
    """Sims, one picker, and the Envoys started against them (``envoys[0]`` is the main one)."""

    sims: dict[str, ManagedProcess]
    picker: ManagedProcess
    grpc_port: int
    metrics_port: int
    dead: list[str]
    workdir: Path
    envoys: list[EnvoyProcess] = field(default_factory=list)

    @property
    def envoy(self) -> EnvoyProcess:
        return self.envoys[0]

    @property
    def endpoints(self) -> list[str]:
        return [*self.sims, *self.dead]

    def add_envoy(self, **options: Any) -> EnvoyProcess:
        """Another Envoy in front of the same picker and backends (e.g. with a subset hint)."""
        envoy = start_envoy(self.endpoints, self.workdir / f"envoy{len(self.envoys)}",
                            picker_port=self.grpc_port, **options)
        self.envoys.append(envoy)
        return envoy

    def picker_metric(self, name: str, **labels: str) -> float:
        """One sample of the picker's Prometheus text (0 when absent)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            metric, _, value = line.rpartition(" ")
            if metric == (f"{name}{{{want}}}" if labels else name):
                return float(value)
        return 0.0

    def health(self, service: str) -> int:
        """The picker's gRPC health status for ``service`` (``health_pb2.HealthCheckResponse`` enum)."""
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            return int(reply.status)


class GieStackFactory(Protocol):
    def __call__(self, envoy: dict[str, Any], picker: dict[str, Any], *, backends: int = 2,
                 dead: int = 0) -> GieStack: ...


@pytest.fixture
def gie_stack(tmp_path: Path) -> Iterator[GieStackFactory]:
    started: list[GieStack] = []

    def make(envoy: dict[str, Any], picker: dict[str, Any], *, backends: int = 2, dead: int = 0) -> GieStack:
        ports = free_ports(backends + dead)
        sims: dict[str, ManagedProcess] = {}
        stack = GieStack(sims, ManagedProcess("unused", ["true"], tmp_path / "unused.log"), 0, 0,
                         [f"127.0.0.1:{p}" for p in ports[backends:]], tmp_path)
        started.append(stack)
        for port in ports[:backends]:
            sims[f"127.0.0.1:{port}"] = start_sim(port, tmp_path)
        # dead endpoints borrow a live backend's metrics, so the picker believes them healthy
        first = next(iter(sims))
        endpoints = [{"address": e} for e in sims] + [
            {"address": e, "metrics_url": f"http://{first}/metrics"} for e in stack.dead]
        stack.picker, stack.grpc_port, stack.metrics_port = start_picker(endpoints, tmp_path, dict(picker))
        stack.add_envoy(**envoy)
        return stack

    yield make
    for stack in started:
        for envoy in stack.envoys:
            envoy.stop()
        stack.picker.stop()
        for sim in stack.sims.values():
            sim.stop()
