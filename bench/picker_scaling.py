"""Picker throughput as it is given cores: one process against front workers, side by side in one run.

    python -m bench.picker_scaling              # 1K and 8K-token prompts; fronts 0, 1, 2; 3 rounds of 6 s each
    python -m bench.picker_scaling --quick      # 1 round of 4 s
    python -m bench.picker_scaling --fronts 0,2 --sizes 8K --connections 64

The picker must be the bottleneck, so everything else is made cheap: the backends are one Envoy answering canned
vLLM-shaped responses (``bench/canned_backends.py``: no tokenizing, idle load), the load comes from ``wrk`` (C,
one thread, a Lua script giving each request its own question after the same document), and Envoy runs with
one worker. One stack per configuration is started up front; rounds then alternate between them (and a
round-robin Envoy with no picker, the ceiling of the rest of the system), so drift on a shared machine falls
on every side alike. Reported per configuration: requests/s (median over rounds, and its ratio to one
process), latency p50/p99 from wrk, the share of requests the picker decided (the rest failed open or were
passed through; counters are read at round boundaries, so requests in flight there can push it a little over
100%), the picker's CPU per request (all its processes; in brackets the main process's, which with fronts is the
decider alone) and the front Envoy's, which shares the same cores.

Needs ``wrk`` (``apt-get install wrk``; ``scripts/setup.sh`` installs it where it can).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.picker_latency import SYSTEM_PROMPT, filler, parse_sizes
from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL
from bench.suite.measure import thread_cpu_s

_QUESTION = "@@QUESTION@@"
_WRK_SCRIPT = """
local head, tail
local n = 0
init = function(args)
  local f = io.open(args[1], "r"); head = f:read("*a"); f:close()
  f = io.open(args[2], "r"); tail = f:read("*a"); f:close()
end
request = function()
  n = n + 1
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, head .. n .. tail)
end
"""


@dataclass
class Side:
    """One configuration: ``fronts`` workers (None: the round-robin Envoy, no picker) and its rounds."""

    name: str
    fronts: int | None
    stack: Stack | None = None
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    decided: float = 0.0
    passed_through: float = 0.0
    prompt_tokens: float = 0.0
    cpu_s: float = 0.0
    decider_cpu_s: float = 0.0  # of cpu_s, the main process's (with fronts: the decider alone)
    envoy_cpu_s: float = 0.0  # the Envoy in front (ext_proc client, routing): it shares the cores


def body_files(workdir: Path, tokens: int) -> tuple[Path, Path]:
    """The request body, split around the question number, as the Lua script's two files."""
    document = filler(max(tokens // 16, 4))
    user = f"{document}\n\nQuestion {_QUESTION}: what changed in the last item?"
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user},
    ]})  # fmt: skip
    head, tail = body.split(_QUESTION)
    (workdir / "head.txt").write_text(head)
    (workdir / "tail.txt").write_text(tail)
    return workdir / "head.txt", workdir / "tail.txt"


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def parse_wrk(text: str) -> tuple[float, float, float, int, int]:
    """(requests/s, p50 ms, p99 ms, requests, errors: non-2xx plus socket errors) from ``wrk --latency``."""

    def latency(q: str) -> float:
        m = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        return float(m.group(1)) * _UNIT_MS[m.group(2)] if m else float("nan")

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    done = re.search(r"(\d+) requests in", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = int(non2xx.group(1)) if non2xx else 0
    errors += sum(int(x) for x in sock.groups()) if sock else 0
    return (float(rps.group(1)) if rps else 0.0, latency("50"), latency("99"),
            int(done.group(1)) if done else 0, errors)  # fmt: skip


_COUNTERS = ("router_decisions_total", "router_decider_unavailable_total", "router_prompt_tokens_total")


def counters(urls: list[str]) -> dict[str, float]:
    """The picker's request counters (``_COUNTERS``), summed over label sets and pickers."""
    out = dict.fromkeys(_COUNTERS, 0.0)
    for url in urls:
        with urllib.request.urlopen(url, timeout=5.0) as resp:
            for line in resp.read().decode().splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in out:
                    out[name] += float(line.rsplit(" ", 1)[1])
    return out


def run_round(side: Side, url: str, files: tuple[Path, Path], script: Path, connections: int, seconds: int) -> None:
    stack = side.stack
    assert stack is not None
    before = counters(stack.picker_metrics_urls) if side.fronts is not None else {}
    main = [p.pid for p in stack.pickers if p.pid is not None]
    cpu0 = thread_cpu_s(stack.picker_pids()) if side.fronts is not None else 0.0
    main0 = thread_cpu_s(main)
    envoy = [pid] if (pid := stack.envoy.pid) is not None else []
    envoy0 = thread_cpu_s(envoy)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(int(seconds), 1)}s", "--latency", "-s", str(script), url, "--",
         str(files[0]), str(files[1])],
        capture_output=True, text=True, timeout=seconds + 60, check=True,
    ).stdout  # fmt: skip
    rps, p50, p99, done, errors = parse_wrk(out)
    side.rps.append(rps)
    side.p50_ms.append(p50)
    side.p99_ms.append(p99)
    side.requests += done
    side.envoy_cpu_s += thread_cpu_s(envoy) - envoy0
    side.errors += errors
    if side.fronts is not None:
        side.cpu_s += thread_cpu_s(stack.picker_pids()) - cpu0
        side.decider_cpu_s += thread_cpu_s(main) - main0
        after = counters(stack.picker_metrics_urls)
        side.decided += after["router_decisions_total"] - before["router_decisions_total"]
        side.passed_through += after["router_decider_unavailable_total"] - before["router_decider_unavailable_total"]
        side.prompt_tokens += after["router_prompt_tokens_total"] - before["router_prompt_tokens_total"]


