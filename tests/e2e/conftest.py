"""End-to-end fixtures: simulated vLLM backends (one process each, so one can die), the picker (``extproc
serve``) and real Envoy, all on 127.0.0.1 with free ports. Every process started here is stopped by PID."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from bench.procs import ManagedProcess, free_ports
from tests.support.envoy import EnvoyProcess, options_for_test

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
MODEL = "Qwen/Qwen3-0.6B"
TOKENIZER = REPO / "tokenizer_cache" / "Qwen" / "Qwen3-0.6B"


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass
class Stack:
    """A running stack: ``url(path)`` goes through Envoy; ``backends`` are the live simulators' ``ip:port``."""

    envoy: EnvoyProcess
    picker: ManagedProcess | None
    sims: dict[str, ManagedProcess]
    picker_metrics_port: int
    dead: list[str] = field(default_factory=list)

    @property
    def backends(self) -> list[str]:
        return list(self.sims)

    def url(self, path: str) -> str:
        return self.envoy.url(path)

    def restart_sim(self, endpoint: str) -> None:
        """Stop one backend and start it again on the same port (an engine restart: empty cache, seq 0)."""
        old = self.sims[endpoint]
        old.stop()
        self.sims[endpoint] = ManagedProcess(old.name, old.argv, old.log_path.with_suffix(".restart.log"),
                                             cwd=REPO).start(lambda: _http_ok(f"http://{endpoint}/health"),
                                                             timeout_s=60)


class StackFactory(Protocol):
    def __call__(self, backends: int = 2, *, dead: int = 0, sim_args: Sequence[str] = (),
                 picker: dict[str, Any] | None = None, kv_events: bool = False) -> Stack: ...


def _events(workdir: Path, port: int) -> dict[str, str]:
    """ipc:// endpoints: vLLM binds them (no TCP listener at all), and they stay on this machine."""
    return {"endpoint": f"ipc://{workdir}/kv-{port}.pub", "replay_endpoint": f"ipc://{workdir}/kv-{port}.replay"}


def _start_sim(port: int, workdir: Path, sim_args: Sequence[str], kv_events: bool) -> ManagedProcess:
    argv = [sys.executable, "-m", "vllm_sim", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--tokenizer", str(TOKENIZER), "--enable-prompt-tokens-details", *sim_args]
    if kv_events:
        argv += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, **_events(workdir, port)})]
    proc = ManagedProcess(f"sim-{port}", argv, workdir / f"sim-{port}.log", cwd=REPO)
    return proc.start(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), timeout_s=60)


def _start_picker(endpoints: list[str], workdir: Path, overrides: dict[str, Any]) -> tuple[ManagedProcess, int, int]:
    grpc_port, metrics_port = free_ports(2)
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "grpc_port": grpc_port, "metrics_port": metrics_port},
        "models": [{"name": MODEL}],
        "endpoints": [{"address": e} for e in endpoints],
        "tokenizer_cache_dir": str(REPO / "tokenizer_cache"),
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
    proc = ManagedProcess("picker", argv, workdir / "picker.log", cwd=REPO)
    proc.start(lambda: bool(proc.log_matches(r"extproc: ready on")), timeout_s=60)
    return proc, grpc_port, metrics_port


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[StackFactory]:
    started: list[Stack] = []

    def make(backends: int = 2, *, dead: int = 0, sim_args: Sequence[str] = (),
             picker: dict[str, Any] | None = None, kv_events: bool = False) -> Stack:
        ports = free_ports(backends + dead)
        sims = {f"127.0.0.1:{p}": _start_sim(p, tmp_path, sim_args, kv_events) for p in ports[:backends]}
        dead_eps = [f"127.0.0.1:{p}" for p in ports[backends:]]
        overrides = dict(picker or {})
        if kv_events:
            overrides["endpoints"] = [{"address": f"127.0.0.1:{p}", "kv_events": _events(tmp_path, p)}
                                      for p in ports[:backends]]
        if dead_eps:
            # Dead endpoints "borrow" a live backend's metrics, so the picker believes them healthy and idle;
            # the live ones get a metrics URL that answers 404 (load unknown, still healthy), so the picker
            # deterministically prefers a dead endpoint and Envoy must retry on the fallback.
            first = next(iter(sims))
            overrides["endpoints"] = [{"address": e, "metrics_url": f"http://{e}/no-metrics-here"} for e in sims] + [
                {"address": e, "metrics_url": f"http://{first}/metrics"} for e in dead_eps]
        proc, grpc_port, metrics_port = _start_picker([*sims, *dead_eps], tmp_path, overrides)
        envoy = EnvoyProcess(options_for_test([*sims, *dead_eps], workdir=tmp_path, picker_port=grpc_port),
                             tmp_path).start()
        stack = Stack(envoy, proc, sims, metrics_port, dead_eps)
        started.append(stack)
        return stack

    yield make
    for stack in started:
        stack.envoy.stop()
        if stack.picker:
            stack.picker.stop()
        for sim in stack.sims.values():
            sim.stop()


def golden_case(name: str) -> dict[str, Any]:
    cases = json.loads((SHARED / "vllm" / "golden-tokens.json").read_text())["cases"]
    return next(c for c in cases if c["name"] == name)
