"""Every wire name and number the ext_proc adapter speaks, in one place.

The names follow the Gateway API Inference Extension endpoint-picker protocol (GIE, protocol v1.0.0), so
that any conformant gateway can call us and our own Envoy config (``override_host``) reads the same keys.
"""

from __future__ import annotations

from typing import Final

SERVICE_NAME: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
"""Full gRPC service name; also one of the gRPC health service names gateways probe."""

HEALTH_LIVENESS: Final = "liveness"
HEALTH_READINESS: Final = "readiness"

DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
"""Request header (and ``envoy.lb`` metadata key): ``ip:port[,ip:port...]``, the pick, then fallbacks."""

LB_NAMESPACE: Final = "envoy.lb"
"""Dynamic-metadata namespace override_host reads; Envoy must list it in ``receiving_namespaces``."""

DESTINATION_METADATA_KEY: Final = DESTINATION_HEADER
SERVED_METADATA_KEY: Final = "x-gateway-destination-endpoint-served"
"""``envoy.lb`` key on the response path: the endpoint Envoy actually used (``selected_host_key``)."""

SUBSET_HINT_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_HINT_KEY: Final = "x-gateway-destination-endpoint-subset"
"""The gateway's eligible endpoints: a list of ``ip:port`` strings, or one comma-separated string."""

REQUEST_ID_HEADER: Final = "x-request-id"

STREAMED_CHUNK_BYTES: Final = 62_000
"""FULL_DUPLEX_STREAMED body echo chunk size: Envoy recommends <= 64 KiB per message; GIE uses 62,000."""

DEFAULT_MAX_BODY_BYTES: Final = 32 << 20
DEFAULT_MAX_RECEIVE_BYTES: Final = 64 << 20
"""grpcio rejects messages over 4 MiB by default; a BUFFERED body arrives as one message."""

JSON_CONTENT_TYPE: Final = "application/json"
