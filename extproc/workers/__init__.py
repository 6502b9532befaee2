"""Front worker processes: use more than one core for the per-request work, with one decider.

With ``workers.fronts: N`` (N > 0) the main process serves no gRPC itself. It runs the decider (indexes,
events, scraping, load, the profile, the decision line) and N front processes that each serve ext_proc on the
same port, parse, render, tokenize and hash, and send an ``Ask`` over a local Unix socket. Every decision is
made by the one decider, in arrival order, on one copy of the state, so N fronts pick exactly as one process
would; only the work before the decision is spread. ``FrontWorkers`` is what the composition root starts.

Which front serves a stream is the kernel's choice per connection (SO_REUSEPORT): Envoy spreads streams over
several connections only when it opens several (its workers, or ``max_concurrent_streams`` on the picker
cluster: our bootstrap sets it, see ``extproc.envoy.clusters``).
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry

from extproc.config import RouterConfig
from extproc.decider import Decider
from extproc.workers.decider_server import DeciderServer
from extproc.workers.metrics import MergedMetrics
from extproc.workers.pool import FrontPool

__all__ = ["FrontWorkers"]


class FrontWorkers:
    """The decider's socket, the reserved gRPC port and the pool; ``metrics`` is the merged ``/metrics``."""

    def __init__(self, config: RouterConfig, base_dir: Path, decider: Decider, registry: CollectorRegistry) -> None:
        self._config = config
        self._base_dir = base_dir.resolve()
        self.metrics = MergedMetrics(registry)
        self._dir = Path(tempfile.mkdtemp(prefix="extproc-fronts-"))  # mode 0700: only this user
        self._socket = str(self._dir / "decider.sock")
        self._config_path = self._dir / "config.json"
        self._reserved: socket.socket | None = None
        self.port = 0
        self.pool = FrontPool(config.workers.fronts, self._argv, start_timeout_s=config.workers.start_timeout_s)
        self._server = DeciderServer(decider, self.metrics, self.pool.ready)

    async def start(self) -> None:
        """Reserve the port, serve the decider, start the fronts and wait until each is ready.
        Raises ``RuntimeError`` if a front does not come up (the others are stopped)."""
        listen = self._config.listen
        self._reserved = _reserve(listen.host, listen.grpc_port)
        self.port = int(self._reserved.getsockname()[1])
        self._config_path.write_text(self._config.model_dump_json())
        await self._server.start(self._socket)
        await self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()
        await self._server.stop()
        if self._reserved is not None:
            self._reserved.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _argv(self, index: int) -> list[str]:
        return [
            sys.executable, "-m", "extproc.workers.front", "--config-json", str(self._config_path),
            "--base-dir", str(self._base_dir), "--socket", self._socket, "--index", str(index),
            "--host", self._config.listen.host, "--port", str(self.port),
        ]  # fmt: skip


def _reserve(host: str, port: int) -> socket.socket:
    """A bound, never-listening socket with SO_REUSEPORT on ``host:port`` (0: a free port): it fixes the port
    the fronts share (gRPC binds with SO_REUSEPORT too) and receives no connections itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
