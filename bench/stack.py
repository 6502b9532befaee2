"""The stack launcher: simulated vLLM backends, picker processes and real Envoy on 127.0.0.1, free ports.

Used by the demo (``extproc demo``), the end-to-end tests and the benchmarks::

    spec = StackSpec(backends=4, pickers=1, envoy="picker", extra_envoys=("round_robin",), sim_profile="fast")
    with Stack(spec, workdir) as stack:
        stack.url                  # http://127.0.0.1:<port>: the main Envoy (here: with the picker)
        stack.url_for("round_robin")   # the same backends through Envoy's own round robin, no picker
        stack.backends             # ["127.0.0.1:<port>", ...] as Envoy and the picker name them
        stack.picker_metrics_url   # http://127.0.0.1:<port>/metrics of picker 0
        stack.reset_prefix_caches()  # every backend starts cold again

Start order: ``vllm-sim`` (one process per ``backends_per_sim`` servers; ready = its ``vllm-sim: ready``
line), pickers (``extproc serve --config <generated yaml>``; ready = its ``extproc: ready on`` line, which
it prints after the first scrape), Envoys (ready = admin ``/ready``). Each runs in its own process group with
its output in ``workdir``; stop is reverse order, SIGTERM then SIGKILL after a bound, by process group.
If anything fails to start, everything already started is stopped before the error propagates.
``StackSpec(engine="vllm-cpu", block_size=128)`` starts real vLLM CPU engines instead of ``vllm-sim``
(``bench/vllm_cpu.py``, one process each, pinned to cores in turn; docs/real-vllm.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import yaml

from bench.envoy_proc import EnvoyProcess, EnvoyStartError
from bench.procs import ManagedProcess, free_ports
from bench.stack_config import (
    MODEL,
    REPO,
    UPSTREAM_HOST_HEADER,
    EnvoyKind,
    envoy_bootstrap,
    kv_events_sources,
    picker_config,
    sim_argv,
)
from bench.vllm_cpu import Engine as VllmEngine
from bench.vllm_cpu import EngineSpec, build_model_dir, engine_python, start_engines
from extproc.envoy_config import EnvoyOptions

__all__ = ["UPSTREAM_HOST_HEADER", "EngineKind", "EnvoyKind", "Stack", "StackSpec"]

EngineKind = Literal["sim", "vllm-cpu"]

SIM_READY_TIMEOUT_S = 90.0  # tokenizer load on a busy 2-core box takes a while
PICKER_READY_TIMEOUT_S = 90.0
HASH_SEED = "0"  # PYTHONHASHSEED for the simulators, so KV-event hashes are reproducible by the picker

_SERVING = re.compile(r"^vllm-sim: serving \S+ on http://(\S+)$", re.MULTILINE)
_PICKER_READY = re.compile(r"extproc: ready on ([\d.]+):(\d+) \(metrics :(\d+)\)")


@dataclass(frozen=True)
class StackSpec:
    """What to start. ``envoy`` is the main Envoy (``stack.url``); ``extra_envoys`` run beside it on the
    same backends (e.g. a round-robin baseline next to the picker, to interleave in one run). ``pickers``
    processes start only when some Envoy is of kind ``picker``; they share that Envoy's ext_proc cluster."""

    backends: int = 4
    pickers: int = 1
    envoy: EnvoyKind = "picker"
    extra_envoys: tuple[EnvoyKind, ...] = ()
    sim_profile: str = "h100-llama3-8b"
    num_gpu_blocks: int | None = None
    kv_events: bool = False
    backends_per_sim: int | None = None  # servers per vllm-sim process; None = all in one process
    block_size: int = 16
    max_model_len: int = 32768
    sim_args: tuple[str, ...] = ()  # extra vllm-sim flags, e.g. ("--sim-output-len", "8")
    picker_overrides: dict[str, Any] = field(default_factory=dict)  # RouterConfig sections to merge in
    engine: EngineKind = "sim"  # "vllm-cpu": real vLLM CPU engines (bench/vllm_cpu.py), one process each
    picker_tree: Path | None = None  # run the picker from this checkout (e.g. an older commit's worktree)

    def __post_init__(self) -> None:
        kinds = (self.envoy, *self.extra_envoys)
        if self.backends < 1:
            raise ValueError("backends must be >= 1")
        if "picker" in kinds and self.pickers < 1:
            raise ValueError("a picker Envoy needs pickers >= 1")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each Envoy kind at most once, got {kinds}")
        if self.engine == "vllm-cpu" and self.block_size % 32:
            raise ValueError(f"vLLM's CPU build needs a block size that is a multiple of 32, got {self.block_size}")


