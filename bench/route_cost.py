"""The picker's own cost per request, in one process: ``Router.route`` per prompt shape, no Envoy, no backends.

    python -m bench.route_cost [--quick] [--requests N] [--agent-tokens T]

Why: through Envoy (``bench.picker_latency``, ``bench.extproc_floor``) the picker's CPU is measured next to two
Envoys, the simulators and the client on a 2-core box, and moves by a millisecond between runs. Here the same
``App`` the service runs (the stack's picker config, its tokenizer and chat template warmed up as ``App.start``
does) routes the bodies those benchmarks send, one at a time, on one event loop; nothing else runs. Its
endpoints answer nothing (no scrapes, no KV events), so the approximate index learns from our own routing only.

Shapes (the bodies of ``bench.picker_latency``):
- ``1K new question`` / ``32K new question``: the same document, a new question at the end of the same user
  message (what the hash and segment caches can reuse);
- ``agent step``: an agent context grown by one step (~700 tokens) at a time, measured over its steps near
  ``--agent-tokens``.

Columns: requests measured and routed, the process CPU per request (p50, p90: every thread, so
executor work counts) and the wall time per request (p50), then the mean of each phase the picker itself
reports (``router_pick_phase_seconds``: parse, tokenize = render + encode, hash, lookup, score). Sampled HF
re-checks are off (``verify_fraction`` 0): their cost is bounded apart (``tokenizer.verify_cpu_share``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

from bench.picker_latency import FILLER_ITEM_TOKENS, agent_messages, filler, messages, pct
from bench.stack_config import MODEL, picker_config
from extproc.app import App
from extproc.config import RouterConfig
from extproc.types import HttpRequest, Route

ENDPOINTS = ("127.0.0.1:9", "127.0.0.1:10", "127.0.0.1:11", "127.0.0.1:12")  # never answer: no scrape data
PHASES = ("parse", "tokenize", "hash", "lookup", "score")
_STEP_TOKENS = 700  # ~tokens per agent step (``picker_latency.agent_messages``)


@dataclass
class Shape:
    name: str
    bodies: list[bytes]
    cpu_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    phase_ms: dict[str, float] = field(default_factory=dict)  # mean per request
    routed: int = 0  # answered with a Route (the rest passed through)


def body(msgs: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": MODEL, "messages": msgs, "max_tokens": 1}).encode()


def shapes(requests: int, warm: int, agent_tokens: int) -> list[Shape]:
    """``requests`` measured bodies per document shape, a quarter as many agent steps (at least 8), each after
    ``warm`` unmeasured ones."""
    out = []
    for tokens, label in ((1024, "1K new question"), (32 * 1024, "32K new question")):
        doc = filler(max(tokens // FILLER_ITEM_TOKENS, 4))
        out.append(Shape(label, [body(messages(doc, q)) for q in range(requests + warm)]))
    if agent_tokens:
        last = max(agent_tokens // _STEP_TOKENS, 2)
        steps = range(max(last + 1 - max(requests // 4, 8) - warm, 0), last + 1)
        out.append(Shape(f"agent step ~{agent_tokens // 1000}K", [body(agent_messages(s)) for s in steps]))
    return out


def config() -> RouterConfig:
    """The stack's picker config (block size, hash seed, caches) for ``ENDPOINTS``; no metrics port, no HF
    re-checks."""
    overrides = {"listen": {"metrics_port": None}, "tokenizer": {"verify_fraction": 0.0}}
    return RouterConfig.model_validate(picker_config(list(ENDPOINTS), overrides=overrides))


def phase_sums(app: App) -> dict[str, float]:
    """Seconds summed per phase so far (``router_pick_phase_seconds``)."""
    sums: dict[str, float] = {}
    for family in app.metrics.registry.collect():
        if family.name == "router_pick_phase_seconds":
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    sums[sample.labels["phase"]] = sample.value
    return sums


async def measure(app: App, shape: Shape, warm: int) -> None:
    """Route each of ``shape``'s bodies in turn (the first ``warm`` unmeasured) and record its costs."""
    for i, data in enumerate(shape.bodies):
        if i == warm:
            before = phase_sums(app)
        request = HttpRequest(method="POST", path="/v1/chat/completions", body=data, request_id=f"{shape.name}-{i}",
                              headers={"content-type": "application/json"}, received_at_s=time.monotonic())  # fmt: skip
        cpu0, wall0 = time.process_time(), time.perf_counter()
        route = await app.router.route(request)
        if i < warm:
            continue
        shape.cpu_ms.append((time.process_time() - cpu0) * 1000)
        shape.wall_ms.append((time.perf_counter() - wall0) * 1000)
        if isinstance(route, Route):
            shape.routed += 1
    n = max(len(shape.cpu_ms), 1)
    after = phase_sums(app)
    shape.phase_ms = {p: (after.get(p, 0.0) - before.get(p, 0.0)) * 1000 / n for p in PHASES}


def print_table(results: list[Shape]) -> None:
    print("\nRouter.route in one process (ms per request; CPU of every thread; phases: the picker's own means)")
    phases = " ".join(f"{p:>8}" for p in PHASES)
    print(f"{'shape':>18} {'n':>4} {'routed':>6} |  CPU p50  CPU p90 | wall p50 | {phases}")
    for s in results:
        phases = " ".join(f"{s.phase_ms.get(p, 0.0):8.3f}" for p in PHASES)
        print(f"{s.name:>18} {len(s.cpu_ms):4d} {s.routed:6d} | {pct(s.cpu_ms, 0.5):8.3f} {pct(s.cpu_ms, 0.9):8.3f} | "
              f"{pct(s.wall_ms, 0.5):8.3f} | {phases}")  # fmt: skip


async def run(requests: int, agent_tokens: int, warm: int) -> list[Shape]:
    app = App(config())
    failed = await app.preparer.warm_up()
    if failed:
        raise SystemExit(f"tokenizer failed to load: {failed}")
    results = shapes(requests, warm, agent_tokens)
    for shape in results:
        await measure(app, shape, warm)
        print(f"  {shape.name}: {len(shape.cpu_ms)} requests, CPU p50 {pct(shape.cpu_ms, 0.5):.3f} ms",
              flush=True)  # fmt: skip
    await app.router.drain()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.route_cost", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="40 requests per shape, the agent near 16K tokens")
    p.add_argument("--requests", type=int, default=None, help="measured requests per document shape (400)")
    p.add_argument("--agent-tokens", type=int, default=None, help="the agent's context (100K; 0 = no agent)")
    args = p.parse_args(argv)
    requests = args.requests or (40 if args.quick else 400)
    agent = args.agent_tokens if args.agent_tokens is not None else (16_000 if args.quick else 100_000)
    started = time.monotonic()
    results = asyncio.run(run(requests, agent, warm=min(5, requests)))
    print_table(results)
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
