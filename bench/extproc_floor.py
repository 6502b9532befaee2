"""The floor under the picker's added latency: what Envoy's ext_proc round trips cost before any decision.

    python -m bench.extproc_floor            # 400 requests per side, one at a time, ~1K-token chat prompts
    python -m bench.extproc_floor --quick --prompt-tokens 100000    # the exchange of an agent-sized body
    python -m bench.extproc_floor --quick    # 100 per side

One stack on canned backends (``bench/canned_backends.py``: an Envoy answers, nothing tokenizes) and five
Envoys in front of the same backends; requests go one at a time, interleaved over the sides (the order turns
each round), each side on its own keep-alive connection:

- ``round_robin``: no ext_proc at all (the baseline every ``added`` is measured against);
- ``bare``: ext_proc (the picker Envoy's own filter config: BUFFERED, override_host) to the least a grpc.aio
  servicer can do in that exchange: an empty headers reply, then a body reply built once at start;
- ``null``: ext_proc to our servicer (``extproc.protocol``: ``Exchange``, inbound, outbound) on grpc.aio with a
  handler that returns a fixed ``Route``: the adapter's cost without a decision; ``null-h2``: the same on our
  own gRPC stack (``extproc.protocol.h2_server``);
- ``picker``: the real picker (parse, render, tokenize, hash, look up, score, reserve), on its default stack
  (h2); ``picker-grpcio``: a second picker from the same config on grpc.aio;
- ``authz``: another transport for the same answer, measured for comparison: the picker Envoy with its
  ext_proc filter replaced by ext_authz over HTTP/1.1 (body included), to a bare asyncio server whose
  answer's ``x-gateway-destination-endpoint`` Envoy adds upstream (override_host reads that header too);
- ``picker-authz``: a second picker, built from the stack picker's own config, answering over that transport
  (``extproc.authz``): the real decision without the grpc.aio exchange.

Per side: latency p50/p90 (send to full response), added p50 over round robin, and the processor's CPU per
request net of what it spends idle (measured before the rounds), and the share of answers served by the
endpoint the processors name (a pick Envoy did not apply would show there). ``bare`` is the floor for any Python
grpc.aio ext_proc server on this box: a goal below it needs another transport, not a faster picker.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.envoy_proc import EnvoyProcess, start_on_free_ports
from bench.picker_latency import FILLER_ITEM_TOKENS, filler, messages, pct
from bench.procs import ManagedProcess, free_ports
from bench.stack import Stack, StackSpec
from bench.stack_config import MODEL, UPSTREAM_HOST_HEADER, envoy_bootstrap
from bench.suite.measure import thread_cpu_s as cpu_s
from extproc.envoy.filters import EXT_PROC_FILTER
from extproc.envoy_config import EnvoyOptions
from extproc.wire import DESTINATION_HEADER as DESTINATION

PROCESSORS = ("bare", "null", "null-h2", "picker-grpcio", "authz", "picker-authz")  # the sides this module serves
DOC_ITEMS = 64  # filler items: a ~1K-token chat prompt with the system prompt
READY_TIMEOUT_S = 30.0
IDLE_S = 3.0
WARM_UP = 10  # requests per side before the measured ones


# -- the two processors (run as ``--serve KIND``) ----------------------------------------------------------
async def serve(kind: str, port: int, endpoint: str) -> None:
    """Serve ``kind`` on 127.0.0.1:``port``, sending every request to ``endpoint``, until killed."""
    from extproc.protocol.server import start_ext_proc
    from extproc.types import EndpointId, HttpRequest, Route

    route = Route((EndpointId(endpoint),))
    if kind == "authz":
        await _serve_authz(port, endpoint)
    if kind in ("picker-authz", "picker-grpcio"):
        await _serve_picker(kind, port, Path(endpoint))
    if kind in ("null", "null-h2"):

        class FixedRoute:
            async def route(self, request: HttpRequest) -> Route:
                return route

        stack = "h2" if kind == "null-h2" else "grpcio"
        # held: a dropped server is collected and stops
        server = await start_ext_proc(FixedRoute(), kind=stack, port=port)
        print(f"ready {kind} on {server.port}", flush=True)
        await asyncio.Event().wait()
    await _serve_bare(port, route)


async def _serve_bare(port: int, route: object) -> None:
    import grpc

    from extproc.protocol import outbound
    from extproc.protocol.pb import external_processor_pb2 as pb
    from extproc.protocol.pb import external_processor_pb2_grpc as pb_grpc

    common, metadata = outbound.route_mutation(route)  # type: ignore[arg-type]
    headers_reply = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    body_reply = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata)

    class Bare:
        async def Process(
            self, messages: AsyncIterator[pb.ProcessingRequest], context: object
        ) -> AsyncIterator[pb.ProcessingResponse]:
            async for message in messages:
                if message.HasField("request_headers"):
                    yield headers_reply
                else:
                    yield body_reply
                    return

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_ExternalProcessorServicer_to_server(Bare(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"ready bare on {port}", flush=True)
    await asyncio.Event().wait()


class _AuthzProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive: each complete request (headers plus Content-Length bytes) gets ``answer``."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._pending = b""  # bytes of a request not yet complete
        self._write: Callable[[bytes], object] = lambda _: None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._write = cast(asyncio.WriteTransport, transport).write

    def data_received(self, data: bytes) -> None:
        self._pending += data
        while (end := self._pending.find(b"\r\n\r\n")) >= 0:
            head = self._pending[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self._pending) < end + 4 + length:
                return
            self._pending = self._pending[end + 4 + length :]
            self._write(self._answer)


async def _serve_authz(port: int, endpoint: str) -> None:
    from extproc import wire

    answer = f"HTTP/1.1 200 OK\r\n{wire.DESTINATION_HEADER}: {endpoint}\r\ncontent-length: 0\r\n\r\n".encode()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _AuthzProtocol(answer), "127.0.0.1", port)
    print(f"ready authz on {port}", flush=True)
    async with server:
        await asyncio.Event().wait()


async def _serve_picker(kind: str, port: int, config_path: Path) -> None:
    """A second picker from ``config_path`` (no metrics port): ``picker-authz`` answers ext_authz on ``port``
    (its gRPC on any free port), the product's ext_authz path; ``picker-grpcio`` serves ext_proc on ``port`` on
    grpc.aio (``listen.grpc_server: grpcio``), where the stack's own picker has the default, our h2 stack."""
    from extproc.app import App
    from extproc.config import load_config

    config = load_config(config_path)
    if kind == "picker-authz":
        update: dict[str, Any] = {"grpc_port": 0, "metrics_port": None, "authz_port": port}
    else:
        update = {"grpc_port": port, "metrics_port": None, "authz_port": None, "grpc_server": "grpcio"}
    app = App(config.model_copy(update={"listen": config.listen.model_copy(update=update)}))
    await app.start()
    print(f"ready {kind} on {port}", flush=True)
    await asyncio.Event().wait()


