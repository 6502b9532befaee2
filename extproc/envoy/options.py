"""``EnvoyOptions``: what a rendered Envoy bootstrap may vary, typed and validated once.

Everything not here is fixed on purpose (see ``envoy/README.md`` for why each fixed value was chosen).
"""

from __future__ import annotations

import enum
import ipaddress

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MIB = 1024 * 1024


class BodyMode(enum.StrEnum):
    """How ext_proc sends the request body to the picker."""

    BUFFERED = "buffered"  # one body message; the route's body limit applies
    FULL_DUPLEX_STREAMED = "full_duplex_streamed"  # GIE gateways' mode; picker must echo the body back


class Transport(enum.StrEnum):
    """How Envoy asks the picker (``extproc.authz`` says why there are two)."""

    EXT_PROC = "ext_proc"  # gRPC ext_proc: what gateways (GIE) speak; metadata, subset hints, response path
    EXT_AUTHZ = "ext_authz"  # HTTP ext_authz with the body: a quarter of ext_proc's added latency, header only


class ClusterMode(enum.StrEnum):
    """How the model-server cluster turns the pick into an upstream host."""

    OVERRIDE_HOST = "override_host"  # known endpoint list; fallback list, retries, round-robin fail-open
    ORIGINAL_DST = "original_dst"  # any ip:port; one host, no fallback, fail-open becomes 503


class OriginalDstSource(enum.StrEnum):
    """Where an ORIGINAL_DST cluster reads the destination from."""

    METADATA = "metadata"  # envoy.lb metadata: only ext_proc can write it, so a client can never set it
    HEADER = "header"  # the request header: safe only because the strip filter runs first


def split_host_port(value: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[addr]:port``); raises ``ValueError`` naming the value."""
    host, sep, port = value.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port with port 1-65535, got {value!r}")
    return host, int(port)


def check_ip_port(value: str) -> str:
    """Return ``value`` if it is ``ip:port`` with an IP literal; raises ``ValueError`` otherwise."""
    host, _ = split_host_port(value)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"expected an IP literal in {value!r} (model servers are addressed by ip:port)") from None
    return value.strip()


class EnvoyOptions(BaseModel):
    """The knobs of ``render_bootstrap``. Frozen; invalid values raise ``pydantic.ValidationError``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: tuple[str, ...] = Field(description="model servers as ip:port (the `picked` cluster)")
    listen_host: str = Field("127.0.0.1", description="IP the HTTP listener binds")
    listen_port: int = Field(10000, ge=1, le=65535, description="port clients send OpenAI requests to")
    admin_host: str = Field("127.0.0.1", description="IP the admin interface binds")
    admin_port: int = Field(9901, ge=1, le=65535, description="admin port (/ready, /stats)")
    picker_host: str = Field("127.0.0.1", description="the ext_proc picker: IP literal or DNS name")
    picker_port: int = Field(
        9002, ge=1, le=65535, description="the picker's gRPC port (with transport ext_authz: its listen.authz_port)"
    )
    transport: Transport = Field(Transport.EXT_PROC, description="ext_proc (gRPC) or ext_authz (HTTP) to the picker")
    body_mode: BodyMode = Field(BodyMode.BUFFERED, description="ext_proc request body mode")
    cluster_mode: ClusterMode = Field(ClusterMode.OVERRIDE_HOST, description="how the pick selects a host")
    original_dst_source: OriginalDstSource = Field(
        OriginalDstSource.METADATA, description="ORIGINAL_DST only: read the pick from metadata or header"
    )
    failure_mode_allow: bool = Field(True, description="fail open: route without a pick if the picker fails")
    message_timeout_s: float = Field(2.0, gt=0, le=3600, description="ext_proc per-message timeout")
    body_limit_bytes: int = Field(32 * MIB, ge=1024, description="route request_body_buffer_limit")
    num_retries: int = Field(2, ge=0, le=10, description="route retries on connect failure / refused stream")
    access_log_path: str = Field("/dev/stdout", description="file access log; '' disables it")
    subset_hint: tuple[str, ...] | None = Field(
        None, description="static GIE subset hint set before ext_proc (tests of the subset path); None = off"
    )
    send_response_headers: bool = Field(
        False, description="ext_proc response_header_mode SEND, so the picker sees the served endpoint"
    )
    picker_bypass_prefixes: tuple[str, ...] = Field(
        (), description="path prefixes routed without ext_proc (health checks, /metrics); round-robin"
    )
    tenant_header: str | None = Field(
        None,
        description="strip this client-sent header before ext_proc (the picker's tenants.header), so that only "
        "Envoy names the tenant (tenant below, or a JWT claim: docs/tenants.md); None: the client's value passes",
    )
    tenant: str | None = Field(
        None, description="with tenant_header: every request on this listener is this tenant (the header is set)"
    )

    @field_validator("endpoints", "subset_hint")
    @classmethod
    def _ip_ports(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(check_ip_port(v) for v in value)

    @field_validator("listen_host", "admin_host")
    @classmethod
    def _ip(cls, value: str) -> str:
        ipaddress.ip_address(value)
        return value

    @field_validator("picker_bypass_prefixes")
    @classmethod
    def _prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not p.startswith("/") or p == "/" for p in value):
            raise ValueError(f"bypass prefixes must start with '/' and not be '/' alone, got {value!r}")
        return value

    @model_validator(mode="after")
    def _needs_endpoints(self) -> EnvoyOptions:
        if self.cluster_mode is ClusterMode.OVERRIDE_HOST and not self.endpoints:
            raise ValueError("override_host needs at least one endpoint")
        if self.cluster_mode is ClusterMode.ORIGINAL_DST and self.picker_bypass_prefixes:
            raise ValueError("bypass routes need override_host (ORIGINAL_DST has no host without a pick)")
        if len(set(self.endpoints)) != len(self.endpoints):
            raise ValueError(f"duplicate endpoints in {self.endpoints!r}")
        if self.transport is Transport.EXT_AUTHZ:
            self._check_authz()
        return self

    def _check_authz(self) -> None:
        """ext_authz answers with upstream headers only: no body modes, no metadata, no response path."""
        if self.body_mode is not BodyMode.BUFFERED:
            raise ValueError("transport ext_authz buffers the body itself: body_mode must be buffered")
        if self.cluster_mode is ClusterMode.ORIGINAL_DST and self.original_dst_source is OriginalDstSource.METADATA:
            raise ValueError("transport ext_authz cannot write envoy.lb metadata: use original_dst_source header")
        if self.send_response_headers or self.subset_hint is not None:
            raise ValueError("transport ext_authz sees neither the response path nor a subset hint: use ext_proc")

    @property
    def listen_url(self) -> str:
        """``http://host:port`` of the listener."""
        return f"http://{self.listen_host}:{self.listen_port}"
