"""The real-Envoy harness itself: lifecycle, start failures, stats and access-log parsing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.envoy import (
    AccessLogEntry,
    EnvoyProcess,
    EnvoyStartError,
    options_for_test,
    parse_access_log_line,
)

ENDPOINT = "127.0.0.1:1"  # never contacted in these tests


@pytest.mark.envoy
def test_context_manager_starts_ready_and_stops_its_own_pid(tmp_path: Path) -> None:
    with EnvoyProcess(options_for_test([ENDPOINT], workdir=tmp_path), tmp_path) as envoy:
        assert envoy.running and envoy.pid is not None
        stats = envoy.stats()
        assert stats["cluster.picked.membership_total"] == 1
        assert envoy.counter("cluster.picked.upstream_rq_retry") == 0
        assert envoy.counter("no.such.stat") == 0
    assert not envoy.running
    assert envoy.stop() == 0  # idempotent; SIGTERM is a clean exit for Envoy


@pytest.mark.envoy
def test_start_failure_raises_with_the_log_and_leaves_nothing_running(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        opts = options_for_test([ENDPOINT], workdir=tmp_path, listen_port=taken.getsockname()[1])
        envoy = EnvoyProcess(opts, tmp_path, ready_timeout_s=10)
        with pytest.raises(EnvoyStartError, match="ddress already in use"):
            envoy.start()
    assert not envoy.running


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "200 - 127.0.0.1:8001 attempts=1 dest=127.0.0.1:8001 reason=cache cached=96 dur_ms=12 path=/v1/x",
            AccessLogEntry(200, "", "127.0.0.1:8001", 1, "127.0.0.1:8001", "cache", "96", 12, "/v1/x"),
        ),
        (
            "503 URX,UF 127.0.0.1:8009 attempts=3 dest=- reason=- cached=- dur_ms=4 path=/v1/chat",
            AccessLogEntry(503, "URX,UF", "127.0.0.1:8009", 3, "", "", "", 4, "/v1/chat"),
        ),
        (
            "413 - - attempts=0 dest=- reason=- cached=- dur_ms=0 path=/",
            AccessLogEntry(413, "", "", 0, "", "", "", 0, "/"),
        ),
    ],
    ids=["picked", "retries-exhausted", "rejected-before-upstream"],
)
def test_access_log_line_parsing(line: str, expected: AccessLogEntry) -> None:
    assert parse_access_log_line(line) == expected
