"""Measurements around a cell: backend counters, process CPU, and the per-cell summary ``results.json`` keeps.

Load spread comes from the backends themselves (requests finished per backend, from the difference of
``vllm:e2e_request_latency_seconds_count`` before and after the cell), so it is measured the same way behind
Envoy and behind a peer router. Router CPU is user+system time of the router's processes from
``/proc/<pid>/stat`` (picker replicas and valkey-server for ours, the peer's process for peers; Envoy's own
CPU apart), before and after.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from bench.stack import flush_events
from bench.stack_config import MODEL
from bench.suite.client import Result
from bench.suite.words import render

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_SAMPLE = re.compile(r"^(vllm:[a-zA-Z0-9_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+|NaN)$", re.MULTILINE)


def scrape(address: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Unlabelled-sum of every ``vllm:*`` sample of one backend's /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        with_nan = float(value)
        if not math.isnan(with_nan):
            out[name] = out.get(name, 0.0) + with_nan
    return out


_PICKER = re.compile(r"^(router_decisions_total|router_index_failures_total|router_predicted_cached_tokens_total"
                     r"|router_shared_reservations_total)(\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)  # fmt: skip
PREDICTED_CACHED = "predicted_cached_tokens"  # the key of router_predicted_cached_tokens_total
_TTFT_ERROR = re.compile(r'^router_ttft_error_ratio_(bucket\{le="([^"]+)"\}|sum|count) ([0-9.eE+-]+)$'
                         r'|^router_ttft_seconds_total\{endpoint="[^"]*",kind="(predicted|actual)"\} ([0-9.eE+-]+)$',
                         re.MULTILINE)  # fmt: skip


def _metrics_pages(urls: Sequence[str]) -> Iterator[str]:
    """Each picker's metrics page that answers (one that does not is skipped)."""
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=5.0) as resp:
                yield resp.read().decode()
        except OSError:
            continue


def picker_ttft_totals(urls: Sequence[str]) -> dict[str, float]:
    """Our pickers' predicted-vs-actual TTFT totals (``router_ttft_error_ratio`` buckets, sum and count;
    ``router_ttft_seconds_total`` by kind), summed over replicas; read before and after a cell."""
    out: dict[str, float] = {}
    for text in _metrics_pages(urls):
        for part, le, value, kind, seconds in _TTFT_ERROR.findall(text):
            key, v = (f"le={le}" if le else part, value) if part else (kind, seconds)
            out[key] = out.get(key, 0.0) + float(v)
    return out


def ttft_error(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None] | None:
    """A cell's TTFT estimate error from two ``picker_ttft_totals`` readings: per endpoint and scrape interval,
    |mean predicted - mean actual| / actual: its mean (MAPE), p50 and p90 (upper bucket bounds), and the
    ratio of actual to predicted; None when no interval was compared. A quantile past the last finite bucket
    is None (JSON has no infinity)."""
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}
    n = d.get("count", 0.0)
    if n <= 0:
        return None
    bounds = sorted((float(k[3:]), v) for k, v in d.items() if k.startswith("le="))

    def quantile(q: float) -> float | None:
        return next((b for b, c in bounds if c >= q * n and b != float("inf")), None)

    pred = d.get("predicted", 0.0)
    return {
        "intervals": n,
        "mape": round(d.get("sum", 0.0) / n, 3),
        "p50_le": quantile(0.5),
        "p90_le": quantile(0.9),
        "actual_over_predicted": round(d.get("actual", 0.0) / pred, 3) if pred else 0.0,
    }


def picker_counters(urls: Sequence[str]) -> dict[str, float]:
    """Our pickers' decision reasons, index failures and predicted cached tokens (``PREDICTED_CACHED``: the
    prompt tokens the picker expected its pick to hold), summed over replicas (``{}`` for other routers)."""
    out: dict[str, float] = {}
    for text in _metrics_pages(urls):
        for name, labels, value in _PICKER.findall(text):
            key = name.removeprefix("router_").removesuffix("_total") + (labels or "")
            out[key] = out.get(key, 0.0) + float(value)
    return out


def redis_totals(url: str | None) -> dict[str, float]:
    """The shared Valkey's server-side totals (``INFO stats`` and per-command calls), ``{}`` without one: what
    a cell's Redis traffic was (connections opened: each one a client's pooled connection torn down and
    rebuilt; commands and script calls per request)."""
    if url is None:
        return {}
    with redis.Redis.from_url(url, socket_timeout=5.0) as client:
        stats = client.info("stats")
        commands = client.info("commandstats")
    out = {"connections": float(stats.get("total_connections_received", 0)),
           "commands": float(stats.get("total_commands_processed", 0))}  # fmt: skip
    for name, row in commands.items():
        out[name.removeprefix("cmdstat_")] = float(row.get("calls", 0))
    return out


