"""The policies compared: Envoy's own balancers, our picker in four configurations, and the peer routers.

Each maps to plain data that ``fleet.start_router`` turns into processes. Our picker's configurations:

* ``load``: the TTFT profile with the index off (``index.enabled: false``): load alone;
* ``approximate``: the default picker, no KV events (its index learns from its own decisions);
* ``precise``: endpoints' ``kv_events`` set (the backends publish, the picker subscribes, with replay);
* ``precise_x2``: two picker replicas sharing ``index.backend: redis`` (valkey-server) behind one Envoy;
* ``precise_authz``: ``precise`` asked over Envoy's ext_authz filter (one HTTP round trip with the body) instead
  of ext_proc (two gRPC messages: headers, then body); ``--policies auto`` runs it on tenants only (every policy
  runs there);
* ``precise_shares``: ``precise`` with tenant cache shares (``SHARES``: the ``noisy`` workload's premium class
  protected with a quarter of the fleet's KV; batch in a class of its own, no share, no budget);
* ``precise_shares_budget``: the same, with batch's ``uncached_tokens_per_endpoint`` at 1,536 (``SHARES_BUDGET``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Policy:
    name: str
    kind: Literal["envoy", "picker", "sglang", "vllm"]
    summary: str
    envoy_kind: str = "round_robin"
    picker_overrides: dict[str, Any] = field(default_factory=dict)
    kv_events: bool = False
    replicas: int = 1
    redis: bool = False
    peer_policy: str = ""
    transport: Literal["ext_proc", "ext_authz"] = "ext_proc"  # how Envoy asks our picker (``envoy/README.md``)

    @property
    def ours(self) -> bool:
        return self.kind == "picker"

    @property
    def peer(self) -> bool:
        return self.kind in ("sglang", "vllm")


SHARES = {"classes": {"premium": {"priority": 1, "protect_hot_prefixes": True, "cache_share": 0.25},
                      "batch": {"priority": 0}}}  # fmt: skip
SHARES_BUDGET = {"classes": {**SHARES["classes"], "batch": {"priority": 0, "uncached_tokens_per_endpoint": 1536}}}
"""``SHARES`` with batch allowed onto premium's endpoints within 1,536 uncached tokens in flight (one prompt)."""


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("round_robin", "envoy", "Envoy round robin, no picker", envoy_kind="round_robin"),
        Policy("least_request", "envoy", "Envoy least request, no picker", envoy_kind="least_request"),
        Policy("load", "picker", "ours: TTFT profile, index disabled (load only)",
               picker_overrides={"index": {"enabled": False}}),
        Policy("approximate", "picker", "ours: default picker, approximate index (no KV events)"),
        Policy("precise", "picker", "ours: precise index fed by the backends' KV events", kv_events=True),
        Policy("precise_shares", "picker", "ours: precise, with tenant cache shares (premium protected)",
               kv_events=True, picker_overrides={"tenants": SHARES}),
        Policy("precise_shares_budget", "picker", "ours: precise_shares, batch may use premium's endpoints within "
               "1,536 uncached tokens in flight", kv_events=True, picker_overrides={"tenants": SHARES_BUDGET}),
        Policy("precise_x2", "picker", "ours: two precise replicas sharing a Redis (valkey) index",
               kv_events=True, replicas=2, redis=True),
        Policy("precise_authz", "picker", "ours: precise, asked over ext_authz (one HTTP round trip)",
               kv_events=True, transport="ext_authz"),
        Policy("sglang_cache_aware", "sglang", "sglang-router cache_aware", peer_policy="cache_aware"),
        Policy("sglang_round_robin", "sglang", "sglang-router round_robin", peer_policy="round_robin"),
        Policy("sglang_power_of_two", "sglang", "sglang-router power_of_two", peer_policy="power_of_two"),
        Policy("vllm_cache_aware", "vllm", "vllm-router cache_aware", peer_policy="cache_aware"),
        Policy("vllm_kv_aware", "vllm", "vllm-router kv_aware, fed by the backends' KV events",
               peer_policy="kv_aware"),
        Policy("vllm_consistent_hash", "vllm", "vllm-router consistent_hash", peer_policy="consistent_hash"),
    )
}  # fmt: skip

OURS = tuple(n for n, p in POLICIES.items() if p.ours)
CONTENDERS = ("round_robin", "least_request", "load", "approximate", "precise", "precise_x2", "sglang_cache_aware",
              "vllm_cache_aware", "vllm_kv_aware")  # fmt: skip
"""``--policies auto``: every policy on ``tenants`` (the headline); on the other workloads the baselines, ours and
each peer's cache-aware policies (the peers' round_robin / power_of_two / consistent_hash only there)."""
CPU_CONTENDERS = ("round_robin", "approximate", "precise", "sglang_cache_aware", "vllm_cache_aware", "vllm_kv_aware")
"""``--policies auto`` with ``--engine vllm-cpu``, on every workload: two CPU engines are slow, so round robin, our
approximate and precise pickers and each peer's cache-aware policy."""
PEERS = tuple(n for n, p in POLICIES.items() if p.peer)
BASELINES = ("round_robin", "least_request")