class Stack:
    """A running stack (see the module docstring). Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, spec: StackSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = Path(workdir)
        self.sims: list[ManagedProcess] = []
        self.pickers: list[ManagedProcess] = []
        self.envoys: dict[EnvoyKind, EnvoyProcess] = {}
        self.backends: list[str] = []
        self.kv_events: dict[str, dict[str, str]] = {}  # backend ip:port -> its KV-event endpoints
        self.picker_grpc: list[tuple[str, int]] = []
        self.picker_metrics_urls: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.spec.engine == "vllm-cpu":
                self._start_vllm_cpu()
            else:
                self._start_sims()
            if "picker" in (self.spec.envoy, *self.spec.extra_envoys):
                for i in range(self.spec.pickers):
                    self._start_picker(i)
            for kind in (self.spec.envoy, *self.spec.extra_envoys):
                self.envoys[kind] = self._start_envoy(kind)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every started process, newest first; idempotent."""
        for envoy in reversed(list(self.envoys.values())):
            envoy.stop()
        for proc in reversed([*self.sims, *self.pickers]):
            proc.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The main Envoy's listener, ``http://127.0.0.1:<port>``."""
        return self.url_for(self.spec.envoy)

    def url_for(self, kind: EnvoyKind) -> str:
        return self.envoys[kind].url()

    @property
    def picker_metrics_url(self) -> str:
        """Picker 0's Prometheus endpoint."""
        return self.picker_metrics_urls[0]

    def picker_pids(self) -> list[int]:
        """The picker processes' pids (for CPU accounting)."""
        return [p.pid for p in self.pickers if p.pid is not None]

    def processes(self) -> list[int]:
        """PIDs of every process this stack started (for checks that all are gone after ``stop()``)."""
        pids = [p.pid for p in [*self.sims, *self.pickers]] + [e.pid for e in self.envoys.values()]
        return [pid for pid in pids if pid is not None]

    @property
    def running(self) -> bool:
        """True while any started process is still alive."""
        procs_alive = any(p.running for p in [*self.sims, *self.pickers])
        return procs_alive or any(e.running for e in self.envoys.values())

    # -- operations -------------------------------------------------------------------------------------
    def reset_prefix_caches(self, timeout_s: float = 5.0) -> None:
        """``reset_prefix_cache`` on every backend: all start cold again (running requests stay)."""
        for backend in self.backends:
            reset_prefix_cache(backend, timeout_s)

    # -- starting each piece ----------------------------------------------------------------------------
    def _start_sims(self) -> None:
        spec = self.spec
        per = spec.backends_per_sim or spec.backends
        max_len = spec.max_model_len
        if spec.num_gpu_blocks is not None:  # vllm-sim refuses a max_model_len beyond its KV capacity
            max_len = min(max_len, (spec.num_gpu_blocks - 1) * spec.block_size)
        for first in range(0, spec.backends, per):
            servers = min(per, spec.backends - first)
            kv_base = str(self.workdir / f"kv{len(self.sims)}") if spec.kv_events else None
            argv = sim_argv(
                sys.executable, servers=servers, profile=spec.sim_profile, block_size=spec.block_size,
                max_model_len=max_len, num_gpu_blocks=spec.num_gpu_blocks, kv_events_base=kv_base,
                extra=spec.sim_args,
            )  # fmt: skip
            env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
            proc = ManagedProcess(f"sim{len(self.sims)}", argv, self.workdir / f"sim{len(self.sims)}.log",
                                  cwd=REPO, env=env)  # fmt: skip
            self.sims.append(proc)
            proc.start(_log_has(proc, r"^vllm-sim: ready"), SIM_READY_TIMEOUT_S)
            addresses = [m.group(1) for m in _SERVING.finditer(proc.log_text())]
            if len(addresses) != servers:
                raise RuntimeError(f"{proc.name}: expected {servers} serving lines, got {addresses}")
            for i, address in enumerate(addresses):
                self.backends.append(address)
                if kv_base is not None:
                    self.kv_events[address] = kv_events_sources(kv_base, i)

    def _start_vllm_cpu(self) -> None:
        """One real engine per backend, pinned to cores in turn, started in parallel; ``sims`` holds them."""
        python = engine_python()
        if python is None:
            raise RuntimeError("vllm-cpu is not installed: run scripts/setup.sh --with-vllm-cpu")
        spec, cores = self.spec, os.cpu_count() or 1
        ports = free_ports(spec.backends)
        specs = [
            EngineSpec(port=port, core=i % cores, block_size=spec.block_size, hash_seed=HASH_SEED,
                       max_model_len=spec.max_model_len, num_gpu_blocks=spec.num_gpu_blocks,
                       kv_events=kv_events_sources(str(self.workdir / f"kv{i}"), 0) if spec.kv_events else None)
            for i, port in enumerate(ports)
        ]  # fmt: skip
        model = build_model_dir(self.workdir / "tiny-qwen3")
        self.sims.extend(start_engines(specs, python, model, self.workdir))
        for engine in self.sims:
            assert isinstance(engine, VllmEngine)
            self.backends.append(engine.address)
            if engine.spec.kv_events is not None:
                self.kv_events[engine.address] = dict(engine.spec.kv_events)

    def _start_picker(self, index: int) -> None:
        config = picker_config(
            self.backends, self.kv_events, block_size=self.spec.block_size, hash_seed=HASH_SEED,
            overrides=self.spec.picker_overrides,
        )  # fmt: skip
        path = self.workdir / f"picker{index}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
        proc = ManagedProcess(f"picker{index}", argv, self.workdir / f"picker{index}.log",
                              cwd=self.spec.picker_tree or REPO)  # fmt: skip
        self.pickers.append(proc)
        proc.start(_log_has(proc, _PICKER_READY.pattern), PICKER_READY_TIMEOUT_S)
        match = _PICKER_READY.search(proc.log_text())
        assert match is not None
        host, grpc_port, metrics_port = match.group(1), int(match.group(2)), int(match.group(3))
        self.picker_grpc.append((host, grpc_port))
        self.picker_metrics_urls.append(f"http://{host}:{metrics_port}/metrics")

    def _start_envoy(self, kind: EnvoyKind, attempts: int = 3) -> EnvoyProcess:
        """Envoy needs its ports up front: choose free ones, retry on new ones if one was taken meanwhile."""
        for attempt in range(1, attempts + 1):
            listen_port, admin_port, spare_port = free_ports(3)
            workdir = self.workdir / f"envoy-{kind}"
            host, picker_port = self.picker_grpc[0] if self.picker_grpc else ("127.0.0.1", spare_port)
            opts = EnvoyOptions(
                endpoints=tuple(self.backends), listen_port=listen_port, admin_port=admin_port,
                picker_host=host, picker_port=picker_port, access_log_path=str(workdir / "access.log"),
            )  # fmt: skip
            envoy = EnvoyProcess(opts, workdir, config=envoy_bootstrap(kind, opts, self.picker_grpc))
            try:
                return envoy.start()
            except EnvoyStartError:
                if attempt == attempts or "ddress already in use" not in envoy.log_tail():
                    raise
                with contextlib.suppress(OSError):
                    (workdir / "access.log").unlink()
        raise AssertionError("unreachable")


def reset_prefix_cache(backend: str, timeout_s: float = 5.0, flush: bool = True) -> None:
    """``POST /reset_prefix_cache`` on ``backend`` (``ip:port``). vLLM publishes the ``AllBlocksCleared`` only
    with its next engine step, so an idle engine's reset reaches no KV-event subscriber until it serves again;
    ``flush`` then sends a one-token completion (too short to fill a block) so the event goes out now."""
    req = urllib.request.Request(f"http://{backend}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()
    if flush:
        flush_events(backend)


def flush_events(backend: str, timeout_s: float = 60.0) -> None:
    """Make ``backend`` run one engine step (a one-token completion), so events it queued are published."""
    body = json.dumps({"model": MODEL, "prompt": [11], "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://{backend}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()


def _log_has(proc: ManagedProcess, pattern: str) -> Callable[[], bool]:
    """A readiness check: ``pattern`` appeared in ``proc``'s output."""
    return lambda: bool(proc.log_matches(pattern))
