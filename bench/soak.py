"""Soak run: mixed client load through Envoy and the picker for minutes, with faults injected at random.

    .venv/bin/python -m bench.soak --minutes 10 --out soak.json      # the issue's run (not a CI test)
    .venv/bin/python -m bench.soak --minutes 1 --fault-every-s 8     # a quick look

The stack: ``--backends`` simulators (one process each, so one can die), one picker following their KV events
into a real valkey-server (the precise index) plus its own approximate index, one real Envoy. The load: closed
loop ``--workers`` clients mixing chat questions about shared documents (cache reuse), completions, SSE
streams, per-tenant ``cache_salt`` requests and deliberately bad bodies. The faults, one at a time at random
moments: picker killed (SIGKILL) and restarted, picker frozen (SIGSTOP) past Envoy's message timeout, a
backend killed mid-stream and restarted on its port, Redis killed and restarted empty, Redis frozen.

What it reports (stdout, and JSON with ``--out``): every request's outcome class, and the checks the issue
asks for: no request without a response; 5xx or broken streams only in the moments after a backend died;
the picker's RSS over time with its slope (MiB per minute, least squares, per picker incarnation).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import ManagedProcess, free_ports
from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL
from bench.valkey import valkey_process

FAULTS = ("picker_kill", "picker_freeze", "backend_kill", "redis_kill", "redis_freeze")
DEATH_WINDOW_S = 1.0  # 5xx / broken streams this soon after a backend died are the expected kind
MESSAGE_TIMEOUT_S = 2.0  # Envoy's ext_proc message timeout (EnvoyOptions default)


@dataclass
class Outcome:
    kind: str
    started: float
    seconds: float = 0.0
    status: int | None = None
    error: str | None = None  # set when no complete answer arrived (before or after the status)


@dataclass
class Fault:
    name: str
    at: float
    target: str = ""
    recovered_at: float = 0.0


@dataclass
class Run:
    t0: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    rss: list[tuple[float, int, float]] = field(default_factory=list)  # (seconds, incarnation, MiB)
    picker_incarnation: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0


# -- the workload ------------------------------------------------------------------------------------------

DOCS = [f"Document {d}: " + f"section {d} of the shared handbook, with its tables and notes. " * 30 for d in range(6)]


def request_for(rng: random.Random) -> tuple[str, str, dict[str, Any] | bytes]:
    """(kind, path, body) of one request of the mix."""
    roll = rng.random()
    if roll < 0.45:
        doc = rng.choice(DOCS)
        q = f"Question {rng.randrange(1000)} about it?"
        return (
            "chat",
            "/v1/chat/completions",
            {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": doc + q}]},
        )
    if roll < 0.60:
        return "completion", "/v1/completions", {"model": MODEL, "prompt": rng.choice(DOCS)[:400], "max_tokens": 4}
    if roll < 0.80:
        return (
            "stream",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": 40,
                "stream": True,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Tell story {rng.randrange(100)}."}],
            },
        )
    if roll < 0.95:
        return (
            "tenant",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "max_tokens": 4,
                "cache_salt": f"tenant-{rng.randrange(4)}",
                "messages": [{"role": "user", "content": rng.choice(DOCS) + "Summary?"}],
            },
        )
    bad = rng.choice(
        [
            b"{not json",
            b'{"model": 5}',
            b'{"model": "' + MODEL.encode() + b'", "messages": 7}',
            b"[" * 5000,
            b"\xff\xfe",
        ]
    )
    return "bad", "/v1/chat/completions", bad


async def send(session: aiohttp.ClientSession, url: str, kind: str, body: dict[str, Any] | bytes, run: Run) -> None:
    out = Outcome(kind, run.now())
    t = time.monotonic()
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
            out.status = resp.status
            if kind == "stream" and resp.status == 200:
                done = False
                async for line in resp.content:
                    done = done or line.startswith(b"data: [DONE]")
                if not done:
                    out.error = "stream ended without [DONE]"
            else:
                await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error = type(exc).__name__
    out.seconds = time.monotonic() - t
    run.outcomes.append(out)


async def worker(stack: Stack, run: Run, seed: int, stop: asyncio.Event) -> None:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            kind, path, body = request_for(rng)
            await send(session, stack.url + path, kind, body, run)
            await asyncio.sleep(rng.uniform(0.0, 0.05))


# -- measuring ------------------------------------------------------------------------------------------------


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Faults:
    """Injects one fault at a time and recovers from it; owns the restarted processes."""

    def __init__(self, stack: Stack, redis: ManagedProcess, redis_port: int, run: Run, rng: random.Random) -> None:
        self.stack, self.redis, self.redis_port, self.run, self.rng = stack, redis, redis_port, run, rng

    async def inject(self, name: str) -> Fault:
        fault = Fault(name, self.run.now())
        self.run.faults.append(fault)
        if name == "picker_kill":
            await self._kill_and_restart_picker()
        elif name == "picker_freeze":
            await self._freeze(self.stack.pickers[0], MESSAGE_TIMEOUT_S + 1.5)
        elif name == "backend_kill":
            i = self.rng.randrange(len(self.stack.sims))
            fault.target = self.stack.backends[i]
            _signal(self.stack.sims[i], signal.SIGKILL)
            await asyncio.sleep(2.0)
            await asyncio.to_thread(self.stack.restart_backend, fault.target)  # same port and event endpoints
        elif name == "redis_kill":
            _signal(self.redis, signal.SIGKILL)
            self.redis.stop()
            await asyncio.sleep(2.0)
            self.redis = await asyncio.to_thread(valkey_process, self.redis_port, self.redis.log_path.parent)
        elif name == "redis_freeze":
            await self._freeze(self.redis, 3.0)
        fault.recovered_at = self.run.now()
        return fault

    async def _kill_and_restart_picker(self) -> None:
        old = self.stack.pickers[0]
        _signal(old, signal.SIGKILL)
        old.stop()
        await asyncio.sleep(1.5)
        await asyncio.to_thread(self.stack.restart_picker, 0, f"restart{self.run.picker_incarnation + 1}")
        self.run.picker_incarnation += 1

    async def _freeze(self, proc: ManagedProcess, seconds: float) -> None:
        _signal(proc, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            _signal(proc, signal.SIGCONT)


def _signal(proc: ManagedProcess, sig: signal.Signals) -> None:
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the group this launcher started


# -- the run -------------------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    run, rng = Run(), random.Random(args.seed)
    redis_port, grpc_port, metrics_port = free_ports(3)
    redis = valkey_process(redis_port, workdir)
    spec = StackSpec(
        backends=args.backends, backends_per_sim=1, kv_events=True, sim_profile="fast",
        sim_args=("--sim-decode-step-s", "0.02"),
        picker_overrides={
            "listen": {"host": "127.0.0.1", "grpc_port": grpc_port, "metrics_port": metrics_port},
            "index": {"backend": "redis", "url": f"redis://127.0.0.1:{redis_port}/0",
                      "timeout_s": 0.02, "lookup_deadline_s": 0.02},
        },
    )  # fmt: skip
    stack = Stack(spec, workdir / "stack").start()
    faults = Faults(stack, redis, redis_port, run, rng)
    run.t0 = time.monotonic()  # the clock starts with the load, not with the stack's start-up
    stop = asyncio.Event()
    try:
        workers = [asyncio.create_task(worker(stack, run, args.seed * 100 + i, stop)) for i in range(args.workers)]
        deadline = run.now() + args.minutes * 60
        next_fault = run.now() + rng.uniform(0.5, 1.5) * args.fault_every_s
        next_rss = 0.0
        while run.now() < deadline:
            if run.now() >= next_rss:
                mib = rss_mib(stack.pickers[0].pid)
                if mib is not None:
                    run.rss.append((round(run.now(), 1), run.picker_incarnation, round(mib, 2)))
                next_rss = run.now() + args.rss_every_s
            if run.now() >= next_fault and run.now() < deadline - 10:
                kills = sum(1 for f in run.faults if f.name == "picker_kill")
                choices = [f for f in args.faults if f != "picker_kill" or kills < args.max_picker_kills]
                fault = await faults.inject(rng.choice(choices))
                print(f"[{fault.at:7.1f}s] {fault.name} {fault.target} (recovered {fault.recovered_at:.1f}s)",
                      flush=True)  # fmt: skip
                next_fault = run.now() + rng.uniform(0.5, 1.5) * args.fault_every_s
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*workers)
    finally:
        stack.stop()
        faults.redis.stop()
    return report(run, args)


def slope_mib_per_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return None if var == 0 else 60 * sum((t - mx) * (v - my) for t, v in points) / var


def classify(o: Outcome, deaths: list[float], picker_down: list[tuple[float, float]]) -> str:
    """One outcome's class; the expected kinds are named, anything else says UNEXPECTED."""
    near_death = any(0 <= o.started + o.seconds - d <= DEATH_WINDOW_S + 3.0 and o.started - d <= DEATH_WINDOW_S
                     for d in deaths)  # fmt: skip
    if o.status is None:
        return "NO RESPONSE"
    if o.error is not None:
        return "broken stream after backend death" if near_death else "BROKEN STREAM (unexpected)"
    if o.kind == "bad" and o.status >= 500 and any(a <= o.started <= b for a, b in picker_down):
        # Fail-open: with no picker to refuse it, the bad body reached a backend, whose own answer counts.
        return f"{o.status} bad input answered by a backend while the picker was down"
    if o.status >= 500:
        return f"{o.status} after backend death" if near_death else f"{o.status} (UNEXPECTED)"
    if o.kind == "bad":
        return f"{o.status} bad input" if 400 <= o.status < 500 else f"{o.status} bad input ACCEPTED?"
    return str(o.status) if o.status < 400 else f"{o.status} (UNEXPECTED)"


