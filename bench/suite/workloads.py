"""Workloads: deterministic request plans (word-id prompts, arrival times, chains) and their cache ceiling.

A ``Plan`` is what one (workload, rate) cell sends: ``sessions``, each starting at ``start_s`` (seconds from
the cell's start) and sending its ``calls`` one after another (a chain waits for the previous answer; most
sessions hold one call). Every plan is a pure function of (workload, rate, step, seed, quick): same seed,
same requests. ``step`` (the rung of the rate ladder) salts every generated text, so each rung sends content
that no router or backend has seen, and no cache left over from the previous rung can help or hurt
(``Workload.plans`` gives a rate of the ladder its own rung wherever it stands).

``ceiling_cached_share``: with an infinite cache, the share of prompt tokens that vLLM could serve from
cache, in request order: a request hits its leading full blocks that any earlier request produced, never
its last prompt token (vLLM always computes one). Chains are ordered by start time plus call index.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.suite.words import SPACE, vocabulary

BLOCK_SIZE = 16  # the simulated fleet's; a Fleet carries its own (vLLM's CPU build needs a multiple of 32)
MOONCAKE_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake"


@dataclass(frozen=True, slots=True)
class Call:
    rid: str
    ids: tuple[int, ...]  # word ids (one token each); SPACE = an extra leading-space token
    max_tokens: int
    tenant: str = ""  # sent as the tenant header (wire.TENANT_HEADER) when set


@dataclass(frozen=True, slots=True)
class Session:
    start_s: float
    calls: tuple[Call, ...]


ENGINES = ("sim", "vllm-cpu")


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the backends look like for a workload (KV pressure and time scale are per workload). ``engine``:
    ``"sim"`` (one vllm-sim process, time-scaled H100 profile) or ``"vllm-cpu"`` (one real vLLM CPU engine per
    backend, bench/vllm_cpu.py; ``time_scale`` unused)."""

    backends: int = 4
    num_gpu_blocks: int = 2048  # per backend, blocks of block_size tokens
    time_scale: float = 5.0  # --sim-time-scale: every modelled step lasts this many times longer
    max_model_len: int = 16384
    block_size: int = BLOCK_SIZE
    engine: str = "sim"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        if self.engine == "vllm-cpu" and self.block_size % 32:
            raise ValueError(f"vllm-cpu needs a block size that is a multiple of 32, got {self.block_size}")

    @property
    def usable_model_len(self) -> int:
        """``max_model_len`` cut to what the KV holds (block 0 is the null block; both engines refuse more)."""
        return min(self.max_model_len, (self.num_gpu_blocks - 1) * self.block_size)


@dataclass(frozen=True, slots=True)
class Plan:
    workload: str
    sessions: tuple[Session, ...]

    @property
    def calls(self) -> list[Call]:
        return [c for s in self.sessions for c in s.calls]

    def ceiling_cached_share(self, block_size: int = BLOCK_SIZE) -> float:
        ordered = sorted(
            ((s.start_s, j, c) for s in self.sessions for j, c in enumerate(s.calls)), key=lambda t: (t[0], t[1])
        )
        return ceiling_share([c.ids for _, _, c in ordered], block_size)


