"""``extproc envoy-config``: render the Envoy bootstrap for given endpoints and ports.

Kept apart from ``extproc/cli.py`` so that the CLI only wires it in; heavy imports happen in ``run``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from extproc.envoy.options import EnvoyOptions

HEADER = "# Rendered by `extproc envoy-config`; regenerate it rather than edit it (see envoy/README.md).\n"
_BODY_MODES = ("buffered", "full_duplex_streamed")
_CLUSTER_MODES = ("override_host", "original_dst")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``envoy-config`` subcommand on ``sub``."""
    p = sub.add_parser("envoy-config", help="render the Envoy bootstrap (YAML) for our picker")
    p.add_argument("--endpoints", default="", help="model servers, comma-separated ip:port")
    p.add_argument("--picker", default="127.0.0.1:9002", help="the picker, host:port (gRPC, or its authz port)")
    p.add_argument(
        "--transport",
        choices=("ext_proc", "ext_authz"),
        default="ext_proc",
        help="how Envoy asks the picker: ext_proc (gRPC) or ext_authz (HTTP: its listen.authz_port)",
    )
    p.add_argument("--listen", default="127.0.0.1:10000", help="listener ip:port")
    p.add_argument("--admin-port", type=int, default=9901, help="admin port (binds the listener's IP)")
    p.add_argument("--body-mode", choices=_BODY_MODES, default="buffered")
    p.add_argument("--cluster", choices=_CLUSTER_MODES, default="override_host")
    p.add_argument("--original-dst-source", choices=("metadata", "header"), default="metadata")
    p.add_argument("--fail-closed", action="store_true", help="reject requests when the picker fails")
    p.add_argument("--message-timeout-s", type=float, default=2.0)
    p.add_argument("--body-limit-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--num-retries", type=int, default=2)
    p.add_argument("--access-log", default="/dev/stdout", help="access log path; '' disables it")
    p.add_argument("--subset-hint", default=None, help="static GIE subset hint, comma-separated ip:port")
    p.add_argument("--send-response-headers", action="store_true", help="picker sees the served endpoint")
    p.add_argument("--bypass-prefix", action="append", default=[], help="path prefix routed without ext_proc")
    p.add_argument(
        "--strip-tenant-header",
        default=None,
        metavar="HEADER",
        help="remove this client-sent tenant header before ext_proc (the picker's tenants.header)",
    )
    p.add_argument("--tenant", default=None, help="with --strip-tenant-header: set it to this tenant on every request")
    p.add_argument("-o", "--output", default=None, help="write here instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the YAML, or write it to ``-o``. Bad input raises ``ValueError`` (exit 2); nothing is written."""
    from extproc.envoy.bootstrap import render_bootstrap, to_yaml

    text = HEADER + to_yaml(render_bootstrap(options_from_args(args)))
    if args.output is None:
        sys.stdout.write(text)
    else:
        _write_atomically(Path(args.output), text)
    return 0


def options_from_args(args: argparse.Namespace) -> EnvoyOptions:
    """Build ``EnvoyOptions``; a validation error becomes one readable ``ValueError`` per bad field."""
    from pydantic import ValidationError

    from extproc.envoy.options import EnvoyOptions, split_host_port

    listen_host, listen_port = split_host_port(args.listen)
    picker_host, picker_port = split_host_port(args.picker)
    try:
        return EnvoyOptions(
            endpoints=_csv(args.endpoints),
            listen_host=listen_host,
            listen_port=listen_port,
            admin_host=listen_host,
            admin_port=args.admin_port,
            picker_host=picker_host,
            picker_port=picker_port,
            transport=args.transport,
            body_mode=args.body_mode,
            cluster_mode=args.cluster,
            original_dst_source=args.original_dst_source,
            failure_mode_allow=not args.fail_closed,
            message_timeout_s=args.message_timeout_s,
            body_limit_bytes=args.body_limit_bytes,
            num_retries=args.num_retries,
            access_log_path=args.access_log,
            subset_hint=None if args.subset_hint is None else _csv(args.subset_hint),
            send_response_headers=args.send_response_headers,
            picker_bypass_prefixes=tuple(args.bypass_prefix),
            tenant_header=args.strip_tenant_header,
            tenant=args.tenant,
        )
    except ValidationError as exc:
        raise ValueError("invalid envoy options: " + _summary(exc)) from None


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "options"
        parts.append(f"{field}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