def redis_cell(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """What a cell added to the shared Valkey's totals, and the commands per routed request."""
    out = {k: after[k] - before.get(k, 0.0) for k in after}
    # INFO itself (two per snapshot) and the connection it came on are ours, not the pickers'
    out["connections"] = max(0.0, out.get("connections", 0.0) - 1)
    out["commands"] = max(0.0, out.get("commands", 0.0) - 2)
    if requests:
        out["commands_per_request"] = round(out["commands"] / requests, 2)
    return out


def requests_done(addresses: Sequence[str]) -> list[float]:
    return [scrape(a).get("vllm:e2e_request_latency_seconds_count", 0.0) for a in addresses]


def wait_idle(addresses: Sequence[str], timeout_s: float = 60.0) -> bool:
    """Poll until no backend has running or waiting requests (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0.0
        for a in addresses:
            m = scrape(a)
            busy += m.get("vllm:num_requests_running", 0.0) + m.get("vllm:num_requests_waiting", 0.0)
        if busy == 0:
            return True
        time.sleep(0.25)
    return False


def reset_caches(addresses: Sequence[str]) -> None:
    """Every backend starts the cell cold (forced: a request the client gave up on may still be running).

    Like vLLM, the simulator publishes the reset's ``AllBlocksCleared`` with its next engine step; each
    backend is made to take one (``flush_events``) so the routers' indexes are cold before the cell starts,
    not purged by the cell's first request."""
    for a in addresses:
        req = urllib.request.Request(f"http://{a}/reset_prefix_cache?reset_running_requests=true", data=b"",
                                     method="POST")  # fmt: skip
        with urllib.request.urlopen(req, timeout=10.0) as resp:
            resp.read()
        flush_events(a)


def warm_tokenizer(address: str, plans: Iterable[Any]) -> int:
    """Send every prompt of ``plans`` to the simulator's ``/tokenize`` once, so that its tokenizer cache (one per
    simulator process, ``--sim-token-cache-tokens``) holds them before the first router's cells; returns the
    prompts sent. Without it the first policy on a workload paid the simulator's tokenizer on every request and
    the others on none: the first cell of a run was ~15 ms slower at TTFT p50 (2.5K-token documents, 8 req/s),
    whichever policy it was."""
    seen: set[tuple[int, ...]] = set()
    for plan in plans:
        for call in plan.calls:
            if call.ids in seen:
                continue
            seen.add(call.ids)
            body = json.dumps({"model": MODEL, "prompt": render(call.ids)}).encode()
            req = urllib.request.Request(f"http://{address}/tokenize", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=30.0) as resp:
                resp.read()
    return len(seen)


def cpu_s(pids: Iterable[int]) -> float:
    """user+system seconds of ``pids`` (a vanished process counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
        except (OSError, IndexError, ValueError):
            continue
    return total / _TICK


def thread_cpu_s(pids: Iterable[int]) -> float:
    """Seconds on CPU of every live thread of ``pids``, at nanosecond resolution (``/proc/PID/task/*/schedstat``;
    ``cpu_s`` counts 10 ms ticks, too coarse for one request). Threads that already ended are not counted."""
    total = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def summarize(results: list[Result], *, rate: float, ceiling: float, per_backend: list[float],
              router_cpu: float, envoy_cpu: float) -> dict[str, Any]:  # fmt: skip
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    out_tokens = sum(r.completion_tokens for r in ok)
    if ok:
        first = min(r.start_s for r in ok)
        last = max(r.start_s + (r.e2e_s or 0.0) for r in ok)
        span = max(1e-6, last - first)
    else:
        span = 0.0
    total = sum(per_backend)
    mean = total / len(per_backend) if per_backend else 0.0
    cv = (math.sqrt(sum((x - mean) ** 2 for x in per_backend) / len(per_backend)) / mean) if mean else None
    share = cached / prompt if prompt else 0.0
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = r.error.split(":")[0][:60]
            errors[key] = errors.get(key, 0) + 1
    mismatched = sum(1 for r in ok if r.prompt_tokens != r.expected_prompt_tokens)
    return {
        "offered_rate_rps": rate,
        "requests": len(results),
        "succeeded": len(ok),
        "success_rate": _r(len(ok) / len(results) if results else 0.0),
        "ttft_p50_s": _r(pct(ttft, 50)),
        "ttft_p90_s": _r(pct(ttft, 90)),
        "ttft_p99_s": _r(pct(ttft, 99)),
        "ttft_mean_s": _r(sum(ttft) / len(ttft) if ttft else None),
        "e2e_p50_s": _r(pct(e2e, 50)),
        "e2e_p90_s": _r(pct(e2e, 90)),
        "e2e_p99_s": _r(pct(e2e, 99)),
        "output_tok_s": _r(out_tokens / span if span else 0.0, 2),
        "duration_s": _r(span, 2),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_token_share": _r(share),
        "ceiling_cached_share": _r(ceiling),
        "cached_share_of_ceiling": _r(share / ceiling if ceiling else None),
        "backend_requests": [int(x) for x in per_backend],
        "load_spread_cv": _r(cv),
        "load_max_over_mean": _r(max(per_backend) / mean if mean else None),
        "router_cpu_s": _r(router_cpu, 3),
        "router_cpu_ms_per_req": _r(1000 * router_cpu / len(ok) if ok else None, 3),
        "envoy_cpu_s": _r(envoy_cpu, 3),
        "prompt_token_mismatches": mismatched,
        "errors": errors,
    }
