"""``bench.picker_scaling``'s pieces: reading wrk's report, and the canned backends a real picker accepts."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from bench.canned_backends import CannedBackends, bootstrap
from bench.envoy_proc import validate
from bench.picker_scaling import body_files, parse_wrk
from bench.stack_config import MODEL
from extproc.backends.vllm_metrics import parse_metrics
from extproc.envoy_config import to_yaml

WRK = """Running 5s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    51.20ms   20.10ms 200.00ms   70.00%
  Latency Distribution
     50%   50.63ms
     75%   60.00ms
     90%   80.00ms
     99%  124.40ms
  2930 requests in 5.00s, 1.20MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 4
Requests/sec:    586.00
Transfer/sec:    240.00KB
"""


def test_wrk_report_is_read_with_its_errors() -> None:
    assert parse_wrk(WRK) == (586.0, 50.63, 124.40, 2930, 7)
    assert parse_wrk(WRK.replace("124.40ms", "1.20s"))[2] == 1200.0


def test_the_body_splits_around_the_question(tmp_path: Path) -> None:
    head, tail = body_files(tmp_path, 1024)
    body = json.loads(head.read_text() + "7" + tail.read_text())
    assert body["model"] == MODEL and body["messages"][-1]["content"].endswith(
        "Question 7: what changed in the last item?"
    )


def test_the_canned_bootstrap_is_valid_envoy(tmp_path: Path) -> None:
    path = tmp_path / "canned.yaml"
    path.write_text(to_yaml(bootstrap([10001, 10002], 10003, MODEL, 16)))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.envoy
def test_canned_backends_answer_as_an_idle_vllm(tmp_path: Path) -> None:
    with CannedBackends(2, tmp_path, model=MODEL, block_size=16) as canned:
        base = f"http://{canned.addresses[1]}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            metrics = parse_metrics(resp.read().decode())
        assert (metrics.running, metrics.waiting, metrics.block_size, metrics.models) == (0, 0, 16, {MODEL})
        with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == MODEL
        req = urllib.request.Request(f"{base}/v1/chat/completions", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.loads(resp.read())["choices"][0]["message"]["content"] == "ok"
