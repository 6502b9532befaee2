"""What reading the backends' load costs a picker: its CPU per second with no requests, side by side.

    python -m bench.scrape_cost                                   # this checkout, 4 simulators, 20 s
    python -m bench.scrape_cost --picker-tree /tmp/before --picker-tree /tmp/after

Scraping each endpoint's ``/metrics`` every ``scrape.interval_s`` (0.1 s) is a picker's fixed cost: it does not
grow with the request rate, but at 8 req/s it is most of the router CPU per request in the documents cells.
Each picker (one per ``--picker-tree``, plus a floor: the first tree with scraping every hour, i.e. its timers
and event loop alone) runs in its own stack of ``--backends`` simulators, all at once, and the CPU of every
picker is read over the same windows, so a busy box moves them all alike. Per picker: CPU ms/s per window, the
median, and the median net of the floor divided by the scrapes it made (``--backends / --interval-s`` per s).

Then the parser alone (``extproc.backends.vllm_metrics.parse_metrics``, best of 5), per tree, on a simulator's
page and on a page saved from vLLM 0.32's CPU build (``tests/unit/data/vllm-0.32-metrics.txt``, ~60 KB).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.stack import Stack, StackSpec
from bench.stack_config import REPO
from bench.suite.measure import cpu_s

VLLM_PAGE = REPO / "tests" / "unit" / "data" / "vllm-0.32-metrics.txt"
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


def measure(sides: list[Side], args: argparse.Namespace, workdir: Path) -> tuple[dict[str, list[float]], bytes]:
    """Every side's picker CPU in ms/s per window, all stacks up at once; and a simulator's metrics page."""
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    with contextlib.ExitStack() as stacks:
        running: dict[str, Stack] = {}
        for i, (name, tree, interval) in enumerate(sides):
            spec = StackSpec(
                backends=args.backends, envoy="picker", sim_profile="fast", picker_tree=tree,
                picker_overrides={"scrape": {"interval_s": interval}},
            )  # fmt: skip
            sub = workdir / f"stack{i}"
            sub.mkdir(parents=True, exist_ok=True)
            running[name] = stacks.enter_context(Stack(spec, sub))
            print(f"up: {name}", flush=True)
        first = next(iter(running.values()))
        with urllib.request.urlopen(f"http://{first.backends[0]}/metrics", timeout=5) as answer:
            page = answer.read()
        time.sleep(2.0)  # past start-up work (warm-up, first discovery)
        for _ in range(args.windows):
            before = {name: (cpu_s(s.picker_pids()), time.monotonic()) for name, s in running.items()}
            time.sleep(args.seconds / args.windows)
            for name, s in running.items():
                cpu0, t0 = before[name]
                cpu[name].append((cpu_s(s.picker_pids()) - cpu0) / (time.monotonic() - t0) * 1000)
    return cpu, page


def print_idle(sides: list[Side], cpu: dict[str, list[float]], args: argparse.Namespace) -> None:
    floor = statistics.median(cpu[sides[-1][0]])
    scrapes_per_s = args.backends / args.interval_s
    print(f"\nIdle picker CPU, ms/s ({args.backends} simulators each, scrape every {args.interval_s} s, "
          f"{args.windows} windows of {args.seconds / args.windows:.0f} s, all pickers at once)")  # fmt: skip
    print(f"{'picker':<60} | {'windows':<28} | median | per scrape, net of floor")
    for name, _, interval in sides:
        windows = " ".join(f"{v:5.1f}" for v in cpu[name])
        med = statistics.median(cpu[name])
        per = "" if interval == FLOOR_INTERVAL_S else f"{(med - floor) / scrapes_per_s * 1000:6.0f} us"
        print(f"{name[:60]:<60} | {windows:<28} | {med:6.1f} | {per}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scrape_cost", description=__doc__.split("\n")[0])
    p.add_argument("--picker-tree", type=Path, action="append", default=None,
                   help="run a picker from this checkout (repeat to compare; default: this one)")  # fmt: skip
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--interval-s", type=float, default=0.1, help="the pickers' scrape.interval_s")
    p.add_argument("--seconds", type=float, default=20.0, help="measured time, in --windows windows")
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary dir, removed)")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in (args.picker_tree or [REPO])]
    sides: list[Side] = [(f"tree {i}: {t}", t, args.interval_s) for i, t in enumerate(trees)]
    sides.append(("floor (tree 0, no scrapes)", trees[0], FLOOR_INTERVAL_S))
    with tempfile.TemporaryDirectory(prefix="scrape-cost-") as tmp:
        workdir = Path(args.workdir or tmp)
        cpu, page = measure(sides, args, workdir)
        print_idle(sides, cpu, args)
        sim_page = workdir / "sim-metrics.txt"
        sim_page.write_bytes(page)
        sizes = f"simulator page ({len(page) // 1024} KB), vLLM 0.32 ({VLLM_PAGE.stat().st_size // 1024} KB)"
        print(f"\nparse_metrics alone, us per page (best of 5): {sizes}")
        for i, tree in enumerate(trees):
            sim_us, vllm_us = parse_us(tree, [sim_page, VLLM_PAGE])
            print(f"tree {i}: {sim_us:7.1f} {vllm_us:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