def start_stack(fronts: int | None, workdir: Path) -> Stack:
    picker = fronts is not None
    spec = StackSpec(
        backends=4, envoy="picker" if picker else "round_robin", engine="canned",
        picker_overrides={"workers": {"fronts": fronts or 0}} if picker else {},
    )  # fmt: skip
    return Stack(spec, workdir).start()


def print_table(tokens: int, sides: list[Side], connections: int) -> None:
    base = next((statistics.median(s.rps) for s in sides if s.fronts == 0 and s.rps), None)
    print(f"\n{tokens} tokens (document + question), wrk -t1 -c{connections}; medians over "
          f"{len(sides[0].rps)} rounds (min-max)")  # fmt: skip
    print(" side          |      req/s (min-max)    | vs 1 proc |  p50 ms  p99 ms | picked | "
          "prompt tok | CPU ms/req (main) | Envoy CPU | errors")  # fmt: skip
    for s in sides:
        rps = statistics.median(s.rps)
        ratio = f"{rps / base:8.2f}x" if base and s.fronts is not None else "        -"
        picked = f"{100 * s.decided / s.requests:5.1f}%" if s.fronts is not None and s.requests else "     -"
        tok = f"{s.prompt_tokens / s.decided:10.0f}" if s.decided else "         -"
        cpu = "                -"
        if s.fronts is not None and s.requests:
            cpu = f"{1000 * s.cpu_s / s.requests:8.2f} ({1000 * s.decider_cpu_s / s.requests:5.2f})"
        print(f" {s.name:13} | {rps:8.0f} ({min(s.rps):5.0f}-{max(s.rps):5.0f}) | {ratio} | "
              f"{statistics.median(s.p50_ms):6.2f}  {statistics.median(s.p99_ms):6.2f} | {picked} | {tok} | {cpu} | "
              f"{1000 * s.envoy_cpu_s / max(s.requests, 1):9.2f} | {s.errors}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.picker_scaling", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one round of 4 s per side")
    p.add_argument("--sizes", default="1K,8K", help="prompt sizes in tokens (K = 1024)")
    p.add_argument("--fronts", default="0,1,2", help="front worker counts to compare (0 = one process)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (concurrent requests)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=6, help="per round")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print("picker_scaling: needs wrk (apt-get install wrk, or scripts/setup.sh)", file=sys.stderr)
        return 2
    rounds, seconds = (1, 4) if args.quick else (args.rounds, args.seconds)
    workdir = Path(tempfile.mkdtemp(prefix="picker-scaling-"))
    script = workdir / "questions.lua"
    script.write_text(_WRK_SCRIPT)
    sides = [Side("round_robin", None)] + [
        Side("1 process" if n == 0 else f"{n} fronts", n) for n in (int(x) for x in args.fronts.split(","))
    ]
    started = time.monotonic()
    try:
        for side in sides:
            side.stack = start_stack(side.fronts, workdir / side.name.replace(" ", "-"))
        print(f"{len(sides)} stacks up in {time.monotonic() - started:.0f} s (logs in {workdir})", flush=True)
        for tokens in parse_sizes(args.sizes):
            (workdir / str(tokens)).mkdir(exist_ok=True)
            files = body_files(workdir / str(tokens), tokens)
            fresh = [Side(s.name, s.fronts, s.stack) for s in sides]
            for side in fresh:  # warm-up: tokenizers, caches, Envoy connections
                run_round(Side(side.name, side.fronts, side.stack), _url(side), files, script, args.connections, 2)
            for r in range(rounds):
                order = fresh if r % 2 == 0 else list(reversed(fresh))
                for side in order:
                    run_round(side, _url(side), files, script, args.connections, seconds)
            print_table(tokens, fresh, args.connections)
    finally:
        for side in sides:
            if side.stack is not None:
                with contextlib.suppress(Exception):
                    side.stack.stop()
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _url(side: Side) -> str:
    assert side.stack is not None
    return side.stack.url + "/v1/chat/completions"


if __name__ == "__main__":
    sys.exit(main())
