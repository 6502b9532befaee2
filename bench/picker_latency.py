"""The picker's added latency through Envoy, side by side with Envoy's round robin (no picker), in one run.

    python -m bench.picker_latency            # 1K/8K/32K-token prompts x concurrency 1/16/64, a few minutes
    python -m bench.picker_latency --quick    # fewer requests per cell, same table

One stack: simulated backends that answer at once (``vllm-sim --sim-time-scale 0``, ``max_tokens: 1``,
non-streaming), one picker, and two Envoys on the same backends: ``picker`` (ext_proc BUFFERED, fail-open,
override_host) and ``round_robin`` (no ext_proc). Every request is timed from send to full response; the
backend's own work (it still parses and tokenizes the prompt) is the same on both sides, so the difference of
the two distributions is what the picker adds. Per cell, short rounds alternate between the sides (the side
that goes first alternates too) to cancel drift on a shared machine; each cell has a request budget and a
time cap. The picker's own ``router_pick_phase_seconds{phase}`` histogram is scraped before and after each
picker round and diffed: mean and (bucket-interpolated) p50 per phase.

Workload: one shared document per size (``tokens`` counts the whole chat prompt as the backend tokenizes
it), each request with its own question at the end: the picker's index holds the document after the first
request, so every lookup walks the whole prefix (its worst case).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.prom_hist import Hist, diff, scrape
from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL, EnvoyKind
from extproc.observability import PHASES

SIDES: tuple[EnvoyKind, EnvoyKind] = ("picker", "round_robin")
SYSTEM_PROMPT = "You are a careful analyst. Answer from the document only."
PHASE_METRIC = "router_pick_phase_seconds"
GOAL_ADDED_P50_1K_MS = 3.0
GOAL_NON_TOKENIZE_SHARE = 0.25
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


# -- the workload -----------------------------------------------------------------------------------------
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
                lat, errors = await run_round(session, urls[side], doc, q, plan.round_size, cell.concurrency)
                q += plan.round_size
                cell.latencies[side] += lat
                cell.errors[side] += errors
                if side == "picker":
                    delta = diff(scrape(stack.picker_metrics_url, PHASE_METRIC, "phase"), before)
                    cell.phases = {p: cell.phases.get(p, Hist((), 0, 0)).plus(h) for p, h in delta.items()}
            rounds += 1
            if time.monotonic() - started > plan.cap_s:
                break


# -- the report -------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(value_s: float) -> str:
    return "    -" if math.isnan(value_s) else f"{value_s * 1000:7.2f}"


def print_tables(cells: list[Cell], doc_tokens: dict[int, int]) -> None:
    print("\nEnd to end through Envoy (ms; send to full response, max_tokens 1, backends answer at once)")
    print(f"{'tokens':>7} {'conc':>4} {'n/side':>6} | {'RR p50':>7} {'RR p99':>7} | {'pick p50':>8} "
          f"{'pick p99':>8} | {'added p50':>9} {'added p99':>9} | picked | errors RR/pick")  # fmt: skip
    for c in cells:
        rr, pk = c.latencies["round_robin"], c.latencies["picker"]
        added50, added99 = pct(pk, 0.5) - pct(rr, 0.5), pct(pk, 0.99) - pct(rr, 0.99)
        total = c.phases.get("total")
        picked = (total.count if total else 0) / max(len(pk) + c.errors["picker"], 1)  # < 100%: fail-open
        print(f"{doc_tokens[c.tokens]:>7} {c.concurrency:>4} {min(len(rr), len(pk)):>6} | {ms(pct(rr, 0.5))} "
              f"{ms(pct(rr, 0.99))} | {ms(pct(pk, 0.5)):>8} {ms(pct(pk, 0.99)):>8} | {ms(added50):>9} "
              f"{ms(added99):>9} | {picked:6.0%} | {c.errors['round_robin']}/{c.errors['picker']}")  # fmt: skip
    print("\nThe picker's own phases, router_pick_phase_seconds (ms: mean / p50 from buckets)")
    print(f"{'tokens':>7} {'conc':>4} | " + " | ".join(f"{p:^15}" for p in PHASES))
    for c in cells:
        parts = []
        for phase in PHASES:
            h = c.phases.get(phase)
            parts.append(f"{ms(h.mean_s)} /{ms(h.quantile_s(0.5))}" if h and h.count else f"{'-':^15}")
        print(f"{doc_tokens[c.tokens]:>7} {c.concurrency:>4} | " + " | ".join(parts))


def print_goals(cells: list[Cell], doc_tokens: dict[int, int]) -> None:
    print("\nGoals (reported, not enforced):")
    by = {(c.tokens, c.concurrency): c for c in cells}
    small, large = min(doc_tokens), max(doc_tokens)
    one = by.get((small, 1))
    if one:
        added = pct(one.latencies["picker"], 0.5) - pct(one.latencies["round_robin"], 0.5)
        verdict = "met" if added * 1000 <= GOAL_ADDED_P50_1K_MS else "NOT met"
        print(f"  {doc_tokens[small]} tokens, c=1: added p50 {added * 1000:.2f} ms "
              f"(goal <= {GOAL_ADDED_P50_1K_MS:.0f} ms at 1K tokens): {verdict}")  # fmt: skip
    big = by.get((large, 1)) if large > small else None
    if big and big.phases.get("tokenize") and big.phases["tokenize"].count:
        tok, total = big.phases["tokenize"].mean_s, big.phases["total"].mean_s
        share = (total - tok) / tok
        added = pct(big.latencies["picker"], 0.5) - pct(big.latencies["round_robin"], 0.5)
        e2e_share = (added - tok) / tok
        verdict = "met" if share <= GOAL_NON_TOKENIZE_SHARE else "NOT met"
        print(f"  {doc_tokens[large]} tokens, c=1: picker phases other than tokenize {(total - tok) * 1000:.2f} ms"
              f" = {share:.0%} of tokenize {tok * 1000:.2f} ms (goal <= 25% at 32K): {verdict}")  # fmt: skip
        print(f"      counting everything the picker adds end to end (Envoy, gRPC, parse, hash, lookup, score):"
              f" {(added - tok) * 1000:.2f} ms = {e2e_share:.0%} of tokenize")  # fmt: skip


# -- main -------------------------------------------------------------------------------------------------
def parse_sizes(text: str) -> list[int]:
    return [int(s[:-1]) * 1024 if s.upper().endswith("K") else int(s) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.picker_latency", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the requests, 8 s per cell")
    p.add_argument("--sizes", default="1K,8K,32K", help="prompt sizes in tokens (K = 1024)")
    p.add_argument("--concurrency", default="1,16,64", help="client concurrency levels")
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary dir, removed)")
    args = p.parse_args(argv)
    sizes, levels = parse_sizes(args.sizes), [int(c) for c in args.concurrency.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="picker-latency-"))
    blocks = 64 * (max(sizes) // 16 + 64) + 1024  # every request of the largest cell admitted at once
    spec = StackSpec(backends=args.backends, envoy="picker", extra_envoys=("round_robin",), sim_profile="fast",
                     num_gpu_blocks=blocks, max_model_len=MAX_MODEL_LEN, sim_args=("--sim-time-scale", "0"),
                     picker_overrides={"limits": {"tokenize_timeout_s": 10.0}})  # fmt: skip
    started = time.monotonic()
    with Stack(spec, workdir) as stack:
        print(f"stack up in {time.monotonic() - started:.1f} s: {args.backends} backends, 1 picker, "
              f"2 Envoys (logs in {workdir})", flush=True)  # fmt: skip
        cells, doc_tokens = [], {}
        for tokens in sizes:
            doc, doc_tokens[tokens] = document_of(tokens, stack.backends[0])
            for conc in levels:
                cell = Cell(tokens, conc)
                asyncio.run(run_cell(stack, cell, doc, budget(conc, args.quick)))
                cells.append(cell)
                n = min(len(cell.latencies[s]) for s in SIDES)
                print(f"  cell {doc_tokens[tokens]} tokens x c={conc}: {n} requests per side", flush=True)
    print_tables(cells, doc_tokens)
    print_goals(cells, doc_tokens)
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
