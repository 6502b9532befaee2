"""The router's own Prometheus metrics, on a registry the composition root owns (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("parse", "tokenize", "hash", "lookup", "score", "total")
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class RouterMetrics:
    """Counters and histograms for decisions; one instance per app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "router_decisions", "Routing decisions by reason", ["reason"], registry=registry
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
        self.served = Counter(
            "router_served",
            "Requests whose served endpoint Envoy reported: the primary pick, or a fallback",
            ["outcome"],
            registry=registry,
        )
        self.endpoint_healthy = Gauge(
            "router_endpoint_healthy", "1 if the endpoint is eligible", ["endpoint"], registry=registry
        )
