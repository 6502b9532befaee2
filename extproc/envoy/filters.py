"""The HTTP filter chain: strip → (subset hint) → ext_proc → router, plus the access log.

Order matters: the strip filter must run before ext_proc so that a client-sent destination header never
reaches the load balancer (with ORIGINAL_DST it would be an SSRF hole; with override_host it would let a
client pick its backend when the picker is down).
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLog
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation as HeaderEdit
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HttpUri,
)
from envoy_data_plane.envoy.config.core.v3 import HeaderValueOptionHeaderAppendAction as Append
from envoy_data_plane.envoy.config.core.v3 import SubstitutionFormatString as Format
from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
from envoy_data_plane.envoy.extensions.filters.http.ext_authz.v3 import (
    AuthorizationResponse,
    BufferSettings,
    ExtAuthz,
    HttpService,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    ProcessingMode,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    MetadataOptionsMetadataNamespaces as Namespaces,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ProcessingModeBodySendMode as Body
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ProcessingModeHeaderSendMode as Send
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import HeaderMutation, Mutations
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.http.set_metadata.v3 import Config as SetMetadata
from envoy_data_plane.envoy.extensions.filters.http.set_metadata.v3 import Metadata
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import HttpFilter
from envoy_data_plane.envoy.type.matcher.v3 import ListStringMatcher, StringMatcher
from envoy_data_plane.google.protobuf import Struct

from extproc import wire
from extproc.envoy import keys
from extproc.envoy.options import BodyMode, EnvoyOptions, Transport
from extproc.envoy.typed import pack, seconds

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
STRIP_FILTER = "envoy.filters.http.header_mutation"
SUBSET_FILTER = "envoy.filters.http.set_metadata"
ROUTER_FILTER = "envoy.filters.http.router"

ACCESS_LOG_FORMAT = (
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %UPSTREAM_HOST% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT%"
    " dest=%REQ(X-GATEWAY-DESTINATION-ENDPOINT)% reason=%REQ(X-ROUTER-REASON)%"
    " cached=%REQ(X-ROUTER-CACHED-TOKENS)% dur_ms=%DURATION% path=%REQ(:PATH)%\n"
)
"""One line per request; ``tests/support/envoy.py`` parses it. Unset values render as ``-``."""

SUMMARY_PREFIX = "x-router-"  # the decision's summary headers (wire.REASON_HEADER, ...), passed upstream by ext_authz

# Envoy does not apply grpc_service.timeout as a deadline on the ext_proc stream (the probe saw an 8 s SSE
# response under a 5 s timeout go through uncut); message_timeout is what bounds a slow picker.
_GRPC_TIMEOUT_S = 5.0


def http_filters(opts: EnvoyOptions) -> list[HttpFilter]:
    """The filter chain in order; the router is always last."""
    chain = [HttpFilter(name=STRIP_FILTER, typed_config=pack(_strip_destination(opts)))]
    if opts.subset_hint is not None:
        chain.append(HttpFilter(name=SUBSET_FILTER, typed_config=pack(_subset_hint(opts.subset_hint))))
    if opts.transport is Transport.EXT_AUTHZ:
        chain.append(HttpFilter(name=EXT_AUTHZ_FILTER, typed_config=pack(ext_authorizer(opts))))
    else:
        chain.append(HttpFilter(name=EXT_PROC_FILTER, typed_config=pack(ext_processor(opts))))
    chain.append(HttpFilter(name=ROUTER_FILTER, typed_config=pack(Router())))
    return chain


def picker_filter(opts: EnvoyOptions) -> str:
    """The name of the filter that asks the picker (what a bypass route disables)."""
    return EXT_AUTHZ_FILTER if opts.transport is Transport.EXT_AUTHZ else EXT_PROC_FILTER


def _strip_destination(opts: EnvoyOptions) -> HeaderMutation:
    """Remove any client-sent destination or prefill-pod header before ext_proc runs: only the picker may set
    them. With ``tenant_header``, the client's tenant header goes too (and ``tenant``, if given, is set in its
    place), so a client cannot claim another tenant's class (docs/tenants.md)."""
    # the P/D sidecar's prefill-pod headers too: with the picker failing open nothing else would remove them
    picks = (wire.DESTINATION_HEADER, wire.PREFILLER_HEADER, wire.LEGACY_PREFILLER_HEADER)
    edits = [HeaderEdit(remove=header) for header in picks]
    if opts.tenant_header:
        edits.append(HeaderEdit(remove=opts.tenant_header))
        if opts.tenant:
            value = HeaderValue(key=opts.tenant_header, value=opts.tenant)
            edits.append(
                HeaderEdit(append=HeaderValueOption(header=value, append_action=Append.OVERWRITE_IF_EXISTS_OR_ADD))
            )
    return HeaderMutation(mutations=Mutations(request_mutations=edits))


