"""The real-vLLM fleet for this tier: two vLLM CPU engines (one per core) with KV events, our picker (``extproc
serve``) and real Envoy, on 127.0.0.1. Built once per session by ``conftest.py`` and reused by every test.

    fleet.url("/v1/chat/completions")   # through Envoy and the picker
    fleet.engines[i].address            # "127.0.0.1:PORT" as Envoy and the picker name it
    fleet.picker_counter("router_kv_ingest_blocks_stored_total")
    fleet.restart_picker(); fleet.restart_engine(i); fleet.reset_prefix_caches()

Every process started here is a ``ManagedProcess`` (bench/procs.py) stopped by its own process group.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.procs import ManagedProcess, free_ports
from bench.stack import flush_events, reset_prefix_cache
from bench.stack_config import PICKER_READY, REPO, kv_events_sources, picker_config
from bench.vllm_cpu import MODEL, Engine, EngineSpec, start_engines
from tests.support.envoy import EnvoyProcess, options_for_test

PICKER_READY_TIMEOUT_S = 90.0
BLOCK_SIZE = 128  # vLLM's CPU default; the CPU attention backend needs a multiple of 32
NUM_GPU_BLOCKS = 64  # small, so a few long prompts evict (BlockRemoved); 63 usable blocks = 8064 tokens
MAX_MODEL_LEN = 4096
LORA_NAME = "tiny-lora"


def fleet_specs(
    ports: list[int], workdir: Path, hash_algo: str, hash_seed: str | None, lora: Path | None = None
) -> list[EngineSpec]:
    """One engine per port, pinned to cores 0, 1, ..., each with its own ipc:// PUB and replay sockets; with
    ``lora`` (an adapter folder) each serves it as ``LORA_NAME``."""
    extra = () if lora is None else ("--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"{LORA_NAME}={lora}")
    return [
        EngineSpec(port=port, core=i, kv_events=kv_events_sources(str(workdir / f"kv{i}"), 0),
                   block_size=BLOCK_SIZE, hash_algo=hash_algo, hash_seed=hash_seed,
                   num_gpu_blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN, extra=extra)
        for i, port in enumerate(ports)
    ]  # fmt: skip


@dataclass
class Fleet:
    """A running fleet (see the module docstring). ``hash_algo``/``hash_seed``: what the engines and the
    picker both use."""

    engines: list[Engine]
    workdir: Path
    hash_algo: str
    hash_seed: str | None
    lora: Path | None = None
    picker: ManagedProcess | None = None
    envoy: EnvoyProcess | None = None
    grpc_port: int = 0
    metrics_port: int = 0
    restarts: int = field(default=0)

    @classmethod
    def start(
        cls, python: Path, model_dir: Path, workdir: Path, hash: tuple[str, str | None], lora: Path | None = None
    ) -> Fleet:
        """Start engines (in parallel), picker and Envoy; ``hash``: (algorithm, PYTHONHASHSEED or None)."""
        specs = fleet_specs(free_ports(2), workdir, *hash, lora)
        fleet = cls(start_engines(specs, python, model_dir, workdir), workdir, *hash, lora)
        try:
            fleet.grpc_port, fleet.metrics_port = free_ports(2)
            fleet.start_picker()
            opts = options_for_test([e.address for e in fleet.engines], workdir=workdir, picker_port=fleet.grpc_port)
            fleet.envoy = EnvoyProcess(opts, workdir / "envoy").start()
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def stop(self) -> None:
        """Stop Envoy, the picker and every engine; idempotent."""
        if self.envoy is not None:
            self.envoy.stop()
        if self.picker is not None:
            self.picker.stop()
        for engine in self.engines:
            engine.stop()

    # -- the picker -------------------------------------------------------------------------------------
    def picker_yaml(self) -> dict[str, Any]:
        """The picker's config: the engines with their KV-event sockets, block size and hash configured."""
        addresses = [e.address for e in self.engines]
        events = {e.address: dict(e.spec.kv_events or {}) for e in self.engines}
        model = {"name": MODEL, "tokenizer_dir": str(REPO / "tokenizer_cache" / MODEL), "block_size": BLOCK_SIZE,
                 "hash_algo": self.hash_algo, "hash_seed": self.hash_seed,
                 "loras": [] if self.lora is None else [{"name": LORA_NAME, "path": str(self.lora)}]}  # fmt: skip
        config = picker_config(addresses, events, block_size=BLOCK_SIZE, hash_seed="", overrides={})
        config["models"] = [model]
        config["logging"] = {"level": "INFO"}  # the ingest and stream lines explain a failure here
        config["listen"] = {"host": "127.0.0.1", "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        return config

    def start_picker(self) -> None:
        """Start ``extproc serve`` on the fleet's fixed ports (so Envoy keeps pointing at it after a restart)."""
        self.restarts += 1
        path = self.workdir / f"picker{self.restarts}.yaml"
        path.write_text(yaml.safe_dump(self.picker_yaml(), sort_keys=False))
        argv = [sys.executable, "-m", "extproc.cli", "serve", "--config", str(path)]
        proc = ManagedProcess("picker", argv, self.workdir / f"picker{self.restarts}.log", cwd=REPO)
        self.picker = proc
        proc.start(lambda: bool(proc.log_matches(PICKER_READY.pattern)), PICKER_READY_TIMEOUT_S)

    def restart_picker(self) -> None:
        assert self.picker is not None
        self.picker.stop()
        self.start_picker()

    def picker_counter(self, name: str) -> float:
        """The sum of every sample of ``name`` on the picker's /metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"))  # fmt: skip

    def wait_ingest_quiet(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> None:
        """Wait until the picker's ingest counters stop moving for ``quiet_s`` (events of the last request
        applied); bounded by ``timeout_s``."""
        names = ("router_kv_ingest_batches_total", "router_kv_ingest_clears_total", "router_kv_ingest_purges_total")
        deadline = time.monotonic() + timeout_s
        last = tuple(self.picker_counter(n) for n in names)
        still_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = tuple(self.picker_counter(n) for n in names)
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= quiet_s:
                return

    # -- engines ----------------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        assert self.envoy is not None
        return self.envoy.url(path)

    def engine_url(self, index: int, path: str) -> str:
        return f"http://{self.engines[index].address}{path}"

    def reset_prefix_cache(self, index: int, flush: bool = True) -> None:
        """``reset_prefix_cache`` on engine ``index`` (flushed: see bench.stack), then wait for ingest."""
        reset_prefix_cache(self.engines[index].address, timeout_s=10.0, flush=flush)
        self.wait_ingest_quiet()

    def flush_events(self, index: int) -> None:
        """One engine step on engine ``index`` (a one-token completion), so queued events go out."""
        flush_events(self.engines[index].address)
        self.wait_ingest_quiet()

    def reset_prefix_caches(self) -> None:
        """``reset_prefix_cache`` on every engine, flushed: every cache and the picker's index are empty."""
        for i in range(len(self.engines)):
            self.reset_prefix_cache(i)

    def restart_engine(self, index: int) -> None:
        """Stop engine ``index`` and start it again with the same spec and port (empty cache, seq 0)."""
        old = self.engines[index]
        old.stop()
        self.engines[index] = old.restarted(old.log_path.with_suffix(".restart.log")).start_engine()
