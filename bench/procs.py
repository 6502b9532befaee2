"""Child processes for the stack launcher: own process group, log file, readiness, bounded stop.

``ManagedProcess`` starts a command with ``start_new_session=True`` (its PID is its process-group id), sends
stdout and stderr to one log file, and stops the whole group it created: SIGTERM, then SIGKILL after a
bound. Nothing here signals anything but the groups it started itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
DUMP_WAIT_S = 5.0  # for a child's stacks to be written (SIGABRT with faulthandler on)
STACKS_CHARS = 20_000  # of the log kept in a start failure's message: room for every thread's stack


class ProcessStartError(RuntimeError):
    """A child exited or did not become ready in time; the message carries the tail of its log."""


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (``/proc/PID/task/*/children``; empty if it has gone)."""
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.extend(int(x) for x in path.read_text().split())
        except (OSError, ValueError):
            continue
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago (held together while choosing)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def consecutive_free_ports(count: int, attempts: int = 50) -> int:
    """A base port such that ``base .. base+count-1`` were all free a moment ago (for ``vllm-sim``'s
    K-servers-per-process rule: server ``i`` binds its KV-event port + ``i``). Raises ``RuntimeError``."""
    for _ in range(attempts):
        base = free_ports(1)[0]
        if base + count > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no run of {count} consecutive free ports after {attempts} attempts")


class ManagedProcess:
    """One child process (and its process group) with its output in ``log_path``.

    ``start(ready)`` spawns it and polls ``ready()`` until it returns true (raises ``ProcessStartError`` if
    the child exits or the timeout passes, after stopping it). ``stop()`` is idempotent.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._cwd = cwd
        self._env = dict(env) if env is not None else None
        # A Python child of ours writes every thread's stack to its log on SIGABRT (faulthandler): what one
        # that never got ready was doing (a simulator once hung 120 s at start-up, unexplained)
        self._python = bool(self.argv) and self.argv[0] == sys.executable
        if self._python:
            self._env = {**(self._env if self._env is not None else os.environ), "PYTHONFAULTHANDLER": "1"}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self, ready: Callable[[], bool], timeout_s: float) -> ManagedProcess:
        """Spawn, then wait until ``ready()``; on failure stop the child and raise ``ProcessStartError``."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self._cwd, env=self._env, start_new_session=True,
            )  # fmt: skip
        try:
            self._wait_ready(ready, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ProcessStartError(f"{self.name} exited with {self._proc.returncode}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(POLL_S)
        self._dump_stacks()
        raise ProcessStartError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail(STACKS_CHARS)}")

    def _dump_stacks(self) -> None:
        """A Python child's thread stacks into its log (it aborts: it is being stopped anyway)."""
        if not self._python or self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            resource.prlimit(self._proc.pid, resource.RLIMIT_CORE, (0, 0))  # no core file where it runs
            os.kill(self._proc.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(DUMP_WAIT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM our process group, SIGKILL it after ``timeout_s``; returns the exit code (None if never
        started)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout=timeout_s)
            # Children the leader left behind in its own group (it exited just now, so the id is still ours).
            self._signal_group(signal.SIGKILL)
        return proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    # -- the log ----------------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, max_chars: int = 4000) -> str:
        return self.log_text()[-max_chars:] or f"(no output in {self.log_path})"

    def log_matches(self, pattern: str) -> list[re.Match[str]]:
        """Every match of ``pattern`` (multiline) in the log so far."""
        return list(re.finditer(pattern, self.log_text(), re.MULTILINE))
