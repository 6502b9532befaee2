"""The picker's added latency through Envoy, side by side with Envoy's round robin (no picker), in one run.

    python -m bench.picker_latency            # 1K/8K/32K-token prompts x concurrency 1/16/64, a few minutes
    python -m bench.picker_latency --quick    # fewer requests per cell, same table
    python -m bench.picker_latency --picker-tree /tmp/before   # the same client against an older picker
    python -m bench.picker_latency --transport ext_authz       # Envoy asks the picker over ext_authz (HTTP)

One stack: simulated backends that answer at once (``vllm-sim --sim-time-scale 0``, ``max_tokens: 1``,
non-streaming), one picker, and two Envoys on the same backends: ``picker`` (ext_proc BUFFERED, fail-open,
override_host) and ``round_robin`` (no ext_proc). Every request is timed from send to full response; the
backend's own work (it still parses and tokenizes the prompt) is the same on both sides, so the difference of
the two distributions is what the picker adds. Per cell, short rounds alternate between the sides (the side
that goes first alternates too) to cancel drift on a shared machine; each cell has a request budget and a
time cap. The picker's own ``router_pick_phase_seconds{phase}`` histogram is scraped before and after each
picker round and diffed: mean and (bucket-interpolated) p50 per phase.

Workload: one shared document per size (``tokens`` counts the whole chat prompt as the backend tokenizes
it), each request with its own question at the end of the same message: the picker's index holds the
document after the first request, so every lookup walks the whole prefix (its worst case), and the picker
sees a long document again with a new question (what its tokenizer and hash caches are for). The picker's
own CPU (user+system of its process, over its rounds) is reported per request.

The agent cell (``--agent-tokens``, 0 = off): one session whose context grows by ~500 tokens per step (an
assistant turn and a tool result) up to the given size, one request at a time; reported: the picker's CPU
per step, overall and over the last quarter (the longest contexts), and its added latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.prom_hist import Hist, diff, scrape
from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL, EnvoyKind
from bench.suite.measure import thread_cpu_s as cpu_s
from extproc.observability import PHASES

SIDES: tuple[EnvoyKind, EnvoyKind] = ("picker", "round_robin")
SYSTEM_PROMPT = "You are a careful analyst. Answer from the document only."
PHASE_METRIC = "router_pick_phase_seconds"
GOAL_ADDED_P50_1K_MS = 1.5
GOAL_REPEAT_DOC_CPU_MS = 3.0  # a repeat 32K-token document with a new question
GOAL_AGENT_STEP_CPU_MS = 3.0  # a step of an agent context growing to 100K tokens
MAX_MODEL_LEN = 40960  # room for a 32K prompt plus its question and one output token


@dataclass(frozen=True, slots=True)
class Budget:
    """Requests per side in one cell, requests per round, and the cell's time cap."""

    per_side: int
    round_size: int
    cap_s: float


