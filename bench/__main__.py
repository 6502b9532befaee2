"""``python -m bench``: the benchmark suite, our policies and the peer routers on one fleet.

    python -m bench --quick                       # every workload and policy, small scale (< 10 minutes)
    python -m bench                               # the full run (see docs/benchmarks.md)
    python -m bench --engine vllm-cpu --quick     # on two real vLLM CPU engines, the CPU shape (bench/suite/cpu.py)
    python -m bench --workload tenants --policies round_robin,approximate,precise
    python -m bench --workload trace:/path/to/trace.jsonl --trace-block-tokens 512 --trace-token-scale 0.125
    python -m bench --report-only bench/results/full   # re-render report.md and plots from results.json

Writes ``results.json``, ``report.md`` and ``*.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from bench.suite.cpu import CPU_FLEET, EngineMissing, require_engine, workloads_for
from bench.suite.fleet import parse_picker_set
from bench.suite.policies import POLICIES
from bench.suite.workloads import ENGINES, WORKLOADS, Workload, trace_workload

DEFAULT_WORKLOADS = ("documents", "tenants", "agents", "mooncake", "unique")


def _parser() -> argparse.ArgumentParser:
    workloads = "\n".join(f"  {n:<12} {w.summary}" for n, w in WORKLOADS.items())
    policies = "\n".join(f"  {n:<22} {p.summary}" for n, p in POLICIES.items())
    p = argparse.ArgumentParser(
        prog="python -m bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay workloads at a ladder of request rates through each routing policy, on one "
        "simulated vLLM fleet (or two real vLLM CPU engines: --engine vllm-cpu) on 127.0.0.1; write "
        "results.json, report.md and plots.",
        epilog=f"workloads:\n{workloads}\n  trace:PATH   any Mooncake-format JSONL trace\n(--engine vllm-cpu: the same "
        f"names in a CPU shape, bench/suite/cpu.py)\n\npolicies:\n{policies}",
    )
    p.add_argument("--quick", action="store_true", help="small scale: every workload and policy in < 10 minutes")
    p.add_argument("--engine", choices=ENGINES, default="sim",
                   help="sim: the simulated fleet (default); vllm-cpu: two real vLLM CPU engines (one per core) "
                   "and the workloads' CPU shape, low rates (needs scripts/setup.sh --with-vllm-cpu)")  # fmt: skip
    p.add_argument("--workload", default=",".join(DEFAULT_WORKLOADS),
                   help="comma-separated workload names, 'none' for the smoke workload, or trace:PATH")  # fmt: skip
    p.add_argument("--policies", default="auto", help="comma-separated policy names, 'all', or 'auto' (all on "
                   "tenants; baselines, ours and the peers' cache-aware policies elsewhere; on vllm-cpu: round robin, "
                   "approximate, precise and the peers' cache-aware policies)")  # fmt: skip
    p.add_argument("--rates", default=None, help="comma-separated request rates (req/s), overriding the ladders")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/<quick|full> (vllm-cpu: .../vllm-cpu-<quick|full>)")  # fmt: skip
    p.add_argument("--workdir", type=Path, default=None, help="process logs (default: a temporary folder)")
    p.add_argument("--request-timeout-s", type=float, default=None, help="per request (default 30 quick, 60 full)")
    p.add_argument("--concurrency", type=int, default=512, help="client's in-flight request bound")
    p.add_argument("--trace-block-tokens", type=int, default=512, help="tokens per hash id in a trace:PATH")
    p.add_argument("--trace-token-scale", type=float, default=0.125, help="shrink trace lengths by this factor")
    p.add_argument("--trace-count", type=int, default=240, help="requests replayed from a trace:PATH")
    p.add_argument(
        "--picker-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override our pickers' config (YAML value; KEY may be a dotted path into the section), e.g. "
        "scheduling.kv_pressure_threshold=1.0 or scheduling.cost_model.learn=false",
    )
    p.add_argument("--report-only", type=Path, default=None, help="re-render the report of a results folder")
    p.add_argument("--no-plots", action="store_true", help="report without PNG plots")
    p.add_argument(
        "--repeat", type=int, default=1, help="runs per cell (the median run by TTFT p90 is reported, with the spread)"
    )
    return p


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def select_workloads(args: argparse.Namespace) -> list[Workload] | None:
    """The ``--workload`` list in ``--engine``'s shape (None after printing why, for an unknown name)."""
    known = workloads_for(args.engine)
    out = []
    for name in args.workload.split(","):
        name = name.strip()
        if name == "none":
            name = "smoke"
        if name.startswith("trace:"):
            trace = (name[6:], args.trace_block_tokens, args.trace_token_scale, args.trace_count)
            cpu = args.engine == "vllm-cpu"  # the CPU fleet; prompts cut to fit its 4K context
            out.append(trace_workload(*trace, CPU_FLEET, 3072) if cpu else trace_workload(*trace))
        elif name in known:
            out.append(known[name])
        else:
            print(f"unknown workload {name!r}; known: {', '.join(known)}, trace:PATH", file=sys.stderr)
            return None
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from bench.suite import report

    if args.report_only is not None:
        report.write(args.report_only, plots=not args.no_plots)
        return 0
    workloads = select_workloads(args)
    if workloads is None:
        return 2
    if args.engine == "vllm-cpu":
        try:
            require_engine()
        except EngineMissing as exc:
            print(exc, file=sys.stderr)
            return 2
    every = args.policies in ("all", "auto")
    policies = list(POLICIES) if every else [s.strip() for s in args.policies.split(",")]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"unknown policies {unknown}; known: {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    from bench.suite.runner import RunOptions, run

    signal.signal(signal.SIGTERM, _terminate)  # unwind, so that every backend and router started is stopped

    scale = "quick" if args.quick else "full"
    out = args.out or Path(__file__).resolve().parent / "results" / (scale if args.engine == "sim" else
                                                                     f"{args.engine}-{scale}")  # fmt: skip
    timeout = args.request_timeout_s or (30.0 if args.quick else 60.0)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        opts = RunOptions(
            workloads=workloads, policies=policies, quick=args.quick, seed=args.seed, out=out,
            workdir=args.workdir or Path(tmp), concurrency=args.concurrency, request_timeout_s=timeout,
            rates=[float(r) for r in args.rates.split(",")] if args.rates else None, auto=args.policies == "auto",
            picker_set=parse_picker_set(args.picker_set), repeat=args.repeat, engine=args.engine,
            command="python -m bench " + shlex.join(argv if argv is not None else sys.argv[1:]),
        )  # fmt: skip
        run(opts)
    report.write(out, plots=not args.no_plots)
    print(f"results: {out / 'results.json'}\nreport:  {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
