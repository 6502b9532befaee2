"""Fixtures for deployment-shape tests: simulated backends, the picker (``extproc serve``) and real Envoy wired
the way a GIE gateway wires an endpoint picker. Everything binds 127.0.0.1 on free ports and is stopped by PID.

The process helpers are the e2e suite's (``tests/e2e/conftest.py``); only the Envoy wiring differs.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.procs import ManagedProcess, free_ports
from tests.e2e.conftest import _start_picker, _start_sim
from tests.support.envoy import EnvoyProcess, start_envoy


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
            sims[f"127.0.0.1:{port}"] = _start_sim(port, tmp_path, ())
        overrides = dict(picker)
        if stack.dead:  # dead endpoints borrow a live backend's metrics, so the picker believes them healthy
            first = next(iter(sims))
            overrides["endpoints"] = [{"address": e} for e in sims] + [
                {"address": e, "metrics_url": f"http://{first}/metrics"} for e in stack.dead]
        stack.picker, stack.grpc_port, stack.metrics_port = _start_picker(stack.endpoints, tmp_path, overrides)
        stack.add_envoy(**envoy)
        return stack

    yield make
    for stack in started:
        for envoy in stack.envoys:
            envoy.stop()
        stack.picker.stop()
        for sim in stack.sims.values():
            sim.stop()


def dump(value: Any) -> str:
    return json.dumps(value, indent=1, default=str)
