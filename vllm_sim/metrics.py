"""``/metrics`` with vLLM 0.33's metric names and labels (``vllm/v1/metrics/loggers.py``).

The only module that knows ``vllm:*`` names. Each server owns a private ``CollectorRegistry`` (never the
default one). Gauges and counters are read from the engine at scrape time (no per-step cost); the latency
histograms (TTFT, e2e, and the queue/prefill/decode phases) are observed when a request's first token and
its end happen, in model (virtual) time.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm_sim.config import ServerConfig
from vllm_sim.engine import Engine
from vllm_sim.request import SimRequest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_LABELS = ("model_name", "engine")


def cache_config_labels(cfg: ServerConfig) -> dict[str, str]:
    """``vllm:cache_config_info`` labels: CacheConfig fields as ``str()`` values, plus ``engine``."""
    e = cfg.engine
    return {
        "block_size": str(e.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(e.enable_prefix_caching),
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(e.num_gpu_blocks),
        "num_gpu_blocks_override": str(e.num_gpu_blocks),
        "prefix_caching_hash_algo": e.hash_algo,
        "sliding_window": "None",
        "engine": "0",
    }


class _EngineCollector(Collector):
    """Scrape-time view of one engine's gauges and counters."""

    def __init__(self, cfg: ServerConfig, engine: Engine, totals: dict[str, int]) -> None:
        self._cfg = cfg
        self._engine = engine
        self._totals = totals
        self._values = [cfg.model_name, "0"]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=_LABELS)
        g.add_metric(self._values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=_LABELS)
        c.add_metric(self._values, value)
        return c

    def collect(self) -> Iterator[Metric]:
        sched = self._engine.scheduler
        stats = sched.stats
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", len(sched.running)
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(sched.waiting)
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            self._engine.pool.usage(),
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.num_preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self._totals["prompt"])
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", self._totals["generation"]
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(cache_config_labels(self._cfg)),
        )
        info.add_metric(list(cache_config_labels(self._cfg).values()), 1.0)
        yield info
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*_LABELS, "finished_reason"])  # fmt: skip
        for reason in ("stop", "length"):
            success.add_metric([*self._values, reason], self._totals[f"finished_{reason}"])
        yield success
        if self._cfg.lora_modules:
            yield self._lora_info()

    def _lora_info(self) -> GaugeMetricFamily:
        sched = self._engine.scheduler
        running = sorted({r.lora.name for r in sched.running if r.lora is not None})
        waiting = sorted({r.lora.name for r in sched.waiting if r.lora is not None})
        g = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        g.add_metric([str(sched.cfg.max_loras), ",".join(waiting), ",".join(running)], time.time())
        return g


class ServerMetrics:
    """The metrics of one server; also the engine's :class:`~vllm_sim.engine.EngineObserver`."""

    def __init__(self, cfg: ServerConfig, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._totals = {"prompt": 0, "generation": 0, "finished_stop": 0, "finished_length": 0}
        self.registry.register(_EngineCollector(cfg, engine, self._totals))
        labels: dict[str, Any] = {"model_name": cfg.model_name, "engine": "0"}
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        ).labels(**labels)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            registry=self.registry,
            buckets=E2E_BUCKETS,
        ).labels(**labels)
        # vLLM's request phase histograms (queue: arrival → first scheduled; prefill: → first token; decode: →
        # last token), on the request-latency buckets as vLLM has them.
        self._phases = {
            phase: Histogram(
                f"vllm:request_{phase}_time_seconds", f"Histogram of time spent in {phase.upper()} phase for request.",
                _LABELS, registry=self.registry, buckets=E2E_BUCKETS,
            ).labels(**labels)
            for phase in ("queue", "prefill", "decode")
        }  # fmt: skip

    def on_first_token(self, req: SimRequest, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)
        self._totals["prompt"] += len(req.prompt_token_ids)
        if req.scheduled_s is not None and req.first_token_s is not None:
            self._phases["queue"].observe(max(req.scheduled_s - req.arrival_s, 0.0))
            self._phases["prefill"].observe(max(req.first_token_s - req.scheduled_s, 0.0))

    def on_finished(self, req: SimRequest, e2e_s: float) -> None:
        self._e2e.observe(e2e_s)
        if req.first_token_s is not None and req.finish_s is not None:
            self._phases["decode"].observe(max(req.finish_s - req.first_token_s, 0.0))
        self._totals["generation"] += req.num_output_tokens
        key = f"finished_{req.finish_reason}"
        if key in self._totals:
            self._totals[key] += 1

    def render(self, names: Collection[str] = ()) -> bytes:
        """The Prometheus text exposition; with ``names``, only the samples so named (prometheus_client's
        ``name[]`` filter, as vLLM's mounted exposition app applies it: families without one are left out)."""
        if not names:
            return bytes(generate_latest(self.registry))
        return bytes(generate_latest(_Only(self.registry, frozenset(names))))


class _Only:
    """A registry's families, each with only the samples named in ``names`` (and left out without any)."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]) -> None:
        self._registry = registry
        self._names = names

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.name in self._names]
            if samples:
                kept = Metric(family.name, family.documentation, family.type)
                kept.samples = samples
                yield kept
