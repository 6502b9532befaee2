"""The ext_proc adapter's own numbers and names (the names shared with Envoy live in ``extproc/wire.py``)."""

from __future__ import annotations

from typing import Final

from extproc import wire

SERVICE_NAME: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
"""Full gRPC service name; also one of the gRPC health service names gateways probe."""

ALWAYS_SERVING: Final = ("", wire.HEALTH_LIVENESS, SERVICE_NAME)
"""gRPC health services that answer SERVING while the server runs (``readiness`` follows the app)."""

STREAMED_CHUNK_BYTES: Final = 62_000
"""FULL_DUPLEX_STREAMED body echo chunk size: Envoy recommends <= 64 KiB per message; GIE uses 62,000."""

DEFAULT_MAX_BODY_BYTES: Final = 32 << 20
DEFAULT_MAX_RECEIVE_BYTES: Final = 64 << 20
"""grpcio rejects messages over 4 MiB by default; a BUFFERED body arrives as one message."""

JSON_CONTENT_TYPE: Final = "application/json"