def report(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    deaths = [f.at for f in run.faults if f.name == "backend_kill"]
    picker_down = [(f.at, f.recovered_at + MESSAGE_TIMEOUT_S) for f in run.faults if f.name.startswith("picker")]
    classes = Counter(classify(o, deaths, picker_down) for o in run.outcomes)
    incarnations = sorted({i for _, i, _ in run.rss})
    longest = max(incarnations, key=lambda i: sum(1 for _, j, _ in run.rss if j == i), default=0)
    points = [(t, m) for t, i, m in run.rss if i == longest]
    warm = [(t, m) for t, m in points if t - points[0][0] >= 30] if points else []  # skip start-up growth
    slope = slope_mib_per_min(warm if len(warm) >= 3 else points)
    latencies = sorted(o.seconds for o in run.outcomes if o.status == 200 and o.kind != "stream")
    summary = {
        "minutes": args.minutes,
        "requests": len(run.outcomes),
        "classes": dict(classes.most_common()),
        "no_response": sum(1 for o in run.outcomes if o.status is None),
        "unexpected": sum(v for k, v in classes.items() if "UNEXPECTED" in k or "ACCEPTED" in k or "NO RESP" in k),
        "faults": Counter(f.name for f in run.faults),
        "picker_rss_mib": {"first": points[0][1] if points else None, "last": points[-1][1] if points else None,
                           "slope_mib_per_min": None if slope is None else round(slope, 3),
                           "incarnation": longest, "samples": len(points)},
        "latency_s_non_stream": {"p50": _pct(latencies, 0.5), "p99": _pct(latencies, 0.99),
                                 "max": latencies[-1] if latencies else None},
    }  # fmt: skip
    if args.out:
        details = {"fault_log": [asdict(f) for f in run.faults], "rss": run.rss,
                   "outcomes": [asdict(o) for o in run.outcomes]}  # fmt: skip
        Path(args.out).write_text(json.dumps({**summary, **details}))
    return summary


def _pct(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--backends", type=int, default=3)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--fault-every-s", type=float, default=20.0, help="mean gap between faults")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument(
        "--max-picker-kills", type=int, default=2, help="so one picker lives long enough to measure its memory trend"
    )
    parser.add_argument("--rss-every-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", help="keep logs here (default: a temporary folder)")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as exit_stack:
        workdir = Path(args.workdir) if args.workdir else Path(exit_stack.enter_context(tempfile.TemporaryDirectory()))
        summary = asyncio.run(soak(args, workdir))
    print(json.dumps(summary, indent=1))
    return 0 if summary["unexpected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