def _subset_hint(subset: tuple[str, ...]) -> SetMetadata:
    """A fixed GIE subset hint, as a gateway would set it: ``envoy.lb.subset_hint`` → key → [ip:port]."""
    value = Struct.from_dict({wire.SUBSET_HINT_KEY: list(subset)})
    return SetMetadata(metadata=[Metadata(metadata_namespace=wire.SUBSET_HINT_NAMESPACE, value=value)])


def ext_processor(opts: EnvoyOptions) -> ExternalProcessor:
    """The ext_proc filter: one pick per request, written to the header and ``envoy.lb`` metadata."""
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=keys.PICKER_CLUSTER),
            timeout=seconds(_GRPC_TIMEOUT_S),
        ),
        failure_mode_allow=opts.failure_mode_allow,
        processing_mode=processing_mode(opts),
        message_timeout=seconds(opts.message_timeout_s),
        allow_mode_override=True,  # the picker may answer request_headers with body mode NONE (GETs)
        metadata_options=MetadataOptions(
            # Without receiving_namespaces Envoy silently drops the picker's envoy.lb metadata.
            receiving_namespaces=Namespaces(untyped=[wire.LB_NAMESPACE]),
            forwarding_namespaces=Namespaces(untyped=_forwarded(opts)),
        ),
    )


def ext_authorizer(opts: EnvoyOptions) -> ExtAuthz:
    """The ext_authz filter: the picker gets the method, path, body and the headers it reads; Envoy adds the
    pick and the summary headers of a 200 upstream, and returns any other answer (an OpenAI error) to the client."""
    reads = [wire.REQUEST_ID_HEADER, "content-type", wire.TENANT_HEADER]
    if opts.tenant_header and opts.tenant_header not in reads:
        reads.append(opts.tenant_header)
    service = HttpService(
        server_uri=HttpUri(
            uri=f"http://{opts.picker_host}:{opts.picker_port}",
            cluster=keys.PICKER_CLUSTER,
            timeout=seconds(opts.message_timeout_s),
        ),
        authorization_response=AuthorizationResponse(
            allowed_upstream_headers=ListStringMatcher(
                patterns=[
                    *_exactly([wire.DESTINATION_HEADER, wire.PREFILLER_HEADER]).patterns,
                    StringMatcher(prefix=SUMMARY_PREFIX),
                ]
            ),
            allowed_client_headers=_exactly(["content-type"]),
        ),
    )
    return ExtAuthz(
        http_service=service,
        allowed_headers=_exactly(reads),  # the filter's own field (AuthorizationRequest's is deprecated)
        with_request_body=BufferSettings(max_request_bytes=opts.body_limit_bytes, allow_partial_message=False),
        failure_mode_allow=opts.failure_mode_allow,
    )


def _exactly(names: list[str]) -> ListStringMatcher:
    return ListStringMatcher(patterns=[StringMatcher(exact=name) for name in names])


def _forwarded(opts: EnvoyOptions) -> list[str]:
    """Metadata namespaces sent to the picker: the subset hint, plus ``envoy.lb`` when the picker is to
    see the served endpoint on the response path (override_host writes it there)."""
    if opts.send_response_headers:
        return [wire.SUBSET_HINT_NAMESPACE, wire.LB_NAMESPACE]
    return [wire.SUBSET_HINT_NAMESPACE]


def processing_mode(opts: EnvoyOptions) -> ProcessingMode:
    """Which messages Envoy sends the picker. Duplex streaming needs trailers SEND or Envoy rejects it."""
    duplex = opts.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    return ProcessingMode(
        request_header_mode=Send.SEND,
        response_header_mode=Send.SEND if opts.send_response_headers else Send.SKIP,
        request_body_mode=Body.FULL_DUPLEX_STREAMED if duplex else Body.BUFFERED,
        response_body_mode=Body.NONE,
        request_trailer_mode=Send.SEND if duplex else Send.SKIP,
        response_trailer_mode=Send.SKIP,
    )


def access_logs(opts: EnvoyOptions) -> list[AccessLog]:
    """The file access log, or none when ``access_log_path`` is empty."""
    if not opts.access_log_path:
        return []
    log = FileAccessLog(
        path=opts.access_log_path,
        log_format=Format(text_format_source=DataSource(inline_string=ACCESS_LOG_FORMAT)),
    )
    return [AccessLog(name="envoy.access_loggers.file", typed_config=pack(log))]
