"""Stack fixtures: thin pytest shapes over the one launcher, ``bench.stack.Stack``.

``make_stack(backends, dead=, sim_args=, picker=, kv_events=)`` (e2e, faults, security): simulated backends
one process each (so one can die or restart: ``stack.restart_backend``), one picker logging every decision,
real Envoy. With ``dead`` endpoints the live backends' load is hidden, so the picker prefers a dead one and
Envoy must retry on the fallback.

``gie_stack(envoy_options, picker_overrides, backends=, dead=)`` (deploy): the same, with Envoy wired as a
GIE gateway wires an endpoint picker (``envoy_options``: ``EnvoyOptions`` fields); more Envoys on the same
picker with ``stack.add_envoy(**options)``.

Both start everything on 127.0.0.1 on free ports; every stack started is stopped at teardown.

``shared_index(url, namespace, **fields)``: the ``index`` override of replicas sharing one Redis index, with
the generous deadlines the replica e2e tests run under.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.stack import Stack, StackSpec


class StackFactory(Protocol):
    def __call__(self, backends: int = 2, *, dead: int = 0, sim_args: Sequence[str] = (),
                 picker: dict[str, Any] | None = None, kv_events: bool = False) -> Stack: ...  # fmt: skip


class GieStackFactory(Protocol):
    def __call__(self, envoy: dict[str, Any], picker: dict[str, Any], *, backends: int = 2,
                 dead: int = 0) -> Stack: ...  # fmt: skip


# Replica e2e tests are about what the replicas share. Beside the real-vLLM tier a Redis round trip on a
# 2-core CI box takes over 5 ms now and then, and a lookup past the deadline is routed by load (the designed
# answer to a slow Redis): with the 5 ms default a request was sent away from its cached prefix 1 run in 8.
LOADED_BOX_REDIS_S = 0.25


def shared_index(url: str, namespace: str, **fields: Any) -> dict[str, Any]:
    """The picker's ``index`` override for a Redis index shared under ``namespace``, with lookups and Redis
    calls allowed ``LOADED_BOX_REDIS_S``; ``fields`` add to it (``leases=...``)."""
    return {"backend": "redis", "url": url, "namespace": namespace,
            "lookup_deadline_s": LOADED_BOX_REDIS_S, "timeout_s": LOADED_BOX_REDIS_S, **fields}  # fmt: skip


def _test_spec(backends: int, dead: int, **fields: Any) -> StackSpec:
    """One simulator process per backend; the picker discovers the hash scheme and logs at INFO."""
    return StackSpec(backends=backends, dead=dead, backends_per_sim=1, discover_scheme=True, picker_log_level=None,
                     **fields)  # fmt: skip


class _Stacks:
    """The stacks one test started, each in its own folder; ``stop_all`` stops every one."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.started = workdir, list[Stack]()

    def start(self, spec: StackSpec) -> Stack:
        stack = Stack(spec, self.workdir / f"stack{len(self.started)}")
        self.started.append(stack)  # before start(): a failed start is still stopped
        return stack.start()

    def stop_all(self) -> None:
        for stack in self.started:
            stack.stop()


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[StackFactory]:
    stacks = _Stacks(tmp_path)

    def make(backends: int = 2, *, dead: int = 0, sim_args: Sequence[str] = (),
             picker: dict[str, Any] | None = None, kv_events: bool = False) -> Stack:  # fmt: skip
        return stacks.start(_test_spec(backends, dead, hide_live_load=dead > 0, sim_args=tuple(sim_args),
                                       picker_overrides=dict(picker or {}), kv_events=kv_events))  # fmt: skip

    yield make
    stacks.stop_all()


@pytest.fixture
def gie_stack(tmp_path: Path) -> Iterator[GieStackFactory]:
    stacks = _Stacks(tmp_path)

    def make(envoy: dict[str, Any], picker: dict[str, Any], *, backends: int = 2, dead: int = 0) -> Stack:
        return stacks.start(_test_spec(backends, dead, envoy_options=dict(envoy), picker_overrides=dict(picker)))

    yield make
    stacks.stop_all()


def picker_metric(stack: Stack, name: str, **labels: str) -> float:
    """One sample of picker 0's Prometheus text, matched on its exact label set (0 when absent)."""
    with urllib.request.urlopen(stack.picker_metrics_url, timeout=2) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        metric, _, value = line.rpartition(" ")
        if metric == (f"{name}{{{want}}}" if labels else name):
            return float(value)
    return 0.0


def picker_grpc_port(stack: Stack) -> int:
    """Picker 0's gRPC port (ext_proc and gRPC health)."""
    return stack.picker_grpc[0][1]


def picker_health(stack: Stack, service: str) -> int:
    """Picker 0's gRPC health status for ``service`` (``health_pb2.HealthCheckResponse`` enum)."""
    with grpc.insecure_channel(f"127.0.0.1:{picker_grpc_port(stack)}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return int(reply.status)
