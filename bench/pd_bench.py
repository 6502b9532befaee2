"""P/D side by side: 2 prefill + 2 decode against 4 aggregated simulated H100s, same hardware model.

    python -m bench.pd_bench --out bench/results/pd-2p2d --requests-scale 1.0
    python -m bench.pd_bench --out DIR --targets ours_pd,ours_aggregated --workloads long,long-peak
    python -m bench.pd_bench --out DIR --prefill 3 --decode 1     # another ratio; aggregated = their sum

Three targets, started together and fed the same requests in turn (one invocation):

* ``ours_pd``: our picker behind real Envoy, 2 prefill-role + 2 decode-role vllm-sims (the NIXL connector; the
  decode ones also play llm-d's decode sidecar), ``x-prefiller-host-port`` when the picker disaggregates;
* ``ours_aggregated``: our picker behind real Envoy, 4 aggregated vllm-sims;
* ``vllm_router_pd``: vllm-router's ``--vllm-pd-disaggregation`` on the *same* 2 + 2 simulators (it sends the
  prefill leg itself and the decode leg with the returned ``kv_transfer_params``: the wire the connector serves).

sglang-router's P/D mode is not run: it speaks SGLang's bootstrap wire (``bootstrap_host/port/room``, prefill and
decode sent concurrently), which vllm-sim does not serve.

Each workload is a Poisson stream of unique prompts (no prefix reuse, so the comparison is about placement,
not cache hits; every target gets the same prompts, and every simulator's prefix cache is reset before each run),
streamed ``/v1/completions`` with ``ignore_eos``. Per target: TTFT p50/p90, inter-token latency p90/p99 (every
gap between streamed chunks), TPOT p90 (a request's mean gap) and output tokens/s. Times are wall times on
simulators slowed by ``--sim-time-scale`` (5: every modelled second lasts 5 s); the picker's time knobs
are scaled alike (``bench.suite.fleet.scheduling_for``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import ManagedProcess, free_ports
from bench.stack import Stack, StackSpec, reset_prefix_cache
from bench.stack_config import MODEL
from bench.suite.fleet import peer_binary, scheduling_for
from bench.suite.measure import pct
from bench.suite.words import render, vocabulary
from extproc.config import PdConfig

TIME_SCALE = 5.0


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    output_tokens: int
    rate: float  # requests per wall second
    requests: int


WORKLOADS = (
    Workload("long", prompt_tokens=8192, output_tokens=256, rate=0.6, requests=36),
    Workload("long-busy", prompt_tokens=8192, output_tokens=256, rate=1.0, requests=30),
    Workload("short", prompt_tokens=128, output_tokens=256, rate=4.0, requests=60),
    # far above what either fleet serves: the requests queue, and output tokens/s is the fleet's peak
    Workload("long-peak", prompt_tokens=8192, output_tokens=256, rate=4.0, requests=40),
    Workload("short-peak", prompt_tokens=128, output_tokens=256, rate=30.0, requests=150),
)
TARGETS = ("ours_pd", "ours_aggregated", "vllm_router_pd")


@dataclass
class Timing:
    ok: bool = False
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    end_s: float = 0.0


async def _one(http: aiohttp.ClientSession, url: str, prompt: str, out_tokens: int) -> Timing:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": out_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t = Timing()
    sent = last = time.perf_counter()
    try:
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                return t
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                if any(c.get("text") for c in chunk.get("choices") or ()):
                    if t.ttft_s is None:
                        t.ttft_s = now - sent
                    else:
                        t.gaps_s.append(now - last)
                    last = now
                if chunk.get("usage"):
                    t.tokens = int(chunk["usage"].get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return t
    t.ok, t.end_s = t.ttft_s is not None and t.tokens > 0, time.perf_counter()
    return t


async def replay(url: str, w: Workload, seed: int) -> dict[str, Any]:
    """Send ``w``'s Poisson stream to ``url``; the summary of what the client saw."""
    rng = random.Random(seed)
    words = len(vocabulary())
    prompts = [render([rng.randrange(words) for _ in range(w.prompt_tokens)]) for _ in range(w.requests)]
    starts, at = [], 0.0
    for _ in prompts:
        starts.append(at)
        at += rng.expovariate(w.rate)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        t0 = time.perf_counter()

        async def later(delay: float, prompt: str) -> Timing:
            await asyncio.sleep(delay)
            return await _one(http, url, prompt, w.output_tokens)

        results = await asyncio.gather(*(later(s, p) for s, p in zip(starts, prompts, strict=True)))
    return summarize(list(results), t0)


