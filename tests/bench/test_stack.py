"""The stack launcher end to end: two vllm-sim processes with KV events, a picker, all three Envoy kinds;
each Envoy names the backend that served; stop leaves nothing running."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from bench.stack import UPSTREAM_HOST_HEADER, Stack, StackSpec
from bench.stack_config import MODEL

pytestmark = [pytest.mark.envoy, pytest.mark.slow]


def _chat(base_url: str, text: str) -> tuple[str, dict]:  # type: ignore[type-arg]
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers.get(UPSTREAM_HOST_HEADER, ""), json.loads(resp.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _precise_endpoints(metrics_url: str, timeout_s: float = 10.0) -> float:
    """``router_precise_endpoints`` once it stops growing toward the backend count (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    value = 0.0
    while time.monotonic() < deadline:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        value = next((float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("router_precise_endpoints ")), 0.0)  # fmt: skip
        if value >= 3:
            break
        time.sleep(0.2)
    return value


def test_stack_with_every_envoy_kind_and_kv_events(tmp_path: Path) -> None:
    spec = StackSpec(backends=3, backends_per_sim=2, envoy="picker", extra_envoys=("round_robin", "least_request"),
                     sim_profile="fast", kv_events=True)  # fmt: skip
    with Stack(spec, tmp_path) as stack:
        assert len(stack.backends) == len(set(stack.backends)) == 3
        assert len(stack.sims) == 2  # 2 + 1 servers
        config = yaml.safe_load((tmp_path / "picker0.yaml").read_text())
        assert [e["kv_events"] for e in config["endpoints"]] == [stack.kv_events[b] for b in stack.backends]
        served = {kind: {_chat(stack.url_for(kind), f"hello {i} " * 40)[0] for i in range(6)}
                  for kind in ("picker", "round_robin", "least_request")}  # fmt: skip
        assert served["round_robin"] == set(stack.backends)  # 6 requests over 3 backends, in turn
        assert all(hosts <= set(stack.backends) for hosts in served.values())
        with urllib.request.urlopen(stack.picker_metrics_url, timeout=5) as resp:
            assert b"router_pick_phase_seconds" in resp.read()
        assert _precise_endpoints(stack.picker_metrics_url) == 3  # every backend's KV events reach the picker
        clears = stack.picker_clears()
        stack.reset_prefix_caches()  # returns once the picker applied every backend's AllBlocksCleared
        assert stack.picker_clears()[0] >= clears[0] + 3
        pids = stack.processes()
        assert len(pids) == 2 + 1 + 3
    assert not stack.running
    assert not [pid for pid in pids if _alive(pid)]
