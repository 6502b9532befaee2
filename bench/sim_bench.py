"""Benchmark of the vLLM simulator itself (not a test): CPU cost and timing fidelity.

    .venv/bin/python -m bench.sim_bench [--quick]

Starts ``vllm-sim`` with 8 servers in one child process (its own PID, stopped with SIGTERM at the end) and
drives it from this process over HTTP on 127.0.0.1. Prints two tables:

1. **Capacity**: streaming chat requests with unique 1K- and 16K-token prompts (every prompt is tokenized and
   hashed: no tokenizer-cache or prefix-cache help), ``fast`` timing profile so the simulated GPU is never
   the bottleneck. Reports the simulator's CPU seconds per request (from /proc/<pid>/stat) and the
   requests/s one process sustains per core it burns (1 / CPU seconds per request).
2. **TTFT drift**: the default ``h100-llama3-8b`` profile under open-loop Poisson load well below the model's
   capacity. For each request, client-measured TTFT (send → first content chunk) vs the model's own prediction
   (``GET /sim/requests``: arrival at the engine → end of the step that produced the first token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.stack_config import MODEL, REPO, SIM_READY, SIM_SERVING

TOKENIZER = REPO / "tokenizer_cache" / MODEL
SERVERS = 8
_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "river")


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    urls: list[str]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the simulator process (all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sim(*flags: str) -> Sim:
    """Start ``vllm-sim`` with 8 servers on free ports; wait (bounded) for its ready line."""
    cmd = [sys.executable, "-m", "vllm_sim", MODEL, "--port", "0", "--sim-num-servers", str(SERVERS),
           "--tokenizer", str(TOKENIZER), "--max-model-len", "20000", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    urls: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or SIM_READY.match(line):
            break
        match = SIM_SERVING.match(line.strip())
        if match:
            urls.append(f"http://{match.group(1)}")
    if len(urls) != SERVERS:
        proc.kill()
        raise RuntimeError(f"vllm-sim did not start 8 servers: {urls}")
    return Sim(proc, urls)


def prompt_text(i: int, tokens: int) -> str:
    """A unique user message of roughly ``tokens`` tokens (one token per word)."""
    rng = random.Random(i)
    return f"request {i}: " + " ".join(rng.choice(_WORDS) for _ in range(tokens - 16))


async def stream_chat(session: aiohttp.ClientSession, url: str, text: str, max_tokens: int) -> tuple[str, float]:
    """One streaming chat request; returns (response id, client TTFT in seconds)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}  # fmt: skip
    start = time.perf_counter()
    rid, ttft = "", -1.0
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            rid = chunk["id"]
            if ttft < 0 and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
    return rid, ttft


async def capacity(sim: Sim, prompt_tokens: int, n: int, concurrency: int, out_tokens: int = 16) -> dict[str, float]:
    """Closed loop: ``concurrency`` clients round-robin over the 8 servers until ``n`` requests are done."""
    texts = [prompt_text(i + prompt_tokens, prompt_tokens) for i in range(n)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await stream_chat(session, sim.urls[i % SERVERS], texts[i], out_tokens)

    cpu0, t0 = sim.cpu_s(), time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, sim.cpu_s() - cpu0
    return {"req_s": n / wall, "cpu_ms": 1000 * cpu / n, "per_core": n / cpu, "cpu_util": cpu / wall}


async def drift(sim: Sim, prompt_tokens: int, rate_per_s: float, n: int) -> list[tuple[float, float]]:
    """Open-loop Poisson arrivals; returns (client TTFT, model TTFT) per request."""
    rng = random.Random(7)
    texts = [prompt_text(10_000 + i, prompt_tokens) for i in range(n)]
    async with aiohttp.ClientSession() as session:
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(stream_chat(session, sim.urls[i % SERVERS], texts[i], 8)))
            await asyncio.sleep(rng.expovariate(rate_per_s))
        results = await asyncio.gather(*tasks)
        pairs: list[tuple[float, float]] = []
        for s, url in enumerate(sim.urls):
            ids = [rid for i, (rid, _) in enumerate(results) if i % SERVERS == s]
            async with session.get(f"{url}/sim/requests", params={"ids": ",".join(ids)}) as resp:
                records = await resp.json()
            pairs += [(ttft, records[rid]["model_ttft_s"]) for i, (rid, ttft) in enumerate(results)
                      if i % SERVERS == s and rid in records]  # fmt: skip
    return pairs


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main(quick: bool) -> None:
    scale = 0.25 if quick else 1.0
    load = os.getloadavg()[0]
    print(f"vllm-sim benchmark: {SERVERS} servers in one process, {os.cpu_count()} CPUs, load average {load:.1f}\n")
    sim = start_sim("--sim-profile", "fast", "--num-gpu-blocks-override", "40000")
    try:
        rows = [(1024, 16, await capacity(sim, 1024, int(400 * scale), 16)),
                (16384, 16, await capacity(sim, 16384, int(64 * scale), 8)),
                (1024, 256, await capacity(sim, 1024, int(100 * scale), 32, out_tokens=256))]  # fmt: skip
    finally:
        sim.stop()
    print("Capacity (fast profile, streaming chat, unique prompts)")
    print(f"{'prompt':>8} {'output':>7} {'achieved req/s':>15} {'sim CPU ms/req':>15} {'req/s per sim core':>19} "
          f"{'sim CPU':>8}")  # fmt: skip
    for tokens, out, r in rows:
        print(f"{tokens:>8} {out:>7} {r['req_s']:>15.1f} {r['cpu_ms']:>15.2f} {r['per_core']:>19.1f} "
              f"{r['cpu_util']:>7.0%}")  # fmt: skip
    per_token_us = 1000 * (rows[2][2]["cpu_ms"] - rows[0][2]["cpu_ms"]) / (256 - 16)
    print(f"=> about {per_token_us:.0f} us of simulator CPU per streamed output token")

    sim = start_sim()  # default h100-llama3-8b profile
    try:
        cpu0, t0 = sim.cpu_s(), time.perf_counter()
        pairs = await drift(sim, 1024, rate_per_s=40.0, n=int(400 * scale))
        util = (sim.cpu_s() - cpu0) / (time.perf_counter() - t0)
    finally:
        sim.stop()
    rel = [abs(c / m - 1) for c, m in pairs]
    diff_ms = [1000 * (c - m) for c, m in pairs]
    model_ms = [1000 * m for _, m in pairs]
    print("\nTTFT drift (h100-llama3-8b, 1K-token prompts, Poisson 40 req/s over 8 servers, sim CPU "
          f"{util:.0%})")  # fmt: skip
    print(f"{'':>22} {'p50':>8} {'p90':>8}")
    print(f"{'model TTFT ms':>22} {pct(model_ms, 50):>8.1f} {pct(model_ms, 90):>8.1f}")
    print(f"{'measured - model ms':>22} {pct(diff_ms, 50):>8.2f} {pct(diff_ms, 90):>8.2f}")
    print(f"{'|drift| %':>22} {100 * pct(rel, 50):>8.2f} {100 * pct(rel, 90):>8.2f}")
    print(f"(requests compared: {len(pairs)}; load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    asyncio.run(main(parser.parse_args().quick))