def authz_bootstrap(opts: EnvoyOptions, authz_port: int) -> dict[str, Any]:
    """The picker Envoy's bootstrap with ext_authz (HTTP, body included) where its ext_proc filter was."""
    config = envoy_bootstrap("picker", opts, [])
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    authz = {
        "name": "envoy.filters.http.ext_authz",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "http_service": {
                "server_uri": {"uri": f"http://127.0.0.1:{authz_port}", "cluster": "authz", "timeout": "2s"},
                "authorization_response": {"allowed_upstream_headers": {"patterns": [{"exact": DESTINATION}]}},
            },
            "with_request_body": {"max_request_bytes": 32 << 20, "allow_partial_message": False},
            "failure_mode_allow": True,
        },
    }
    hcm["http_filters"] = [authz if f["name"] == EXT_PROC_FILTER else f for f in hcm["http_filters"]]
    endpoint = {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": authz_port}}}}
    config["static_resources"]["clusters"].append({
        "name": "authz", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "authz", "endpoints": [{"lb_endpoints": [endpoint]}]},
    })  # fmt: skip
    return config


def start_authz_envoy(stack: Stack, workdir: Path, authz_port: int) -> EnvoyProcess:
    def make() -> EnvoyProcess:  # fresh free ports on every try
        listen_port, admin_port, unused_port = free_ports(3)
        opts = EnvoyOptions(
            endpoints=tuple(stack.endpoints), listen_port=listen_port, admin_port=admin_port,
            picker_port=unused_port, access_log_path=str(workdir / "access.log"),
        )  # fmt: skip
        return EnvoyProcess(opts, workdir, config=authz_bootstrap(opts, authz_port))

    return start_on_free_ports(make)