def summarize(results: list[Timing], t0: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    gaps = [g for r in ok for g in r.gaps_s]
    tpot = [sum(r.gaps_s) / len(r.gaps_s) for r in ok if r.gaps_s]
    wall = max((r.end_s for r in ok), default=t0) - t0
    return {
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "ttft_p50_s": pct([r.ttft_s for r in ok if r.ttft_s is not None], 50),
        "ttft_p90_s": pct([r.ttft_s for r in ok if r.ttft_s is not None], 90),
        "itl_p90_s": pct(gaps, 90),
        "itl_p99_s": pct(gaps, 99),
        "tpot_p90_s": pct(tpot, 90),
        "output_tokens_per_s": sum(r.tokens for r in ok) / wall if wall > 0 else 0.0,
    }


def _scheduling(scale: float) -> dict[str, Any]:
    knobs = scheduling_for(scale)
    pd = PdConfig()
    return {
        "prefill_tokens_per_s": knobs["prefill_tokens_per_s"],
        "profile": {"type": "ttft", **{k: v for k, v in knobs.items() if k != "prefill_tokens_per_s"}},
        "pd": {"non_cached_tokens": pd.non_cached_tokens, "max_extra_ttft_s": pd.max_extra_ttft_s * scale,
               "kv_transfer_s_per_token": pd.kv_transfer_s_per_token * scale,
               "kv_transfer_setup_s": pd.kv_transfer_setup_s * scale},
    }  # fmt: skip


def _spec(backends: int, prefill: int) -> StackSpec:
    sim_args = ("--sim-time-scale", str(TIME_SCALE), "--sim-output-len", "100000")
    return StackSpec(
        backends=backends,
        prefill_backends=prefill,
        kv_events=True,
        sim_args=sim_args,
        picker_overrides={"scheduling": _scheduling(TIME_SCALE)},
        picker_log_level=None,
    )  # fmt: skip  (INFO: the decision lines, counted for the report)


def start_vllm_router_pd(stack: Stack, workdir: Path) -> tuple[str, ManagedProcess]:
    """vllm-router in its P/D mode on ``stack``'s prefill and decode simulators."""
    (port,) = free_ports(1)
    argv = [peer_binary("vllm"), "--host", "127.0.0.1", "--port", str(port), "--vllm-pd-disaggregation",
            "--policy", "cache_aware", "--max-concurrent-requests", "4096", "--queue-size", "4096",
            "--request-timeout-secs", "600", "--log-level", "warning"]  # fmt: skip
    for p in stack.prefill_backends:
        argv += ["--prefill", f"http://{p}"]
    for d in stack.backends:
        argv += ["--decode", f"http://{d}"]
    proc = ManagedProcess("vllm-router-pd", argv, workdir / "vllm-router-pd.log", cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    proc.start(lambda: _serves(url), 60.0)
    return url, proc


def _serves(url: str) -> bool:
    async def probe() -> bool:
        body = {"model": MODEL, "prompt": " hello", "max_tokens": 1}
        try:
            async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
                return r.status == 200
        except aiohttp.ClientError:
            await asyncio.sleep(0.2)
            return False

    return asyncio.run(probe())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pd_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/pd-2p2d"))
    parser.add_argument("--requests-scale", type=float, default=1.0, help="fewer (<1) or more requests per run")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS), help="comma-separated names")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, from " + ", ".join(TARGETS))
    parser.add_argument("--prefill", type=int, default=2, help="prefill instances (the aggregated fleet: the sum)")
    parser.add_argument("--decode", type=int, default=2, help="decode instances")
    args = parser.parse_args(argv)
    chosen, names = args.targets.split(","), args.workloads.split(",")
    unknown = {*chosen} - {*TARGETS} | {*names} - {w.name for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown target or workload: {sorted(unknown)}")
    workdir = Path(tempfile.mkdtemp(prefix="pd-bench-"))
    results: dict[str, dict[str, Any]] = {}
    fleets = (_spec(args.decode, args.prefill), _spec(args.decode + args.prefill, 0))
    with Stack(fleets[0], workdir / "pd") as pd_stack, Stack(fleets[1], workdir / "agg") as agg_stack:
        router_url, router = start_vllm_router_pd(pd_stack, workdir) if "vllm_router_pd" in chosen else ("", None)
        try:
            urls = {"ours_pd": pd_stack.url, "ours_aggregated": agg_stack.url, "vllm_router_pd": router_url}
            targets = {name: urls[name] for name in chosen}
            for w in (w for w in WORKLOADS if w.name in names):
                w = Workload(w.name, w.prompt_tokens, w.output_tokens, w.rate,
                             max(4, round(w.requests * args.requests_scale)))  # fmt: skip
                for name, url in targets.items():
                    for backend in [*pd_stack.backends, *pd_stack.prefill_backends, *agg_stack.backends]:
                        reset_prefix_cache(backend)  # the same prompts go to every target: all start cold
                    summary = asyncio.run(replay(url, w, args.seed))
                    results[f"{w.name}/{name}"] = {"workload": w.__dict__, "target": name, **summary}
                    print(json.dumps(results[f"{w.name}/{name}"]), flush=True)
            results["_picker_pd_decisions"] = {"log": _pd_reasons(pd_stack)}
            results["_pools"] = {"prefill": args.prefill, "decode": args.decode}
        finally:
            if router is not None:
                router.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "report.md").write_text(report(results))
    shutil.rmtree(workdir, ignore_errors=True)
    print(report(results))
    return 0


def _pd_reasons(stack: Stack) -> dict[str, int]:
    """How often our P/D picker disaggregated, and why not otherwise (its decision lines)."""
    counts: dict[str, int] = {}
    assert stack.picker is not None
    for line in stack.picker.log_text().splitlines():
        if '"pd": ' in line:
            reason = json.loads(line[line.index("{") :])["pd"]["reason"]
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def report(results: dict[str, dict[str, Any]]) -> str:
    head = (
        "| workload | target | ok/failed | TTFT p50 s | TTFT p90 s | ITL p90 s | ITL p99 s | TPOT p90 s | out tok/s |"
    )
    rows = [head, "|" + "---|" * 9]
    for key, r in results.items():
        if key.startswith("_"):
            continue
        cells = [r["ttft_p50_s"], r["ttft_p90_s"], r["itl_p90_s"], r["itl_p99_s"], r["tpot_p90_s"]]
        nums = " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
        rows.append(f"| {r['workload']['name']} | {r['target']} | {r['ok']}/{r['failed']} | {nums} | "
                    f"{r['output_tokens_per_s']:.0f} |")  # fmt: skip
    decisions = results.get("_picker_pd_decisions", {}).get("log", {})
    return "\n".join(rows) + f"\n\nOur P/D picker's decisions (all workloads): {decisions}\n"


if __name__ == "__main__":
    raise SystemExit(main())