def budget(concurrency: int, quick: bool) -> Budget:
    per_side = {1: 200, 16: 480, 64: 1024}.get(concurrency, 20 * concurrency)
    round_size = max(20, 4 * concurrency)
    if quick:
        return Budget(max(per_side // 10, round_size), round_size, 8.0)
    return Budget(per_side, round_size, 40.0)


@dataclass
class Cell:
    tokens: int
    concurrency: int
    latencies: dict[EnvoyKind, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    errors: dict[EnvoyKind, int] = field(default_factory=lambda: dict.fromkeys(SIDES, 0))
    phases: dict[str, Hist] = field(default_factory=dict)
    picker_cpu_s: float = 0.0  # the picker process's CPU over the picker rounds
    picker_round_s: float = 0.0  # how long those rounds took (to take the idle baseline out)

    def cpu_ms_per_request(self, idle_cpu_per_s: float = 0.0) -> float:
        """The picker's CPU per request; with ``idle_cpu_per_s``, net of what it spends idle (scraping)."""
        n = len(self.latencies["picker"]) + self.errors["picker"]
        cpu = self.picker_cpu_s - idle_cpu_per_s * self.picker_round_s
        return cpu * 1000 / n if n else math.nan


# -- the workload -----------------------------------------------------------------------------------------
FILLER_ITEM_TOKENS = 16  # ~Qwen3 tokens per ``filler`` item


def filler(items: int) -> str:
    rng = random.Random("picker-latency")
    words = ("revenue", "costs", "margin", "headcount", "cash flow", "backlog", "pricing", "demand")
    places = ("North", "South", "East", "West", "Central", "Overseas")
    return " ".join(
        f"Item {i}: in {rng.choice(places)}, {rng.choice(words)} moved by {rng.randint(2, 97)} percent."
        for i in range(1, items + 1)
    )


def messages(document: str, question: int) -> list[dict[str, str]]:
    user = f"{document}\n\nQuestion {question}: what changed in item {question % 97 + 1}?"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def count_tokens(backend: str, msgs: list[dict[str, str]]) -> int:
    """The chat prompt's token count as the backend tokenizes it (``POST /tokenize``)."""
    body = json.dumps({"model": MODEL, "messages": msgs}).encode()
    req = urllib.request.Request(f"http://{backend}/tokenize", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(json.loads(resp.read())["count"])


def document_of(tokens: int, backend: str) -> tuple[str, int]:
    """A document whose chat prompt is about ``tokens`` long (two rescaling passes); returns it and its
    measured length."""
    items = max(tokens // 16, 4)
    measured = 0
    for _ in range(3):
        measured = count_tokens(backend, messages(filler(items), 0))
        if abs(measured - tokens) <= tokens * 0.01:
            break
        items = max(int(items * tokens / measured), 1)
    doc = filler(items)
    return doc, count_tokens(backend, messages(doc, 0))


# -- running a cell ---------------------------------------------------------------------------------------
async def run_round(session: aiohttp.ClientSession, url: str, doc: str, first_q: int, n: int,
                    concurrency: int) -> tuple[list[float], int]:  # fmt: skip
    """``n`` requests at ``concurrency`` (one worker each); returns latencies (s) of 200s and the errors."""
    latencies: list[float] = []
    errors = 0
    questions = iter(range(first_q, first_q + n))

    async def worker() -> None:
        nonlocal errors
        for q in questions:
            body = json.dumps({"model": MODEL, "messages": messages(doc, q), "max_tokens": 1}).encode()
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    ok = r.status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


async def run_cell(stack: Stack, cell: Cell, doc: str, plan: Budget) -> None:
    urls = {side: stack.url_for(side) + "/v1/chat/completions" for side in SIDES}
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for side in SIDES:  # warm up: connections, the picker's index holds the document afterwards
            await run_round(session, urls[side], doc, 10**6, min(cell.concurrency, 8), min(cell.concurrency, 8))
        started, q, rounds = time.monotonic(), 0, 0
        while len(cell.latencies["picker"]) + cell.errors["picker"] < plan.per_side:
            order = SIDES if rounds % 2 == 0 else SIDES[::-1]
            for side in order:
                before = scrape(stack.picker_metrics_url, PHASE_METRIC, "phase") if side == "picker" else {}
                cpu0, t0 = cpu_s(stack.picker_pids()), time.monotonic()
                lat, errors = await run_round(session, urls[side], doc, q, plan.round_size, cell.concurrency)
                if side == "picker":
                    cell.picker_cpu_s += cpu_s(stack.picker_pids()) - cpu0
                    cell.picker_round_s += time.monotonic() - t0
                q += plan.round_size
                cell.latencies[side] += lat
                cell.errors[side] += errors
                if side == "picker":
                    delta = diff(scrape(stack.picker_metrics_url, PHASE_METRIC, "phase"), before)
                    cell.phases = {p: cell.phases.get(p, Hist((), 0, 0)).plus(h) for p, h in delta.items()}
            rounds += 1
            if time.monotonic() - started > plan.cap_s:
                break


# -- the agent cell ---------------------------------------------------------------------------------------
STEP_TEXT_ITEMS = 30  # ~500 tokens of assistant turn + tool result per step


@dataclass
class AgentRun:
    steps: int = 0
    final_tokens: int = 0
    cpu_ms: list[float] = field(default_factory=list)  # the picker's CPU per step (its request)
    took_s: list[float] = field(default_factory=list)  # how long each step's picker request took
    added_ms: list[float] = field(default_factory=list)  # picker minus round robin, per step
    errors: int = 0


def agent_messages(steps: int) -> list[dict[str, str]]:
    """The session after ``steps`` steps: each adds a tool call's result and the assistant's next turn."""
    msgs = [{"role": "system", "content": SYSTEM_PROMPT + " You may call tools."},
            {"role": "user", "content": "Audit the ledger, item by item, with the lookup tool."}]  # fmt: skip
    rng = random.Random("agent")
    for step in range(steps):
        msgs.append({"role": "assistant", "content": f"Step {step}: looking up the next items."})
        rows = " ".join(f"row {step}.{i}: {rng.randint(10, 99999)} units, code {rng.getrandbits(24):06x}."
                        for i in range(STEP_TEXT_ITEMS))  # fmt: skip
        msgs.append({"role": "user", "content": f"Tool result {step}: {rows}"})
    return msgs


async def run_agent(stack: Stack, max_tokens: int, run: AgentRun) -> None:
    """Steps until the context passes ``max_tokens``; each step is sent through both sides, one at a time."""
    urls = {side: stack.url_for(side) + "/v1/chat/completions" for side in SIDES}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        step = 0
        while True:
            msgs = agent_messages(step)
            body = json.dumps({"model": MODEL, "messages": msgs, "max_tokens": 1}).encode()
            took: dict[EnvoyKind, float] = {}
            for side in SIDES if step % 2 == 0 else SIDES[::-1]:
                cpu0, started = cpu_s(stack.picker_pids()), time.perf_counter()
                async with session.post(urls[side], data=body, headers={"Content-Type": "application/json"}) as r:
                    payload = await r.read()
                took[side] = time.perf_counter() - started
                if r.status != 200:
                    run.errors += 1
                    return
                if side == "picker":
                    run.cpu_ms.append((cpu_s(stack.picker_pids()) - cpu0) * 1000)
                    run.took_s.append(took[side])
                    run.final_tokens = int(json.loads(payload)["usage"]["prompt_tokens"])
            run.added_ms.append((took["picker"] - took["round_robin"]) * 1000)
            run.steps = step = step + 1
            if run.final_tokens >= max_tokens:
                return


def print_agent(run: AgentRun, idle: float) -> None:
    if not run.steps:
        return
    quarter = max(len(run.cpu_ms) // 4, 1)
    tail = [c - idle * 1000 * t for c, t in zip(run.cpu_ms[-quarter:], run.took_s[-quarter:], strict=True)]
    print(f"\nAgent session: {run.steps} steps to {run.final_tokens} tokens (one request at a time, errors "
          f"{run.errors})")  # fmt: skip
    print(f"  picker CPU per step: mean {statistics.mean(run.cpu_ms):.2f} ms, p50 {statistics.median(run.cpu_ms):.2f}"
          f" ms; last quarter (longest contexts) mean {statistics.mean(tail):.2f} ms net of idle")  # fmt: skip
    print(f"  added latency p50 {statistics.median(run.added_ms):.2f} ms")
    verdict = "met" if statistics.mean(tail) <= GOAL_AGENT_STEP_CPU_MS else "NOT met"
    print(f"  goal: <= {GOAL_AGENT_STEP_CPU_MS:.0f} ms of picker CPU per step at the longest contexts: {verdict}")


# -- the report -------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(value_s: float) -> str:
    return "    -" if math.isnan(value_s) else f"{value_s * 1000:7.2f}"


def idle_cpu_per_s(stack: Stack, seconds: float = 5.0) -> float:
    """The picker's CPU per second with no requests (scraping, timers): its fixed cost."""
    cpu0, t0 = cpu_s(stack.picker_pids()), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(stack.picker_pids()) - cpu0) / (time.monotonic() - t0)


def print_tables(cells: list[Cell], doc_tokens: dict[int, int], idle: float) -> None:
    print("\nEnd to end through Envoy (ms; send to full response, max_tokens 1, backends answer at once)")
    print(f"picker CPU: per request over its rounds, and net of its idle cost ({idle * 1000:.1f} ms/s, measured "
          "before the cells)")  # fmt: skip
    print(f"{'tokens':>7} {'conc':>4} {'n/side':>6} | {'RR p50':>7} {'RR p99':>7} | {'pick p50':>8} "
          f"{'pick p99':>8} | {'added p50':>9} {'added p99':>9} | picked | CPU ms/req  net "
          "| errors RR/pick")  # fmt: skip
    for c in cells:
        rr, pk = c.latencies["round_robin"], c.latencies["picker"]
        added50, added99 = pct(pk, 0.5) - pct(rr, 0.5), pct(pk, 0.99) - pct(rr, 0.99)
        total = c.phases.get("total")
        picked = (total.count if total else 0) / max(len(pk) + c.errors["picker"], 1)  # < 100%: fail-open
        print(f"{doc_tokens[c.tokens]:>7} {c.concurrency:>4} {min(len(rr), len(pk)):>6} | {ms(pct(rr, 0.5))} "
              f"{ms(pct(rr, 0.99))} | {ms(pct(pk, 0.5)):>8} {ms(pct(pk, 0.99)):>8} | {ms(added50):>9} "
              f"{ms(added99):>9} | {picked:6.0%} | {c.cpu_ms_per_request():10.2f} {c.cpu_ms_per_request(idle):4.1f} | "
              f"{c.errors['round_robin']}/{c.errors['picker']}")  # fmt: skip
    print("\nThe picker's own phases, router_pick_phase_seconds (ms: mean / p50 from buckets)")
    print(f"{'tokens':>7} {'conc':>4} | " + " | ".join(f"{p:^15}" for p in PHASES))
    for c in cells:
        parts = []
        for phase in PHASES:
            h = c.phases.get(phase)
            parts.append(f"{ms(h.mean_s)} /{ms(h.quantile_s(0.5))}" if h and h.count else f"{'-':^15}")
        print(f"{doc_tokens[c.tokens]:>7} {c.concurrency:>4} | " + " | ".join(parts))


def print_goals(cells: list[Cell], doc_tokens: dict[int, int], idle: float) -> None:
    print("\nGoals (reported, not enforced):")
    by = {(c.tokens, c.concurrency): c for c in cells}
    small, large = min(doc_tokens), max(doc_tokens)
    one = by.get((small, 1))
    if one:
        added = pct(one.latencies["picker"], 0.5) - pct(one.latencies["round_robin"], 0.5)
        verdict = "met" if added * 1000 <= GOAL_ADDED_P50_1K_MS else "NOT met"
        print(f"  {doc_tokens[small]} tokens, c=1: added p50 {added * 1000:.2f} ms "
              f"(goal <= {GOAL_ADDED_P50_1K_MS:.1f} ms at 1K tokens): {verdict}")  # fmt: skip
    big = by.get((large, 1)) if large > small else None
    if big:
        cpu, net = big.cpu_ms_per_request(), big.cpu_ms_per_request(idle)
        verdict = "met" if net <= GOAL_REPEAT_DOC_CPU_MS else "NOT met"
        print(f"  {doc_tokens[large]} tokens, c=1 (the document again, a new question): picker CPU {cpu:.2f} ms per "
              f"request, {net:.2f} ms net of idle (goal <= {GOAL_REPEAT_DOC_CPU_MS:.0f} ms): {verdict}")  # fmt: skip
    for c in cells:
        if c.concurrency == max(x.concurrency for x in cells) and c.tokens == large:
            total = c.phases.get("total")
            picked = (total.count if total else 0) / max(len(c.latencies["picker"]) + c.errors["picker"], 1)
            verdict = "met" if picked >= 1.0 else "NOT met"
            print(f"  {doc_tokens[large]} tokens, c={c.concurrency}: {picked:.1%} picked, the rest failed open "
                  f"(goal 100%): {verdict}")  # fmt: skip


# -- main -------------------------------------------------------------------------------------------------
def parse_sizes(text: str) -> list[int]:
    return [int(s[:-1]) * 1024 if s.upper().endswith("K") else int(s) for s in text.split(",") if s]


def picker_overrides(verify_fraction: float | None, grpc_server: str | None = None) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {"limits": {"tokenize_timeout_s": 10.0}}
    if verify_fraction is not None:
        overrides["tokenizer"] = {"verify_fraction": verify_fraction}
    if grpc_server is not None:
        overrides["listen"] = {"grpc_server": grpc_server}
    return overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.picker_latency", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the requests, 8 s per cell")
    p.add_argument("--sizes", default="1K,8K,32K", help="prompt sizes in tokens (K = 1024)")
    p.add_argument("--concurrency", default="1,16,64", help="client concurrency levels")
    p.add_argument("--backends", type=int, default=4)
    p.add_argument(
        "--agent-tokens",
        type=int,
        default=None,
        help="the agent cell's final context (default 100K, 16K with --quick); 0 = no cell",
    )
    p.add_argument(
        "--picker-tree",
        type=Path,
        default=None,
        help="run the picker from this checkout (e.g. `git worktree add /tmp/before HEAD~1`)",
    )
    p.add_argument(
        "--verify-fraction",
        type=float,
        default=None,
        help="the picker's tokenizer.verify_fraction (default: the config's); 0 takes the sampled shadow checks "
        "out of the CPU columns, where one HF re-encode of a 100K-token agent step (~0.1 s) moves a cell's mean",
    )
    p.add_argument("--transport", choices=("ext_proc", "ext_authz"), default="ext_proc",
                   help="how the picker Envoy asks the picker (envoy/README.md)")  # fmt: skip
    p.add_argument(
        "--grpc-server",
        choices=("h2", "grpcio"),
        default=None,
        help="the picker's ext_proc gRPC stack (listen.grpc_server; default: the config's, h2)",
    )
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary dir, removed)")
    args = p.parse_args(argv)
    if args.agent_tokens is None:
        args.agent_tokens = 16_000 if args.quick else 100_000
    sizes, levels = parse_sizes(args.sizes), [int(c) for c in args.concurrency.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="picker-latency-"))
    blocks = max(64 * (max(sizes) // 16 + 64), 2 * (args.agent_tokens // 16 + 256)) + 1024
    spec = StackSpec(
        backends=args.backends, envoy="picker", extra_envoys=("round_robin",), sim_profile="fast",
        num_gpu_blocks=blocks, max_model_len=max(MAX_MODEL_LEN, args.agent_tokens + 8192),
        sim_args=("--sim-time-scale", "0"), picker_overrides=picker_overrides(args.verify_fraction, args.grpc_server),
        picker_tree=args.picker_tree, envoy_options={"transport": args.transport},
    )  # fmt: skip
    started = time.monotonic()
    with Stack(spec, workdir) as stack:
        print(f"stack up in {time.monotonic() - started:.1f} s: {args.backends} backends, 1 picker, "
              f"2 Envoys (logs in {workdir})", flush=True)  # fmt: skip
        idle = idle_cpu_per_s(stack)
        cells, doc_tokens = [], {}
        for tokens in sizes:
            doc, doc_tokens[tokens] = document_of(tokens, stack.backends[0])
            for conc in levels:
                cell = Cell(tokens, conc)
                asyncio.run(run_cell(stack, cell, doc, budget(conc, args.quick)))
                cells.append(cell)
                n = min(len(cell.latencies[s]) for s in SIDES)
                print(f"  cell {doc_tokens[tokens]} tokens x c={conc}: {n} requests per side", flush=True)
        agent = AgentRun()
        if args.agent_tokens:
            asyncio.run(run_agent(stack, args.agent_tokens, agent))
    print_tables(cells, doc_tokens, idle)
    print_goals(cells, doc_tokens, idle)
    print_agent(agent, idle)
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