# -- the client -------------------------------------------------------------------------------------------
@dataclass
class Side:
    name: str
    url: str
    pids: list[int]
    latencies_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    busy_s: float = 0.0  # wall time inside its requests (to take the idle cost out)
    idle_cpu_per_s: float = 0.0
    errors: int = 0
    to_fixed: int = 0  # answers served by the endpoint the processors name (a pick that was not applied shows)
    envoy: EnvoyProcess | None = None
    routed: float = float("nan")  # share of its Envoy's access-log lines with a destination header (a pick)

    def cpu_ms_per_request(self) -> float:
        n = len(self.latencies_s) + self.errors
        return (self.cpu_s - self.idle_cpu_per_s * self.busy_s) * 1000 / n if n and self.pids else float("nan")


class Connection:
    """One keep-alive HTTP/1.1 connection with Nagle off (a small request must not wait for an ACK)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self._conn.connect()
        assert self._conn.sock is not None
        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, body: bytes) -> tuple[int, str]:
        """The status and the upstream that served it (the stack's Envoys name it in a response header)."""
        self._conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = self._conn.getresponse()
        response.read()
        return response.status, response.getheader(UPSTREAM_HOST_HEADER, "")


def run(sides: list[Side], per_side: int, fixed: str, doc_items: int = DOC_ITEMS) -> None:
    document = filler(doc_items)
    conns = {s.name: Connection(s.url) for s in sides}
    for side in sides:  # warm up: connections, the picker's caches
        for q in range(WARM_UP):
            conns[side.name].post(_body(document, 10**6 + q))
    for side in sides:
        cpu0, t0 = cpu_s(side.pids), time.monotonic()
        time.sleep(IDLE_S / len(sides))
        side.idle_cpu_per_s = (cpu_s(side.pids) - cpu0) / (time.monotonic() - t0)
    for q in range(per_side):
        order = sides if q % 2 == 0 else sides[::-1]
        body = _body(document, q)
        for side in order:
            cpu0, t0 = cpu_s(side.pids), time.perf_counter()
            status, upstream = conns[side.name].post(body)
            took = time.perf_counter() - t0
            side.to_fixed += upstream == fixed
            side.cpu_s += cpu_s(side.pids) - cpu0
            side.busy_s += took
            if status == 200:
                side.latencies_s.append(took)
            else:
                side.errors += 1


def count_routed(sides: list[Side], per_side: int) -> None:
    """Each side's share of requests whose access-log line names a destination (the processor picked)."""
    for side in sides:
        if side.envoy is not None:
            entries = side.envoy.wait_for_access_log(per_side + WARM_UP)
            side.routed = sum(bool(e.dest) for e in entries) / len(entries)


def _body(document: str, question: int) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages(document, question), "max_tokens": 1}).encode()


def print_table(sides: list[Side], prompt_tokens: int = DOC_ITEMS * FILLER_ITEM_TOKENS) -> None:
    base = pct(next(s for s in sides if s.name == "round_robin").latencies_s, 0.5)
    print(f"\nOne request at a time, ~{prompt_tokens}-token chat prompts, canned backends (ms)")
    print(f"{'side':>12} | {'n':>5} | {'p50':>6} {'p90':>6} | {'added p50':>9} | {'CPU ms/req net':>14} | "
          "picked | to the fixed pick | errors")  # fmt: skip
    for s in sides:
        p50, p90 = pct(s.latencies_s, 0.5), pct(s.latencies_s, 0.9)
        cpu = s.cpu_ms_per_request()
        cpu_text = "-" if cpu != cpu else f"{cpu:.2f}"
        print(f"{s.name:>12} | {len(s.latencies_s):>5} | {p50 * 1000:6.2f} {p90 * 1000:6.2f} | "
              f"{(p50 - base) * 1000:9.2f} | {cpu_text:>14} | {s.routed:6.0%} | "
              f"{s.to_fixed / max(len(s.latencies_s), 1):17.0%} | "
              f"{s.errors}")  # fmt: skip


