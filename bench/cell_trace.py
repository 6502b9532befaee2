"""Per-request traces of benchmark cells: where each request went and where its time to first token went.

``python -m bench.cell_trace --workload noisy --policy precise_shares --rates 0,12 --out DIR`` starts the
workload's simulated fleet and the policy's router (``bench.suite.fleet``), replays each rate's plan as the
suite does (cold caches, the same requests), then joins, per request:

* the client's view: tenant, planned send time, TTFT (``bench.suite.client``);
* the serving simulator's own record (``GET /sim/requests``): its arrival on the engine clock, queue time
  (arrival → first step that ran it), model TTFT (queue + prefill) and cached tokens;
* our picker's decision line (logged at INFO): reason, estimates, the picker's own ms.

``--picker-set SECTION.KEY=VALUE`` overrides the picker's config as in ``python -m bench``.

It writes ``DIR/trace-<policy>-<rate>.jsonl`` (``-cell<N>`` added for a repeated rate; one object per
request) and prints, per tenant, TTFT p90 as the client saw it beside the model's queue and prefill p90, and
what each backend served. "overhead" is the client TTFT minus the model's: Envoy, the picker and the client's
and simulator's event loops (CPU contention).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from bench.suite import measure
from bench.suite.client import Result, replay
from bench.suite.fleet import Backends, parse_picker_set, start_router
from bench.suite.policies import POLICIES
from bench.suite.workloads import WORKLOADS, Plan
from extproc import decision_line


def records(address: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The simulator's records of ``ids`` that ``address`` served (in chunks: ids travel in the query)."""
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(ids), 100):
        url = f"http://{address}/sim/requests?ids={','.join(ids[i : i + 100])}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            out.update(json.loads(resp.read()))
    return out


_DECISION_LOGGER = f" {decision_line.log.name} "  # as the picker's log format writes the logger's name


def decisions(log_text: str) -> dict[str, dict[str, Any]]:
    """``{request id: decision line}`` from a picker log at INFO (other lines skipped). A decision line is the JSON
    object after the ``extproc.decision`` logger's name; its optional keys (``due_s``, ``pd``, ``body_head``) come
    before ``request_id``."""
    out: dict[str, dict[str, Any]] = {}
    for line in log_text.splitlines():
        logger = line.find(_DECISION_LOGGER)
        start = line.find("{", logger) if logger >= 0 else -1
        if start < 0:
            continue
        try:
            entry = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if "endpoint" in entry:
            out[entry["request_id"]] = entry
    return out


def join(plan: Plan, results: list[Result], served: dict[str, tuple[str, dict[str, Any]]],
         lines: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per request, in planned send order."""
    tenant = {c.rid: c.tenant for c in plan.calls}
    rows = []
    for r in sorted(results, key=lambda r: r.start_s):
        backend, rec = served.get(r.response_id, ("", {}))
        line = lines.get(r.rid, {})
        rows.append({
            "rid": r.rid, "tenant": tenant.get(r.rid, ""), "ok": r.ok, "start_s": round(r.start_s, 4),
            "ttft_s": r.ttft_s, "backend": backend, "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens, "engine_arrival_s": rec.get("arrival_s"),
            "model_queue_s": rec.get("model_queue_s"), "model_ttft_s": rec.get("model_ttft_s"),
            "picked": line.get("endpoint"), "reason": line.get("reason"), "estimates_s": line.get("estimates_s"),
            "picker_ms": (line.get("ms") or {}).get("total"),
        })  # fmt: skip
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """Per tenant: p90s of client TTFT, model queue, model prefill and overhead; requests per backend."""
    out = []
    for name in sorted({r["tenant"] for r in rows}):
        mine = [r for r in rows if r["tenant"] == name and r["ok"] and r["model_ttft_s"] is not None]
        ttft = [r["ttft_s"] for r in mine]
        queue = [r["model_queue_s"] or 0.0 for r in mine]
        prefill = [r["model_ttft_s"] - (r["model_queue_s"] or 0.0) for r in mine]
        over = [r["ttft_s"] - r["model_ttft_s"] for r in mine]
        where: dict[str, int] = {}
        for r in mine:
            where[r["backend"]] = where.get(r["backend"], 0) + 1
        out.append(f"  {name or '-':>8}: n {len(mine)}  p90 ttft {_p(ttft)}  queue {_p(queue)}  prefill "
                   f"{_p(prefill)}  overhead {_p(over)}  per backend {dict(sorted(where.items()))}")  # fmt: skip
    return "\n".join(out)


def _p(xs: list[float]) -> str:
    v = measure.pct(xs, 90)
    return "-" if v is None else f"{v:.3f}"


def trace_name(policy: str, rates: list[float], step: int) -> str:
    """The file of cell ``step``: ``trace-<policy>-<rate>.jsonl``, with ``-cell<step>`` added when the rate comes
    more than once (``--rates 6,6``: a fresh picker's first cell against a taught one), so no cell overwrites
    another."""
    rate = rates[step]
    suffix = f"-cell{step}" if rates.count(rate) > 1 else ""
    return f"trace-{policy}-{rate:g}{suffix}.jsonl"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cell_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="noisy", choices=sorted(WORKLOADS))
    p.add_argument("--policy", default="precise_shares", choices=sorted(POLICIES))
    p.add_argument("--rates", default="0,12")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--picker-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override our picker's config (YAML value), as python -m bench does, e.g. scrape.interval_s=0.3",
    )
    args = p.parse_args(argv)
    picker_set = parse_picker_set(args.picker_set)
    picker_set.setdefault("logging", {})["level"] = "INFO"  # the decision lines this joins
    w, policy = WORKLOADS[args.workload], POLICIES[args.policy]
    rates = [float(x) for x in args.rates.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    fleet = w.fleet_for(False)
    plans = w.plans(rates, args.seed, False)
    backends = Backends(fleet, args.out / "fleet").start()
    try:
        if fleet.engine == "sim":  # as the suite does: no policy pays the simulator's first tokenization
            measure.warm_tokenizer(backends.addresses[0], plans)
        router = start_router(policy, backends, args.out / policy.name, picker_set)
        try:
            for step, (rate, plan) in enumerate(zip(rates, plans, strict=True)):
                rows = _cell(plan, backends, router, args.out / policy.name)
                (args.out / trace_name(policy.name, rates, step)).write_text(
                    "".join(json.dumps(r) + "\n" for r in rows)
                )
                print(f"{policy.name} at {rate:g} rps:\n{summary(rows)}", flush=True)
        finally:
            router.stop()
    finally:
        backends.stop()
    return 0


def _cell(plan: Plan, backends: Backends, router: Any, logdir: Path) -> list[dict[str, Any]]:
    measure.wait_idle(backends.addresses)
    measure.reset_caches(backends.addresses)
    span = max(s.start_s for s in plan.sessions)
    results, _ = asyncio.run(replay(router.url, plan, concurrency=512, request_timeout_s=60.0,
                                    cell_timeout_s=span + 70.0))  # fmt: skip
    measure.wait_idle(backends.addresses, timeout_s=30.0)
    ids = [r.response_id for r in results if r.response_id]
    served = {rid: (a, rec) for a in backends.addresses for rid, rec in records(a, ids).items()}
    lines: dict[str, dict[str, Any]] = {}
    for log in logdir.glob("picker*.log"):
        lines.update(decisions(log.read_text(errors="replace")))
    return join(plan, results, served, lines)


if __name__ == "__main__":
    sys.exit(main())
