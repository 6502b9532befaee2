"""The one module that knows vLLM's ``/metrics`` names (vLLM ≥ 0.10; SPEC.md §3).

Parses only the lines we need from the Prometheus text format, without a general parser: a scrape every
~100 ms per endpoint must cost microseconds, not milliseconds. Values are summed over ``engine`` labels
(data-parallel ranks); KV usage is averaged over them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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


def _split(line: str) -> tuple[str, dict[str, str], float]:
    brace = line.find("{")
    if brace >= 0:
        close = line.rindex("}")
        name, labels = line[:brace], dict(_LABEL.findall(line[brace + 1 : close]))
        rest = line[close + 1 :]
    else:
        name, _, rest = line.partition(" ")
        labels = {}
    value = rest.split()[0]
    return name, labels, float(value)


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(x for x in (value or "").split(",") if x)


def parse_metrics(text: str) -> EngineMetrics:
    """Parse a vLLM ``/metrics`` page. Raises ``MetricsParseError`` if the load gauges are absent or bad."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    models: set[str] = set()
    cache_labels: dict[str, str] = {}
    lora_labels: dict[str, str] = {}
    try:
        for line in text.splitlines():
            if not line.startswith("vllm:") or not line.startswith(_WANTED):
                continue
            name, labels, value = _split(line)
            if name not in _WANTED:
                continue
            if "model_name" in labels:
                models.add(labels["model_name"])
            if name == CACHE_CONFIG:
                cache_labels = labels
            elif name == LORA_INFO:
                lora_labels = labels
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    except (ValueError, IndexError) as exc:
        raise MetricsParseError(f"unparsable metrics line: {exc}") from exc
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
        models=frozenset(models),
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