def _says_ready(log: Path) -> Callable[[], bool]:
    return lambda: log.exists() and "ready" in log.read_text()


def start_processors(stack: Stack, workdir: Path, envoys: dict[str, EnvoyProcess]) -> dict[str, ManagedProcess]:
    """Each processor, and the Envoy in front of it (into ``envoys``); the caller stops the authz Envoy."""
    started: dict[str, ManagedProcess] = {}
    for kind, port in zip(PROCESSORS, free_ports(len(PROCESSORS)), strict=True):
        target = str(stack.workdir / "picker0.yaml") if kind.startswith("picker-") else stack.backends[0]
        argv = [sys.executable, "-m", "bench.extproc_floor", "--serve", kind, "--port", str(port),
                "--endpoint", target]  # fmt: skip
        proc = ManagedProcess(kind, argv, workdir / f"{kind}.log")
        proc.start(_says_ready(proc.log_path), READY_TIMEOUT_S)
        started[kind] = proc
        if kind in ("authz", "picker-authz"):
            envoys[kind] = start_authz_envoy(stack, workdir / f"envoy-{kind}", port)
        else:
            envoys[kind] = stack.add_envoy(processors=[("127.0.0.1", port)])
    return started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.extproc_floor", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="100 requests per side instead of 400")
    p.add_argument("--requests", type=int, default=None, help="requests per side")
    p.add_argument("--prompt-tokens", type=int, default=DOC_ITEMS * FILLER_ITEM_TOKENS,
                   help="the document's tokens (default ~1K; 100000: an agent-sized body's exchange)")  # fmt: skip
    p.add_argument("--serve", choices=PROCESSORS, help=argparse.SUPPRESS)  # internal: run one processor
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)  # picker-authz: the picker config's path
    args = p.parse_args(argv)
    if args.serve:
        # every processor keeps its C heap as the picker's process main does (process.configure), so the rows
        # differ in their stacks only (with glibc's defaults a 300 KB body cost null-h2 up to ~0.8 ms more)
        from extproc.config import LimitsConfig
        from extproc.process import keep_heap

        keep_heap(LimitsConfig().malloc_keep_mib << 20)
        asyncio.run(serve(args.serve, args.port, args.endpoint))
        return 0
    per_side = args.requests or (100 if args.quick else 400)
    spec = StackSpec(backends=4, engine="canned", envoy="picker", extra_envoys=("round_robin",))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="extproc-floor-") as tmp, Stack(spec, Path(tmp)) as stack:
        envoys: dict[str, EnvoyProcess] = {}
        processors: dict[str, ManagedProcess] = {}
        try:
            processors = start_processors(stack, Path(tmp), envoys)
            sides = [Side("round_robin", stack.url_for("round_robin"), [], envoy=stack.envoys["round_robin"])]
            sides += [Side(k, envoys[k].url(), [processors[k].pid or 0], envoy=envoys[k])
                      for k in ("bare", "null", "null-h2")]  # fmt: skip
            sides.append(Side("picker", stack.url, stack.picker_pids(), envoy=stack.envoy))
            grpcio = "picker-grpcio"
            sides.append(Side(grpcio, envoys[grpcio].url(), [processors[grpcio].pid or 0], envoy=envoys[grpcio]))
            sides += [Side(k, envoys[k].url(), [processors[k].pid or 0], envoy=envoys[k])
                      for k in ("authz", "picker-authz")]  # fmt: skip
            run(sides, per_side, stack.backends[0], max(args.prompt_tokens // FILLER_ITEM_TOKENS, 1))
            count_routed(sides, per_side)
        finally:
            for kind in ("authz", "picker-authz"):
                if kind in envoys:
                    envoys[kind].stop()  # the others are the stack's
            for proc in processors.values():
                proc.stop()
    print_table(sides, args.prompt_tokens)
    idle = ", ".join(f"{s.name} {s.idle_cpu_per_s * 1000:.1f}" for s in sides if s.pids)
    print(f"\nidle CPU subtracted (ms/s): {idle}; total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