def ceiling_share(prompts: Sequence[Sequence[int]], block_size: int = BLOCK_SIZE) -> float:
    """Infinite-cache hit share of ``prompts`` sent in this order (see the module docstring)."""
    seen: set[int] = set()
    hit = total = 0
    for ids in prompts:
        total += len(ids)
        cacheable = (len(ids) - 1) // block_size  # the last prompt token is always computed
        parent = 0
        hitting = True
        for b in range(len(ids) // block_size):
            parent = hash((parent, tuple(ids[b * block_size : (b + 1) * block_size])))
            if hitting and b < cacheable and parent in seen:
                hit += block_size
            else:
                hitting = False
            seen.add(parent)
    return hit / total if total else 0.0


def _words(rng: random.Random, n: int) -> tuple[int, ...]:
    size = len(vocabulary())
    return tuple(rng.randrange(size) for _ in range(n))


def _poisson(rng: random.Random, rate: float, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    summary: str
    fleet: Fleet
    rates_quick: tuple[float, ...]
    rates_full: tuple[float, ...]
    build: Callable[[float, int, int, bool], Plan]  # (rate, step, seed, quick) -> Plan
    prefix_heavy: bool = True
    fleet_quick: Fleet | None = None  # the quick shape's fleet, when its KV must shrink with it

    def fleet_for(self, quick: bool) -> Fleet:
        return (self.fleet_quick or self.fleet) if quick else self.fleet

    def plan(self, rate: float, step: int, seed: int, quick: bool) -> Plan:
        return self.build(rate, step, seed, quick)

    def plans(self, rates: Sequence[float], seed: int, quick: bool) -> list[Plan]:
        """One plan per rate, in order, each on its own rung (no two cells share text). A rate on the shape's
        own ladder, given once, replays that cell's requests wherever it stands in ``rates``: ``--rates 12``
        alone replays the agents cell the suite runs at 12 req/s (its second), not the first cell's requests
        sent faster. Any other rate (or one given twice) takes a rung past the ladder's, by its position. (The
        router still starts fresh: the suite's cell follows the cells before it.)"""
        ladder = list(self.rates_quick if quick else self.rates_full)
        steps = [
            ladder.index(r) if r in ladder and rates.count(r) == 1 else len(ladder) + i for i, r in enumerate(rates)
        ]
        return [self.build(r, step, seed, quick) for r, step in zip(rates, steps, strict=True)]


# -- (1) long documents, several questions each, some with one leading space ----------------------------------
DOCUMENTS_FULL = {"docs": 8, "doc_len": 2560, "asks": 16, "output": 32}
DOCUMENTS_QUICK = {"docs": 4, "doc_len": 1536, "asks": 8, "output": 32}


def _documents(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return documents_plan(rate, step, seed, **(DOCUMENTS_QUICK if quick else DOCUMENTS_FULL))


def documents_plan(rate: float, step: int, seed: int, *, docs: int, doc_len: int, asks: int, output: int) -> Plan:
    """``docs`` documents of ``doc_len`` tokens behind a 48-token system prompt, ``asks`` questions (24-64
    tokens) each in random order, 15% with one leading space before the document."""
    rng = random.Random(f"documents/{seed}/{step}")
    n_docs = docs
    system = _words(rng, 48)
    docs = [_words(rng, doc_len) for _ in range(n_docs)]
    pairs = [(d, q) for d in range(n_docs) for q in range(asks)]
    rng.shuffle(pairs)
    times = _poisson(rng, rate, len(pairs))
    sessions = []
    for i, ((d, _q), t) in enumerate(zip(pairs, times, strict=True)):
        space = (SPACE,) if rng.random() < 0.15 else ()  # the same document, one leading space added
        ids = system + space + docs[d] + _words(rng, rng.randint(24, 64))
        sessions.append(Session(t, (Call(f"doc-{step}-{i}", ids, output),)))
    return Plan("documents", tuple(sessions))


# -- (2) llm-d's precise-prefix shape: tenants with shared system prefixes under KV pressure -------------------
TENANTS_FULL = {"groups": 16, "prefix": 1536, "users": 5, "rounds": 3, "question": 192, "output": 32}
TENANTS_QUICK = {"groups": 8, "prefix": 1024, "users": 3, "rounds": 2, "question": 128, "output": 16}


def _tenants(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return tenants_plan(rate, step, seed, TENANTS_QUICK if quick else TENANTS_FULL)


def tenants_plan(rate: float, step: int, seed: int, p: dict[str, int]) -> Plan:
    """``p``: groups, prefix, users, rounds, question, output (see ``TENANTS_FULL``)."""
    rng = random.Random(f"tenants/{seed}/{step}")
    prefixes = [_words(rng, p["prefix"]) for _ in range(p["groups"])]
    users = [(g, u) for g in range(p["groups"]) for u in range(p["users"])]
    order = [gu for _ in range(p["rounds"]) for gu in rng.sample(users, len(users))]
    times = _poisson(rng, rate, len(order))
    sessions = []
    for i, ((g, _u), t) in enumerate(zip(order, times, strict=True)):
        ids = prefixes[g] + _words(rng, p["question"])
        sessions.append(Session(t, (Call(f"ten-{step}-{i}", ids, p["output"]),)))
    return Plan("tenants", tuple(sessions))


def _tenants_fleet(quick: bool) -> Fleet:
    """KV sized as in llm-d's 73%-capacity run: the shared prefixes take 64% of the fleet's KV (full: 16 x 1536
    = 24.6K tokens of 4 x 600 blocks x 16 = 38.4K; quick: 8 x 1024 = 8.2K of 4 x 200 x 16 = 12.8K), and about
    85% with the questions in flight at the knee. Questions and outputs are shorter than llm-d's (192 and 32
    tokens against a 1.5K prefix, vs 1.2K and 1K against 6K) so that a backend, holding only ~6 prefixes,
    keeps llm-d's headroom of concurrent requests. Round robin spreads every prefix to every backend (4x the
    demand) and thrashes, as in llm-d's run."""
    return Fleet(backends=4, num_gpu_blocks=200 if quick else 600, time_scale=5.0, max_model_len=8192)


# -- (3) agent chains: sequential calls on one growing context --------------------------------------------------
AGENTS_FULL = {"sessions": 16, "chain": 5, "tools": 1024, "task": 256, "result": 200, "output": 32}
AGENTS_QUICK = {"sessions": 12, "chain": 4, "tools": 512, "task": 128, "result": 160, "output": 32}


def _agents(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return agents_plan(rate, step, seed, **(AGENTS_QUICK if quick else AGENTS_FULL))


def agents_plan(rate: float, step: int, seed: int, *, sessions: int, chain: int, tools: int, task: int, result: int,
                output: int) -> Plan:  # fmt: skip
    """``sessions`` chains of ``chain`` calls: shared tool definitions + a task, each call adding a result."""
    rng = random.Random(f"agents/{seed}/{step}")
    n_sessions, tools_len, task_len, result_len = sessions, tools, task, result
    shared = _words(rng, tools_len)  # every agent carries the same tool definitions
    starts = _poisson(rng, rate / chain, n_sessions)  # sessions arrive so that calls come at ~rate
    out = []
    for s, t in enumerate(starts):
        context = shared + _words(rng, task_len)
        calls = []
        for j in range(chain):
            calls.append(Call(f"agent-{step}-{s}-{j}", context, output))
            context = context + _words(rng, result_len)  # the tool's result joins the context
        out.append(Session(t, tuple(calls)))
    return Plan("agents", tuple(out))


# -- (4) Mooncake traces, time-scaled windows ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TraceOptions:
    path: Path
    block_tokens: int = 512  # tokens per hash id in the trace (Mooncake: 512)
    token_scale: float = 1.0  # shrink every length by this factor (e.g. 0.125: a hash id becomes 64 tokens)
    start: int = 0  # first request of the window
    count: int = 200  # requests in the window
    max_output: int = 64
    max_prompt: int = 16000
    sample_conversations: bool = False  # keep whole conversations (rows sharing their 2nd hash id) instead


def load_trace(opts: TraceOptions) -> list[dict[str, int | list[int]]]:
    rows = []
    with opts.path.open() as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def trace_plan(opts: TraceOptions, name: str, rate: float, step: int, seed: int, quick: bool) -> Plan:
    """Replay a window of a Mooncake-format trace: each hash id is a deterministic block of
    ``block_tokens * token_scale`` tokens (drawn from a RNG seeded with the id), the last block is cut to the
    (scaled) input length, arrivals keep the trace's gaps, rescaled so the window's mean rate is ``rate``."""
    rows = load_trace(opts)
    count = opts.count // 3 if quick else opts.count
    if opts.sample_conversations:
        window = _sample_conversations(rows, count, random.Random(f"{name}/{seed}/sample"))
    else:
        window = rows[opts.start : opts.start + count]
    block = max(1, round(opts.block_tokens * opts.token_scale))
    t0 = int(window[0]["timestamp"])  # type: ignore[arg-type]
    span_s = max(1e-3, (int(window[-1]["timestamp"]) - t0) / 1000.0)  # type: ignore[arg-type]
    stretch = (len(window) - 1) / rate / span_s if len(window) > 1 else 1.0
    blocks: dict[int, tuple[int, ...]] = {}
    sessions = []
    for i, row in enumerate(window):
        length = max(1, round(int(row["input_length"]) * opts.token_scale))  # type: ignore[arg-type]
        length = min(length, opts.max_prompt)
        ids: tuple[int, ...] = ()
        for h in row["hash_ids"]:  # type: ignore[union-attr]
            if len(ids) >= length:
                break
            if h not in blocks:
                blocks[h] = _words(random.Random(f"{name}/{seed}/{step}/{h}"), block)
            ids += blocks[h]
        ids = ids[:length]
        if len(ids) < length:  # a trace row with fewer ids than its length: pad with its own words
            ids += _words(random.Random(f"{name}/{seed}/{step}/pad/{i}"), length - len(ids))
        out = max(1, min(opts.max_output, round(int(row["output_length"]) * opts.token_scale)))  # type: ignore[arg-type]
        start = (int(row["timestamp"]) - t0) / 1000.0 * stretch  # type: ignore[arg-type]
        sessions.append(Session(start, (Call(f"{name}-{step}-{i}", ids, out),)))
    return Plan(name, tuple(sessions))


Row = dict[str, int | list[int]]


def _sample_conversations(rows: list[Row], count: int, rng: random.Random) -> list[Row]:
    """Whole conversations, chosen at random until ``count`` rows, in trace order. A contiguous window of the
    conversation trace has almost no reuse (turns of one conversation are minutes apart; a 240-row window
    spans 80 s); rows that share their second hash id are one conversation (the first is shared by all)."""
    families: dict[object, list[int]] = {}
    for i, row in enumerate(rows):
        ids = row["hash_ids"]
        key: object = ids[1] if len(ids) > 1 else ("solo", i)  # type: ignore[arg-type]
        families.setdefault(key, []).append(i)
    keys = list(families)
    rng.shuffle(keys)
    chosen: list[int] = []
    for key in keys:
        if len(chosen) >= count:
            break
        if len(families[key]) <= count // 6:  # no single conversation dominates the window
            chosen += families[key]
    return [rows[i] for i in sorted(chosen)]


MOONCAKE = TraceOptions(MOONCAKE_DIR / "conversation_trace.jsonl", token_scale=0.125, count=120,
                        sample_conversations=True)  # fmt: skip


def _mooncake(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return trace_plan(MOONCAKE, "mooncake", rate, step, seed, quick)


# -- (5) no sharing at all ----------------------------------------------------------------------------------------
def _unique(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return unique_plan(rate, step, seed, n=48 if quick else 80, lo=768, hi=1280, output=32)


def unique_plan(rate: float, step: int, seed: int, *, n: int, lo: int, hi: int, output: int) -> Plan:
    """``n`` prompts of ``lo``-``hi`` tokens that share nothing."""
    rng = random.Random(f"unique/{seed}/{step}")
    times = _poisson(rng, rate, n)
    sessions = [Session(t, (Call(f"uniq-{step}-{i}", _words(rng, rng.randint(lo, hi)), output),))
                for i, t in enumerate(times)]  # fmt: skip
    return Plan("unique", tuple(sessions))


# -- a tiny workload for tests --------------------------------------------------------------------------------
def _smoke(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return smoke_plan(rate, step, seed, prefix_len=64)


def smoke_plan(rate: float, step: int, seed: int, prefix_len: int) -> Plan:
    """8 short requests on one ``prefix_len``-token prefix, 4 output tokens each."""
    rng = random.Random(f"smoke/{seed}/{step}")
    prefix = _words(rng, prefix_len)
    times = _poisson(rng, rate, 8)
    sessions = [Session(t, (Call(f"smoke-{step}-{i}", prefix + _words(rng, 16), 4),)) for i, t in enumerate(times)]
    return Plan("smoke", tuple(sessions))


# -- (6) noisy neighbour: a premium tenant's hot prefixes under a batch tenant's flood of unique prompts ---------
NOISY = {"prefixes": 4, "prefix": 1024, "question": 48, "premium_rps": 2.0, "premium_calls": 40, "batch_min": 1024,
         "batch_max": 1536, "output": 16}  # fmt: skip
NOISY_TENANTS = ("premium", "batch")


def _noisy(rate: float, step: int, seed: int, quick: bool) -> Plan:
    return noisy_plan(rate, step, seed, NOISY)


def noisy_plan(rate: float, step: int, seed: int, p: dict[str, float]) -> Plan:
    """``premium``: ``premium_calls`` chat turns at ``premium_rps`` on a few hot ``prefix``-token prefixes;
    ``batch``: unique prompts at ``rate`` (the ladder's rate; 0 = premium alone) over the same span."""
    rng = random.Random(f"noisy/{seed}/{step}")
    prefixes = [_words(rng, int(p["prefix"])) for _ in range(int(p["prefixes"]))]
    n_premium = int(p["premium_calls"])
    span_s = n_premium / p["premium_rps"]
    # Premium's arrivals come from their own seed, the same in every rung, so "premium alone" and "premium under
    # the flood" compare one premium sequence (its token ids stay salted per rung, as every workload's are).
    premium_times = _poisson(random.Random(f"noisy/{seed}/premium"), p["premium_rps"], n_premium)
    sessions = []
    for i, t in enumerate(premium_times):
        ids = prefixes[i % len(prefixes)] + _words(rng, int(p["question"]))
        sessions.append(Session(t, (Call(f"noisy-{step}-p{i}", ids, int(p["output"]), "premium"),)))
    for i, t in enumerate(_poisson(rng, rate, round(rate * span_s)) if rate > 0 else []):
        ids = _words(rng, rng.randint(int(p["batch_min"]), int(p["batch_max"])))
        sessions.append(Session(t, (Call(f"noisy-{step}-b{i}", ids, int(p["output"]), "batch"),)))
    sessions.sort(key=lambda s: s.start_s)
    return Plan("noisy", tuple(sessions))


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("documents", "long documents: 8 x 2.5K tokens, 16 questions each, 15% with one leading space added",
                 Fleet(num_gpu_blocks=1024), (8.0,), (8.0, 16.0), _documents),
        Workload("tenants", "llm-d precise-prefix shape, scaled: 16 groups x 1.5K-token prefix x 5 users x 3 "
                 "rounds, 192-token questions, 32 output tokens; prefixes 64% of fleet KV",
                 _tenants_fleet(False), (10.0,), (8.0, 16.0, 24.0), _tenants, fleet_quick=_tenants_fleet(True)),
        Workload("agents", "agent chains: 16 sessions x 5 sequential calls on a growing context (1K shared tools)",
                 Fleet(num_gpu_blocks=1024), (8.0,), (6.0, 12.0), _agents),
        Workload("mooncake", "Mooncake conversation trace: ~120 rows of whole conversations sampled at random, "
                 "1 hash id = 64 tokens, time-compressed to the rate",
                 Fleet(num_gpu_blocks=1024), (8.0,), (8.0, 16.0), _mooncake),
        Workload("unique", "no sharing: unique 0.75-1.3K-token prompts", Fleet(num_gpu_blocks=1024),
                 (8.0,), (8.0, 16.0), _unique, prefix_heavy=False),
        Workload("noisy", "noisy neighbour: premium (4 hot 1K-token prefixes, 2 rps chat) beside a batch flood of "
                 "unique 1-1.5K-token prompts at the ladder's rate (0 = premium alone); 384 blocks per backend",
                 Fleet(num_gpu_blocks=384, max_model_len=4096), (0.0, 12.0), (0.0, 6.0, 12.0), _noisy),
        Workload("smoke", "tests only: 8 short requests on one prefix", Fleet(backends=2, num_gpu_blocks=512,
                 time_scale=1.0, max_model_len=4096), (4.0,), (4.0,), _smoke, prefix_heavy=False),
    )
}  # fmt: skip


def trace_workload(path: str, block_tokens: int, token_scale: float, count: int, fleet: Fleet | None = None,
                   max_prompt: int = 16000) -> Workload:  # fmt: skip
    """``trace:PATH``: any Mooncake-format JSONL (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``); ``fleet``: default the simulated one (1024 blocks per backend)."""
    opts = TraceOptions(Path(path), block_tokens=block_tokens, token_scale=token_scale, count=count,
                        max_prompt=max_prompt)  # fmt: skip
    name = "trace:" + Path(path).stem

    def build(rate: float, step: int, seed: int, quick: bool) -> Plan:
        return trace_plan(opts, name, rate, step, seed, quick)

    return Workload(name, f"trace {path} ({count} requests, {block_tokens} tokens per hash id x {token_scale})",
                    fleet or Fleet(num_gpu_blocks=1024), (3.0, 6.0), (5.0, 10.0), build)  # fmt: skip
