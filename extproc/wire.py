"""Every name the picker shares with Envoy and the gateways on the wire: headers, metadata keys, health names.

The one home of these names. The names follow the Gateway API Inference Extension endpoint-picker protocol
(GIE, protocol v1.0.0), so that any conformant gateway can call us, and our own Envoy config
(``override_host``) reads the same keys. Dependency-free on purpose: the ext_proc adapter (``protocol/``),
the Envoy renderer (``envoy/``, which must not import the gRPC stack), the router and the tests all import it.
"""

from __future__ import annotations

from typing import Final

DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
"""Request header (and ``envoy.lb`` metadata key): ``ip:port[,ip:port...]``, the pick, then fallbacks."""

LB_NAMESPACE: Final = "envoy.lb"
"""Dynamic-metadata namespace override_host reads; Envoy must list it in ``receiving_namespaces``."""

DESTINATION_METADATA_KEY: Final = DESTINATION_HEADER
"""Key in ``LB_NAMESPACE`` under which the picker writes its pick (GIE uses the header's name)."""

SERVED_METADATA_KEY: Final = "x-gateway-destination-endpoint-served"
"""``envoy.lb`` key on the response path: the endpoint Envoy actually used (override_host's ``selected_host_key``)."""

SUBSET_HINT_NAMESPACE: Final = "envoy.lb.subset_hint"
"""Request-metadata namespace a gateway uses to restrict the picker to a subset of endpoints."""

SUBSET_HINT_KEY: Final = "x-gateway-destination-endpoint-subset"
"""Key in ``SUBSET_HINT_NAMESPACE``: a list of ``ip:port`` strings, or one comma-separated string."""

PREFILLER_HEADER: Final = "x-prefiller-host-port"
"""Request header (llm-d's P/D convention): ``ip:port`` of the prefill pod; the decode pod's sidecar runs the
prefill leg there first. Absent: the decode pod runs the request locally."""

LEGACY_PREFILLER_HEADER: Final = "x-prefiller-url"
"""The older spelling of ``PREFILLER_HEADER`` that llm-d's sidecar still reads when the new one is absent. The
picker never sets it; it (and Envoy's strip filter) removes a client-sent one."""

ROLE_LABEL: Final = "llm-d.ai/role"
"""Kubernetes pod label llm-d uses for an endpoint's P/D role (``prefill``, ``decode``, ``prefill-decode``)."""

REQUEST_ID_HEADER: Final = "x-request-id"
"""The request id Envoy sets; the picker's decision log line carries it."""

TENANT_HEADER: Final = "x-gateway-inference-fairness-id"
"""GIE's fairness header: its value names the request's tenant (the default of ``tenants.header``)."""

REASON_HEADER: Final = "x-router-reason"
"""Request header the picker adds upstream: why it picked (``cache``, ``load``, ``spill``, ...); logged only."""

CACHED_TOKENS_HEADER: Final = "x-router-cached-tokens"
"""Request header the picker adds upstream: the prompt tokens it expects cached on the pick; logged only."""

PROMPT_TOKENS_HEADER: Final = "x-router-prompt-tokens"
"""Request header the picker adds upstream: the prompt's token count as the picker tokenized it; logged only."""

HEALTH_LIVENESS: Final = "liveness"
"""gRPC health service name: SERVING while the process runs."""

HEALTH_READINESS: Final = "readiness"
"""gRPC health service name Envoy checks: NOT_SERVING until the first scrape round, and while stopping."""
