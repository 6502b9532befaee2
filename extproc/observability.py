"""The router's own Prometheus metrics, on a registry the composition root owns (never the global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from extproc.types import Decision, LearnedCost, RoutingRequest

PHASES = ("parse", "tokenize", "hash", "lookup", "score", "total")
# |predicted - actual| / actual of one scrape interval's mean TTFT (``backends.calibration``)
TTFT_ERROR_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class DecisionSink(Protocol):
    def decided(self, routing: RoutingRequest, decision: Decision) -> None:
        """Called once per decision from ``Router._observe``; must be O(1) (``status.tap.DecisionTap``)."""
        ...


class _NoSink:
    def decided(self, routing: RoutingRequest, decision: Decision) -> None:
        pass


class RouterMetrics:
    """Counters and histograms for decisions; one instance per app. ``tap`` also sees every decision (the
    status page's and the fleet metrics' per-endpoint and per-model totals)."""

    def __init__(self, registry: CollectorRegistry, tap: DecisionSink | None = None) -> None:
        self.registry = registry
        self.tap: DecisionSink = tap or _NoSink()
        self.decisions = Counter("router_decisions", "Routing decisions by reason", ["reason"], registry=registry)
        self.pd_decisions = Counter(
            "router_pd_decisions",
            "P/D: disaggregated or run locally, by reason (disagg, short, saturated, "
            "no_prefill); only while prefill-role endpoints exist",
            ["reason"],
            registry=registry,
        )
        self.rejections = Counter(
            "router_rejections", "Requests refused, by HTTP status", ["status"], registry=registry
        )
        self.cached_tokens = Counter(
            "router_predicted_cached_tokens", "Prompt tokens predicted cached on the pick", registry=registry
        )
        self.prompt_tokens = Counter("router_prompt_tokens", "Prompt tokens routed", registry=registry)
        self.phase_seconds = Histogram(
            "router_pick_phase_seconds",
            "Pick latency by phase",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tokenize_failures = Counter(
            "router_tokenize_failures", "Tokenizations that failed or timed out", registry=registry
        )
        self.index_failures = Counter(
            "router_index_failures",
            "Index lookups past their deadline or failed",
            ["index"],
            registry=registry,
        )
        self.reservations = Counter(
            "router_shared_reservations",
            "Replicas' reservations of the pick's prefill in the shared load, by outcome (reserved; redecided: "
            "another replica reserved there first, decided again; forced: reserved after the last re-decision; "
            "late: past the lookup deadline, left to land; unavailable: Redis failed; busy: the replica's step "
            "was held up past the deadline, not reserved)",
            ["outcome"],
            registry=registry,
        )
        self.served = Counter(
            "router_served",
            "Requests whose served endpoint Envoy reported: the primary pick, or a fallback",
            ["outcome"],
            registry=registry,
        )
        self.late_requests = Counter(
            "router_late_requests",
            "Requests that reached the router past its answer budget and were routed by load at once",
            registry=registry,
        )
        self.tokenizer_checks = Counter(
            "router_tokenizer_checks",
            "Fast encodings (check=encoder) and fast chat-template renders (check=template) sampled for a redo by the "
            "reference off the hot path, by result (match, mismatch; skipped: over the CPU budget, "
            "tokenizer.verify_cpu_share)",
            ["model", "check", "result"],
            registry=registry,
        )
        self.decider_unavailable = Counter(
            "router_decider_unavailable",
            "Requests a front worker passed through because the decider did not answer in time or had gone",
            registry=registry,
        )
        self.endpoint_healthy = Gauge(
            "router_endpoint_healthy", "1 if the endpoint is eligible", ["endpoint"], registry=registry
        )
        self.ttft_error = Histogram(
            "router_ttft_error_ratio",
            "Per endpoint and scrape interval: |mean predicted - mean actual TTFT| / actual (the engine's histogram)",
            buckets=TTFT_ERROR_BUCKETS,
            registry=registry,
        )
        self.ttft_seconds = Counter(
            "router_ttft_seconds",
            "Mean TTFT per compared scrape interval, summed: what the picker predicted and what the engine measured",
            ["endpoint", "kind"],
            registry=registry,
        )
        self.ttft_ratio = Gauge(
            "router_ttft_actual_over_predicted",
            "Running ratio of the engine's TTFT to the picker's prediction (1.0: the estimate is calibrated)",
            ["endpoint"],
            registry=registry,
        )
        self.placement_followers = Gauge(
            "router_placement_followers",
            "Warm decisions per cold one over this replica's recent decisions (scheduling.prefix_reuse): "
            "below 1, new prefixes are seldom followed and cold placement narrows toward the estimate",
            registry=registry,
        )
        self.chain_followers = Gauge(
            "router_chain_followers",
            "Decisions that continued an earlier request's own context per decision that did not, over this "
            "replica's recent decisions (scheduling.prefix_reuse): the calls a chain's start brings along",
            registry=registry,
        )

        self.cost_model = Gauge(
            "router_cost_model",
            "The TTFT cost model learned per endpoint (backends.calibration): param=base_seconds, "
            "prefill_tokens_per_second, interference_per_running, queue_scale",
            ["endpoint", "param"],
            registry=registry,
        )

    def learned(self, endpoint: str, cost: LearnedCost, prefill_tokens_per_s: float) -> None:
        """``endpoint``'s cost model after a learning step (``backends.calibration``)."""
        g = self.cost_model
        g.labels(endpoint, "base_seconds").set(cost.base_s)
        g.labels(endpoint, "prefill_tokens_per_second").set(prefill_tokens_per_s)
        g.labels(endpoint, "interference_per_running").set(cost.interference_per_running)
        g.labels(endpoint, "queue_scale").set(cost.queue_scale)

    def interval(self, endpoint: str, predicted_s: float, actual_s: float, ratio: float) -> None:
        """One scrape interval's predicted and actual mean TTFT on ``endpoint`` (``backends.calibration``)."""
        self.ttft_error.observe(abs(predicted_s - actual_s) / actual_s)
        self.ttft_seconds.labels(endpoint, "predicted").inc(predicted_s)
        self.ttft_seconds.labels(endpoint, "actual").inc(actual_s)
        self.ttft_ratio.labels(endpoint).set(ratio)


