"""One front worker process: the router's front half behind its own gRPC server, deciding through the main
process (``RemoteDecider``).

Started by ``FrontPool`` as ``python -m extproc.workers.front --config-json FILE --base-dir DIR --socket PATH
--index I --host H --port P``; it binds the same port as its siblings (gRPC sets SO_REUSEPORT, so the kernel
spreads Envoy's connections over them), loads its tokenizers, says ``ready``, sends its metrics every second,
and exits when told (SIGTERM) or when the decider's socket closes (the main process has gone).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from extproc import process
from extproc.backends.registry import EndpointRegistry
from extproc.config import RouterConfig
from extproc.front_build import build_front, processor_options, router_settings, warm_up
from extproc.observability import RouterMetrics
from extproc.protocol.server import start_ext_proc
from extproc.resolvers import SchemeResolver
from extproc.router import Router
from extproc.tasks import stop_task
from extproc.types import HashScheme
from extproc.workers import frames
from extproc.workers.remote import RemoteDecider

log = logging.getLogger(__name__)

STATS_EVERY_S = 1.0


class FrontSchemes:
    """The front's hash scheme per base model: the configured one (vLLM's defaults where unset), until the
    decider, which also sees what the engines report, says otherwise (``learn``)."""

    def __init__(self, configured: Callable[[str], HashScheme]) -> None:
        self._configured = configured
        self._learned: dict[str, HashScheme] = {}

    def __call__(self, base_model: str) -> HashScheme:
        return self._learned.get(base_model) or self._configured(base_model)

    def learn(self, base_model: str, scheme: HashScheme) -> None:
        self._learned[base_model] = scheme


async def serve_front(config: RouterConfig, base_dir: Path, socket_path: str, index: int, host: str, port: int) -> None:
    """Run one front until SIGTERM/SIGINT or until the decider goes away."""
    metrics = RouterMetrics(CollectorRegistry())
    schemes = FrontSchemes(SchemeResolver({m.name: m for m in config.models}, EndpointRegistry([])))
    parts = build_front(config, base_dir, metrics, schemes)
    remote = await RemoteDecider.connect(
        socket_path,
        timeout_s=config.limits.answer_budget_s,
        on_scheme=schemes.learn,
        on_unavailable=metrics.decider_unavailable.inc,
    )
    router = Router(parts.deps, remote, router_settings(config))
    await warm_up(parts, [m.name for m in config.models])
    process.freeze_startup_heap()
    server = await start_ext_proc(
        router, kind=config.listen.grpc_server, host=host, port=port, options=processor_options(config)
    )
    remote.send(("ready", index))
    stats = asyncio.create_task(_send_stats(remote, index, metrics.registry), name="front-stats")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(remote.closed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if remote.closed.is_set() and not stop.is_set():
        log.warning("front %d: the decider's socket closed; exiting", index)
    await server.stop(grace_s=1.0)
    for task in (*waits, stats):
        await stop_task(task)
    await remote.close()
    parts.shutdown()


async def _send_stats(remote: RemoteDecider, index: int, registry: CollectorRegistry) -> None:
    while True:
        remote.send(("stats", index, frames.metric_rows([registry])))
        await asyncio.sleep(STATS_EVERY_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m extproc.workers.front", description=__doc__.split("\n")[0])
    p.add_argument("--config-json", required=True, type=Path, help="the validated RouterConfig, as JSON")
    p.add_argument("--base-dir", required=True, type=Path, help="relative config paths resolve here")
    p.add_argument("--socket", required=True, help="the decider's Unix socket")
    p.add_argument("--index", required=True, type=int, help="this front's number (logs, metrics)")
    p.add_argument("--host", required=True)
    p.add_argument("--port", required=True, type=int)
    args = p.parse_args(argv)
    config = RouterConfig.model_validate_json(args.config_json.read_text())
    logging.basicConfig(
        level=config.logging.level, format=f"%(asctime)s %(levelname)s front{args.index} %(name)s %(message)s"
    )
    process.configure(config)  # as the main process (cli serve)
    asyncio.run(serve_front(config, args.base_dir, args.socket, args.index, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
