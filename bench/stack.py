"""The stack launcher: simulated vLLM backends, picker processes and real Envoy on 127.0.0.1, free ports.

Used by the demo (``python -m bench.demo``), the end-to-end and deployment tests and the benchmarks::

    spec = StackSpec(backends=4, pickers=1, envoy="picker", extra_envoys=("round_robin",), sim_profile="fast")
    with Stack(spec, workdir) as stack:
        stack.url                  # http://127.0.0.1:<port>: the main Envoy (here: with the picker)
        stack.url_for("round_robin")   # the same backends through Envoy's own round robin, no picker
        stack.backends             # ["127.0.0.1:<port>", ...] as Envoy and the picker name them
        stack.picker_metrics_url   # http://127.0.0.1:<port>/metrics of picker 0
        stack.reset_prefix_caches()  # every backend starts cold again

Start order: ``vllm-sim`` (one process per ``backends_per_sim`` servers; ready = its ``vllm-sim: ready``
line; ``backends_per_sim=1`` lets one backend die or restart alone), pickers (``extproc serve --config
<generated yaml>``; ready = its ``extproc: ready on`` line, which it prints after the first scrape), Envoys
(ready = admin ``/ready``). Each runs in its own process group with its output in ``workdir``; stop is
reverse order, SIGTERM then SIGKILL after a bound, by process group.
If anything fails to start, everything already started is stopped before the error propagates.

For tests (``tests/e2e``, ``tests/faults``, ``tests/deploy``): ``dead=N`` adds N endpoints nobody listens on
(``stack.dead``; given to the picker and Envoy after the live ``stack.backends``, as ``stack.endpoints``);
``envoy_options`` are ``EnvoyOptions`` fields for the picker Envoys (body mode, cluster mode, timeouts);
``stack.restart_backend(address)`` and ``stack.restart_picker()`` restart one process on its old ports;
``stack.add_envoy(**options)`` starts another picker Envoy on the same pickers and endpoints.
``StackSpec(engine="vllm-cpu", block_size=128)`` starts real vLLM CPU engines instead of ``vllm-sim``
(``bench/vllm_cpu.py``, one process each, pinned to cores in turn; docs/real-vllm.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import yaml

from bench.canned_backends import CannedBackends
from bench.envoy_proc import EnvoyProcess, start_on_free_ports
from bench.procs import ManagedProcess, children_of, free_ports
from bench.stack_config import (
    HASH_SEED,
    MODEL,
    PICKER_READY,
    REPO,
    SIM_READY,
    SIM_SERVING,
    UPSTREAM_HOST_HEADER,
    EnvoyKind,
    envoy_bootstrap,
    kv_events_sources,
    merge_sections,
    pd_sim_args,
    picker_config,
    sim_argv,
)
from bench.vllm_cpu import Engine as VllmEngine
from bench.vllm_cpu import EngineSpec, build_model_dir, engine_python, start_engines
from extproc.envoy_config import EnvoyOptions

__all__ = ["UPSTREAM_HOST_HEADER", "EngineKind", "EnvoyKind", "Stack", "StackSpec"]

EngineKind = Literal["sim", "vllm-cpu", "canned"]

SIM_READY_TIMEOUT_S = 90.0  # tokenizer load on a busy 2-core box takes a while
PICKER_READY_TIMEOUT_S = 90.0


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
    # "vllm-cpu": real vLLM CPU engines (bench/vllm_cpu.py), one process each; "canned": one Envoy answering
    # canned vLLM-shaped responses (bench/canned_backends.py: no tokenizing, no KV events)
    engine: EngineKind = "sim"
    picker_tree: Path | None = None  # run the picker from this checkout (e.g. an older commit's worktree)
    dead: int = 0  # endpoints nobody listens on, given to the picker and Envoy after the live ones
    # Dead endpoints borrow backend 0's metrics URL, so the picker believes them healthy. With hide_live_load the
    # live ones get a URL that answers 404 (load unknown, still healthy): the picker then prefers a dead one.
    hide_live_load: bool = False
    envoy_options: dict[str, Any] = field(default_factory=dict)  # EnvoyOptions fields for the picker Envoys
    # The picker's model entry names only the model: block size and hash algorithm discovered from the
    # backends, no hash seed (and the simulators run with the environment's PYTHONHASHSEED, if any).
    discover_scheme: bool = False
    picker_log_level: str | None = "WARNING"  # None: the config's default (INFO: one decision line each)
    # P/D: this many prefill-role simulators (NIXL connector) beside the ``backends``, which then are decode-role
    # (connector plus llm-d's decode sidecar, simulated); the picker knows both pools, Envoy only the decode one
    prefill_backends: int = 0

    def __post_init__(self) -> None:
        kinds = (self.envoy, *self.extra_envoys)
        if self.backends < 1:
            raise ValueError("backends must be >= 1")
        if "picker" in kinds and self.pickers < 1:
            raise ValueError("a picker Envoy needs pickers >= 1")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each Envoy kind at most once, got {kinds}")
        if self.dead < 0:
            raise ValueError("dead must be >= 0")
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
        self.added_envoys: list[EnvoyProcess] = []  # add_envoy's, beside the picker Envoy
        self.backends: list[str] = []  # the live backends' ip:port (the decode pool when P/D)
        self.prefill_backends: list[str] = []  # P/D: the prefill pool's ip:port (StackSpec.prefill_backends)
        self.dead: list[str] = []  # endpoints nobody listens on (StackSpec.dead)
        self._backend_process: dict[str, int] = {}  # backend ip:port -> index in sims
        self.kv_events: dict[str, dict[str, str]] = {}  # backend ip:port -> its KV-event endpoints
        self.picker_grpc: list[tuple[str, int]] = []
        self.picker_authz: list[tuple[str, int]] = []  # with envoy_options transport ext_authz: their HTTP ports
        self.picker_metrics_urls: list[str] = []
        self._canned: CannedBackends | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self.spec.engine == "vllm-cpu":
                self._start_vllm_cpu()
            elif self.spec.engine == "canned":
                self._canned = CannedBackends(self.spec.backends, self.workdir / "canned", model=MODEL,
                                              block_size=self.spec.block_size).start()  # fmt: skip
                self.backends.extend(self._canned.addresses)
            else:
                self._start_sims()
            self.dead = [f"127.0.0.1:{port}" for port in free_ports(self.spec.dead)] if self.spec.dead else []
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
        for envoy in reversed([*self.envoys.values(), *self.added_envoys]):
            envoy.stop()
        for proc in reversed([*self.sims, *self.pickers]):
            proc.stop()
        if self._canned is not None:
            self._canned.stop()

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
    def envoy(self) -> EnvoyProcess:
        """The main Envoy (``StackSpec.envoy``)."""
        return self.envoys[self.spec.envoy]

    @property
    def endpoints(self) -> list[str]:
        """What the picker and Envoy are given: the live backends, then the dead endpoints."""
        return [*self.backends, *self.dead]

    @property
    def picker(self) -> ManagedProcess | None:
        """Picker 0's process (None when the stack runs no picker)."""
        return self.pickers[0] if self.pickers else None

    def backend_process(self, address: str) -> ManagedProcess:
        """The process serving backend ``address`` (with ``backends_per_sim > 1``, others share it)."""
        return self.sims[self._backend_process[address]]

    @property
    def picker_metrics_url(self) -> str:
        """Picker 0's Prometheus endpoint."""
        return self.picker_metrics_urls[0]

    def picker_pids(self) -> list[int]:
        """The picker processes' pids and their front workers' (``workers.fronts``), for CPU accounting."""
        pids = [p.pid for p in self.pickers if p.pid is not None]
        return pids + [child for pid in pids for child in children_of(pid)]

    def processes(self) -> list[int]:
        """PIDs of every process this stack started (for checks that all are gone after ``stop()``)."""
        envoys = [*self.envoys.values(), *self.added_envoys]
        pids = [p.pid for p in [*self.sims, *self.pickers]] + [e.pid for e in envoys]
        return [pid for pid in pids if pid is not None]

    @property
    def running(self) -> bool:
        """True while any started process is still alive."""
        procs_alive = any(p.running for p in [*self.sims, *self.pickers])
        return procs_alive or any(e.running for e in [*self.envoys.values(), *self.added_envoys])

    # -- operations -------------------------------------------------------------------------------------
    def reset_prefix_caches(self, timeout_s: float = 5.0) -> None:
        """``reset_prefix_cache`` on every backend: all start cold again (running requests stay). With KV events,
        each backend then takes one engine step (``flush_events``: like vLLM, the simulator publishes the reset's
        ``AllBlocksCleared`` with its next step) and this waits, at most ``timeout_s``, until every picker has
        applied one clear per backend. Without that the clear was published with the next request's step and
        read a scrape round later, where it wiped the picker's marks of the requests routed meanwhile: the demo's
        second question about a document then went by load (a CI failure, stop 31)."""
        before = self.picker_clears() if self.spec.kv_events else []
        for backend in self.backends:
            reset_prefix_cache(backend, timeout_s)
        if not before:
            return
        for backend in self.backends:
            flush_events(backend, timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(now >= was + len(self.backends) for now, was in zip(self.picker_clears(), before, strict=True)):
                return
            time.sleep(0.05)

    def picker_clears(self) -> list[float]:
        """Per picker, the ``AllBlocksCleared`` its ingest applied so far (``router_kv_ingest_clears``)."""
        return [picker_metric(url, "router_kv_ingest_clears") for url in self.picker_metrics_urls]

    def restart_backend(self, address: str) -> None:
        """Stop backend ``address`` and start it again on the same port and KV-event endpoints (an engine
        restart: empty cache, event sequence back to 0). Needs ``backends_per_sim=1`` and ``engine="sim"``.
        ``stop_backend`` and ``start_backend`` are its two halves, for an outage of a chosen length."""
        self.stop_backend(address)
        self.start_backend(address)

    def stop_backend(self, address: str) -> None:
        """Stop backend ``address``'s own process (``start_backend`` brings it back); see ``restart_backend``."""
        self._own_process(address).stop()

    def start_backend(self, address: str) -> None:
        """Start stopped backend ``address`` again on its port and KV-event endpoints; waits until it serves."""
        index = self._backend_process[address]
        old = self._own_process(address)
        argv = list(old.argv)
        argv[argv.index("--port") + 1] = address.rpartition(":")[2]
        log = old.log_path.with_suffix(".restart.log")
        proc = ManagedProcess(old.name, argv, log, cwd=REPO, env=_sim_env(self.spec))
        self.sims[index] = proc
        proc.start(_log_has(proc, SIM_READY.pattern), SIM_READY_TIMEOUT_S)

    def _own_process(self, address: str) -> ManagedProcess:
        index = self._backend_process[address]
        if self.spec.engine != "sim" or sum(i == index for i in self._backend_process.values()) != 1:
            raise ValueError("restarting a backend needs one vllm-sim process per backend (backends_per_sim=1)")
        return self.sims[index]

    def restart_picker(self, index: int = 0, tag: str = "restart") -> ManagedProcess:
        """Start picker ``index`` again (stopped first, if it still runs) with its config and its old ports,
        where the Envoys' picker cluster points; its output goes to ``picker<index>-<tag>.log``."""
        old = self.pickers[index]
        old.stop()
        host, grpc_port = self.picker_grpc[index]
        metrics_port = int(self.picker_metrics_urls[index].rsplit(":", 1)[1].split("/")[0])
        listen = {"listen": {"host": host, "grpc_port": grpc_port, "metrics_port": metrics_port}}
        if self.picker_authz:
            listen["listen"]["authz_port"] = self.picker_authz[index][1]
        self.pickers[index] = proc = self._picker_process(index, listen, f"picker{index}-{tag}.log")
        proc.start(_log_has(proc, PICKER_READY.pattern), PICKER_READY_TIMEOUT_S)
        return proc

    def add_envoy(self, *, processors: list[tuple[str, int]] | None = None, **options: Any) -> EnvoyProcess:
        """Another picker Envoy on the same endpoints; ``options`` are ``EnvoyOptions`` fields (over
        ``StackSpec.envoy_options``); ``processors``: the ext_proc servers its picker cluster points at
        (default: the stack's pickers). Stopped with the stack."""
        envoy = self._start_envoy("picker", f"envoy-added{len(self.added_envoys)}", options, processors)
        self.added_envoys.append(envoy)
        return envoy

    # -- starting each piece ----------------------------------------------------------------------------
    def _start_sims(self) -> None:
        spec = self.spec
        pd = spec.prefill_backends > 0
        self._start_sim_pool(spec.backends, self.backends, pd_sim_args("decode") if pd else ())
        if pd:
            self._start_sim_pool(spec.prefill_backends, self.prefill_backends, pd_sim_args("prefill"))

    def _start_sim_pool(self, count: int, into: list[str], pd_args: tuple[str, ...]) -> None:
        spec = self.spec
        per = spec.backends_per_sim or count
        max_len = spec.max_model_len
        if spec.num_gpu_blocks is not None:  # vllm-sim refuses a max_model_len beyond its KV capacity
            max_len = min(max_len, (spec.num_gpu_blocks - 1) * spec.block_size)
        for first in range(0, count, per):
            servers = min(per, count - first)
            kv_base = str(self.workdir / f"kv{len(self.sims)}") if spec.kv_events else None
            argv = sim_argv(
                sys.executable, servers=servers, profile=spec.sim_profile, block_size=spec.block_size,
                max_model_len=max_len, num_gpu_blocks=spec.num_gpu_blocks, kv_events_base=kv_base,
                extra=(*spec.sim_args, *pd_args),
            )  # fmt: skip
            proc = ManagedProcess(f"sim{len(self.sims)}", argv, self.workdir / f"sim{len(self.sims)}.log",
                                  cwd=REPO, env=_sim_env(spec))  # fmt: skip
            self.sims.append(proc)
            proc.start(_log_has(proc, SIM_READY.pattern), SIM_READY_TIMEOUT_S)
            addresses = [m.group(1) for m in SIM_SERVING.finditer(proc.log_text())]
            if len(addresses) != servers:
                raise RuntimeError(f"{proc.name}: expected {servers} serving lines, got {addresses}")
            for i, address in enumerate(addresses):
                into.append(address)
                self._backend_process[address] = len(self.sims) - 1
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
        for i, engine in enumerate(self.sims):
            assert isinstance(engine, VllmEngine)
            self.backends.append(engine.address)
            self._backend_process[engine.address] = i
            if engine.spec.kv_events is not None:
                self.kv_events[engine.address] = dict(engine.spec.kv_events)

    def _start_picker(self, index: int) -> None:
        authz = str(self.spec.envoy_options.get("transport", "ext_proc")) == "ext_authz"
        proc = self._picker_process(index, {"listen": {"authz_port": 0}} if authz else {}, f"picker{index}.log")
        self.pickers.append(proc)
        proc.start(_log_has(proc, PICKER_READY.pattern), PICKER_READY_TIMEOUT_S)
        match = PICKER_READY.search(proc.log_text())
        assert match is not None
        host, grpc_port, metrics_port = match.group(1), int(match.group(2)), int(match.group(3))
        self.picker_grpc.append((host, grpc_port))
        if authz:
            assert match.group(4) is not None, "the picker serves no ext_authz port"
            self.picker_authz.append((host, int(match.group(4))))
        self.picker_metrics_urls.append(f"http://{host}:{metrics_port}/metrics")

    def _picker_process(self, index: int, listen: dict[str, Any], log_name: str) -> ManagedProcess:
        """Write picker ``index``'s config (``listen`` over the spec's overrides) and make its process."""
        spec = self.spec
        roles = {e: "prefill" for e in self.prefill_backends} | ({e: "decode" for e in self.backends}
                                                                   if self.prefill_backends else {})  # fmt: skip
        config = picker_config(
            [*self.endpoints, *self.prefill_backends], self.kv_events, roles=roles,
            block_size=None if spec.discover_scheme else spec.block_size,
            hash_seed=None if spec.discover_scheme else HASH_SEED, metrics_urls=self._metrics_urls(),
            log_level=spec.picker_log_level, overrides=merge_sections(spec.picker_overrides, listen),
        )  # fmt: skip
        path = self.workdir / f"picker{index}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
        return ManagedProcess(f"picker{index}", argv, self.workdir / log_name, cwd=spec.picker_tree or REPO)

    def _metrics_urls(self) -> dict[str, str]:
        """Dead endpoints borrow backend 0's metrics; with ``hide_live_load`` the live ones answer 404."""
        if not self.dead:
            return {}
        urls = {e: f"http://{self.backends[0]}/metrics" for e in self.dead}
        if self.spec.hide_live_load:
            urls.update({e: f"http://{e}/no-metrics-here" for e in self.backends})
        return urls

    def _start_envoy(
        self,
        kind: EnvoyKind,
        name: str | None = None,
        options: dict[str, Any] | None = None,
        processors: list[tuple[str, int]] | None = None,
    ) -> EnvoyProcess:
        workdir = self.workdir / (name or f"envoy-{kind}")
        extra = {**self.spec.envoy_options, **(options or {})} if kind == "picker" else {}
        default = self.picker_authz if str(extra.get("transport", "ext_proc")) == "ext_authz" else self.picker_grpc
        grpc = default if processors is None else processors

        def make() -> EnvoyProcess:  # fresh free ports on every try (start_on_free_ports)
            listen_port, admin_port, spare_port = free_ports(3)
            host, picker_port = grpc[0] if grpc else ("127.0.0.1", spare_port)
            opts = EnvoyOptions(
                endpoints=tuple(self.endpoints), listen_port=listen_port, admin_port=admin_port,
                picker_host=host, picker_port=picker_port, access_log_path=str(workdir / "access.log"), **extra,
            )  # fmt: skip
            return EnvoyProcess(opts, workdir, config=envoy_bootstrap(kind, opts, grpc))

        return start_on_free_ports(make)


def reset_prefix_cache(backend: str, timeout_s: float = 5.0, flush: bool = True) -> None:
    """``POST /reset_prefix_cache`` on ``backend`` (``ip:port``). vLLM publishes the ``AllBlocksCleared`` only
    with its next engine step, so an idle engine's reset reaches no KV-event subscriber until it serves again;
    ``flush`` then sends a one-token completion (too short to fill a block) so the event goes out now."""
    req = urllib.request.Request(f"http://{backend}/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()
    if flush:
        flush_events(backend)


def picker_metric(url: str, name: str) -> float:
    """The sum of the samples of metric ``name`` (or ``name_total``), whatever their labels, on the metrics page
    at ``url``; 0 when it has none."""
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        text = resp.read().decode()
    heads = (f"{name} ", f"{name}{{", f"{name}_total ", f"{name}_total{{")
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(heads))


def flush_events(backend: str, timeout_s: float = 60.0) -> None:
    """Make ``backend`` run one engine step (a one-token completion), so events it queued are published."""
    body = json.dumps({"model": MODEL, "prompt": [11], "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://{backend}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()


def _sim_env(spec: StackSpec) -> dict[str, str]:
    """The simulators' environment: PYTHONHASHSEED pinned to the picker's ``hash_seed`` (none to discover)."""
    return dict(os.environ) if spec.discover_scheme else {**os.environ, "PYTHONHASHSEED": HASH_SEED}


def _log_has(proc: ManagedProcess, pattern: str) -> Callable[[], bool]:
    """A readiness check: ``pattern`` appeared in ``proc``'s output."""
    return lambda: bool(proc.log_matches(pattern))
