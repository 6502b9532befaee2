"""``python -m bench.demo`` end to end (real Envoy, the picker, simulated backends), in a small configuration.

The facts checked are the backends' own: which backend served (Envoy's upstream-host header) and the
``cached_tokens`` each reported. The demo runs as a child process, as a user would run it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from bench.stack_config import REPO

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

BLOCK = 16
_ROW = re.compile(
    r"^\s*(\d+)\s+(\w+)\s+(.+?)\s+(\d+)\s+(\S+/\S+)\s+(b\d+)\s+(\d+)\s+([\d.]+)\s+(b\d+)\s+(\d+)\s+([\d.]+)\s*$"
)


@dataclass(frozen=True)
class Side:
    backend: str
    cached: int
    ttft_ms: float


@dataclass(frozen=True)
class Row:
    user: str
    what: str
    tokens: int
    picker_says: str  # reason/predicted cached tokens, from Envoy's access log
    picker: Side
    round_robin: Side


def parse_rows(stdout: str) -> list[Row]:
    rows = []
    for line in stdout.splitlines():
        m = _ROW.match(line)
        if m:
            g = m.groups()
            rows.append(Row(g[1], g[2], int(g[3]), g[4], Side(g[5], int(g[6]), float(g[7])),
                            Side(g[8], int(g[9]), float(g[10]))))  # fmt: skip
    return rows


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module", params=[(), ("--kv-events",)], ids=["routing-history", "kv-events"])
def demo_output(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    workdir = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-m", "bench.demo", "--backends", "2", "--requests", "6",
           "--profile", "fast", "--workdir", str(workdir), *request.param]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_one_line_per_request_with_both_sides_and_a_summary(demo_output: str) -> None:
    rows = parse_rows(demo_output)
    assert [r.user for r in rows] == ["alice", "bob", "alice", "carol", "alice", "bob"], demo_output
    assert all(2000 <= r.tokens <= 4000 for r in rows if r.user == "alice")
    assert re.search(r"through the picker\s+mean TTFT\s+[\d.]+ ms\s+cached tokens\s+\d+", demo_output)
    assert re.search(r"Envoy round robin\s+mean TTFT\s+[\d.]+ ms\s+cached tokens\s+\d+", demo_output)


def test_the_second_question_about_the_document_hits_the_first_backends_cache(demo_output: str) -> None:
    summary, conclusion = parse_rows(demo_output)[0], parse_rows(demo_output)[2]
    assert conclusion.what == "report: conclusion"
    assert conclusion.picker.backend == summary.picker.backend
    # Everything but the last partial block and the question differs from nothing: nearly the whole prompt.
    assert conclusion.picker.cached >= conclusion.tokens - 3 * BLOCK, conclusion
    # The picker chose it for its cache and predicted exactly what the backend then reported.
    assert conclusion.picker_says == f"cache/{conclusion.picker.cached}", conclusion


def test_the_leading_space_variant_has_only_the_system_prompt_block_cached(demo_output: str) -> None:
    spaced = parse_rows(demo_output)[4]
    assert spaced.what == "report: edits (leading space)"
    assert spaced.picker.cached <= BLOCK
    assert spaced.round_robin.cached <= BLOCK


def test_every_process_is_stopped(demo_output: str) -> None:
    m = re.search(r"^(\d+) processes stopped \(pids ([\d ]+)\)", demo_output, re.MULTILINE)
    assert m, demo_output
    pids = [int(p) for p in m.group(2).split()]
    assert len(pids) == int(m.group(1)) == 4  # one vllm-sim (2 servers), one picker, two Envoys
    assert not [pid for pid in pids if _alive(pid)]


def test_with_kv_events_the_picker_follows_every_backend_and_without_none(demo_output: str) -> None:
    followed = re.search(r"the picker follows the KV events of (\d+) of 2 backends", demo_output)
    if "fed by KV events" in demo_output:
        assert followed and followed.group(1) == "2", demo_output
    else:
        assert followed is None
