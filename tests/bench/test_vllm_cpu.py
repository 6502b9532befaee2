"""bench/vllm_cpu.py's pure parts: the engine's command line and environment (no engine needed)."""

from __future__ import annotations

from pathlib import Path

from bench.vllm_cpu import EngineSpec, engine_argv, engine_env

TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def _has(argv: list[str], flags: list[str]) -> bool:
    return any(argv[i : i + len(flags)] == flags for i in range(len(argv)))


def test_tool_flags_are_on_by_default_and_can_be_left_out() -> None:
    python, model = Path("/venv/bin/python"), Path("/model")
    assert _has(engine_argv(EngineSpec(port=1), python, model), TOOL_FLAGS)
    without = engine_argv(EngineSpec(port=1, auto_tool_choice=False), python, model)
    assert not any(flag in without for flag in TOOL_FLAGS)
    assert "--enable-prompt-tokens-details" in without and "--enable-scale-out" in without


def test_kv_events_block_size_and_env() -> None:
    spec = EngineSpec(port=8000, block_size=64, hash_seed="0", core=1, num_gpu_blocks=32,
                      kv_events={"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"})  # fmt: skip
    argv = engine_argv(spec, Path("/p"), Path("/m"))
    assert _has(argv, ["--block-size", "64"]) and _has(argv, ["--num-gpu-blocks-override", "32"])
    config = argv[argv.index("--kv-events-config") + 1]
    assert '"endpoint": "tcp://*:5557"' in config and '"enable_kv_cache_events": true' in config
    env = engine_env(spec, {"PYTHONHASHSEED": "7", "HOME": "/h"})
    assert env["PYTHONHASHSEED"] == "0" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_eager_by_default_and_compiled_for_the_timed_benchmarks() -> None:
    """Correctness tiers start without torch.compile (half the start-up); a benchmark timing the engine opts out."""
    assert "--enforce-eager" in engine_argv(EngineSpec(port=1), Path("/p"), Path("/m"))
    assert "--enforce-eager" not in engine_argv(EngineSpec(port=1, eager=False), Path("/p"), Path("/m"))