class CountersCollector(Collector):
    """Exports the int fields of plain counter dataclasses (owned by background loops) at scrape time.

    The loops keep cheap attribute increments on their hot paths; only a scrape reads them.
    """

    def __init__(self, prefix: str, sources: Callable[[], Iterable[tuple[str, object]]]) -> None:
        self._prefix = prefix
        self._sources = sources

    def collect(self) -> Iterator[CounterMetricFamily]:
        for group, counters in self._sources():
            for f in fields(counters):  # type: ignore[arg-type]
                value = getattr(counters, f.name)
                if isinstance(value, int):
                    yield CounterMetricFamily(f"{self._prefix}_{group}_{f.name}", f"{group} {f.name}", value=value)


class PreciseGauge(Collector):
    """How many endpoints the router currently treats as precise (a live, trusted event stream)."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("router_precise_endpoints", "Endpoints routed by their KV events", value=self._count())


class EncoderInfo(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def fallback_reason(self) -> str | None: ...


def _choice_gauges(
    choices: Iterable[EncoderInfo], used: str, label: str, fallback: str, reference: str
) -> Iterator[GaugeMetricFamily]:
    """``router_<used>{model,<label>}`` 1 for the path in use; ``router_<fallback>{model}`` 1 where the fast
    path was dropped for ``reference``."""
    in_use = GaugeMetricFamily(f"router_{used}", f"1 for the {label} a model uses", labels=["model", label])
    fell = GaugeMetricFamily(f"router_{fallback}", f"1: fast {label} dropped for {reference}", labels=["model"])
    for c in choices:
        in_use.add_metric([c.model, c.name], 1)
        fell.add_metric([c.model], 1 if c.fallback_reason else 0)
    yield in_use
    yield fell


class TokenizerCollector(Collector):
    """At scrape time: each model's encoder and renderer, the fast encoder's segment cache and the hash cache.

    ``router_tokenizer_encoder{model,encoder}`` is 1 for the encoder in use; ``router_tokenizer_fallback``
    is 1 where the fast encoder was dropped for HF (self-check or live mismatch; the log says why).
    ``router_template_renderer{model,renderer}`` and ``router_template_fallback`` say the same of the chat-template
    renderer (``sandbox-memo`` or ``hf``, i.e. ``apply_chat_template``).
    """

    def __init__(
        self,
        encoders: Callable[[], Iterable[EncoderInfo]],
        segment_stats: Callable[[], dict[str, dict[str, int]]],
        hash_stats: Callable[[], Iterable[tuple[str, object]]],
        renderers: Callable[[], Iterable[EncoderInfo]] = list,
        checkpoint_stats: Callable[[], dict[str, object]] = dict,
    ) -> None:
        self._encoders = encoders
        self._segment_stats = segment_stats
        self._hash_stats = hash_stats
        self._renderers = renderers
        self._checkpoint_stats = checkpoint_stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield from _choice_gauges(self._encoders(), "tokenizer_encoder", "encoder", "tokenizer_fallback", "HF")
        yield from _choice_gauges(
            self._renderers(), "template_renderer", "renderer", "template_fallback", "apply_chat_template"
        )
        segments = self._segment_stats()
        for key, kind in (("hits", "counter"), ("misses", "counter"), ("hit_bytes", "counter"),
                          ("miss_bytes", "counter"), ("entries", "gauge"), ("bytes", "gauge")):  # fmt: skip
            name, doc = f"router_tokenizer_segment_cache_{key}", f"fast encoder segment cache: {key}"
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=["model"])
            for model, counts in segments.items():
                family.add_metric([model], counts.get(key, 0))
            yield family
        hashes = list(self._hash_stats())
        yield from _stats_families(
            "router_hash_cache", "block-hash prefix cache", "scheme", hashes, ("hit_blocks", "miss_blocks")
        )
        checkpoints = list(self._checkpoint_stats().items())
        yield from _stats_families(
            "router_tokenizer_checkpoints", "fast encoder checkpoints of long texts", "model", checkpoints,
            ("hits", "misses", "reused_tokens", "encoded_tokens"),
        )  # fmt: skip


def _stats_families(
    prefix: str,
    doc: str,
    label: str,
    stats: list[tuple[str, object]],
    counters: tuple[str, ...],
    gauges: tuple[str, ...] = ("entries", "bytes"),
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """One family per attribute of ``stats``' objects (``(label value, object)`` pairs): counters, then gauges."""
    for key in (*counters, *gauges):
        kind = CounterMetricFamily if key in counters else GaugeMetricFamily
        family = kind(f"{prefix}_{key}", f"{doc}: {key}", labels=[label])
        for value, obj in stats:
            family.add_metric([value], getattr(obj, key))
        yield family


class PhaseTimer:
    """Marks phase boundaries: each mark ends the named phase that began at the previous mark."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._start = clock()
        self._marks: list[tuple[str, float]] = []

    def mark(self, phase: str, split_first: tuple[str, float] | None = None) -> None:
        """End ``phase`` now; ``split_first`` carves a leading sub-phase of known length out of it."""
        now = self._clock()
        if split_first is not None:
            prev = self._marks[-1][1] if self._marks else self._start
            self._marks.append((split_first[0], min(prev + split_first[1], now)))
        self._marks.append((phase, now))

    def phases(self) -> dict[str, float]:
        out: dict[str, float] = {}
        prev = self._start
        for phase, t in self._marks:
            if phase == "total_end":
                out["total"] = t - self._start
            else:
                out[phase] = t - prev
                prev = t
        return out
