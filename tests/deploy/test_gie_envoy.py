"""The picker as a GIE endpoint picker, behind real Envoy wired the two ways GIE gateways wire one.

- **Istio**: override_host on the pool's endpoint cluster, FULL_DUPLEX_STREAMED, the served endpoint reported
  back on the response headers (``envoy.lb`` / ``x-gateway-destination-endpoint-served``). The pick is an
  ordered fallback list that Envoy's retries walk.
- **Envoy AI Gateway**: ORIGINAL_DST reading the ``x-gateway-destination-endpoint`` header, FULL_DUPLEX_STREAMED,
  fail-closed. ORIGINAL_DST takes exactly one ``ip:port`` (a list is 503 UH, and a retry goes back to the same
  host), so the picker runs with ``scheduling.fallbacks: 0`` and the fallback is the picker's own: a backend
  whose scrapes are refused is dropped from the candidates.

Both run the picker with ``protocol.close_after_pick: false`` (the GIE deployment config in ``deploy/``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from grpc_health.v1 import health_pb2

from bench.stack import Stack
from tests.support.chat import cached, chat
from tests.support.golden import golden_case
from tests.support.stacks import GieStackFactory, picker_grpc_port, picker_health, picker_metric

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

GIE_PICKER: dict[str, Any] = {"protocol": {"close_after_pick": False}}
ISTIO: dict[str, Any] = {
    "body_mode": "full_duplex_streamed",
    "cluster_mode": "override_host",
    "send_response_headers": True,
    "failure_mode_allow": False,
    "message_timeout_s": 30,
}
AI_GATEWAY: dict[str, Any] = {
    "body_mode": "full_duplex_streamed",
    "cluster_mode": "original_dst",
    "original_dst_source": "header",
    "send_response_headers": True,
    "failure_mode_allow": False,
    "message_timeout_s": 30,
}
SERVING = health_pb2.HealthCheckResponse.SERVING


async def document_questions_follow_the_cache(stack: Stack) -> str:
    """The golden document questions: the second lands where the first ran and finds the document cached.
    Returns the backend that served both."""
    summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        s1, first = await chat(session, url, summary["messages"])
        s2, second = await chat(session, url, conclusion["messages"])
    assert (s1, s2) == (200, 200), (first, second)
    log = stack.envoy.wait_for_access_log(2)
    assert log[1].upstream == log[0].upstream, "the second question must land on the first's backend"
    assert cached(first) == 0
    assert cached(second) >= len(conclusion["token_ids"]) - 3 * 16, "the whole document must be cached"
    assert [e.reason for e in log] == ["load", "cache"]
    return log[0].upstream


async def test_istio_wiring_follows_the_cache_learns_the_served_endpoint_and_honours_the_subset(
    gie_stack: GieStackFactory,
) -> None:
    stack = gie_stack(ISTIO, GIE_PICKER)
    for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        assert picker_health(stack, service) == SERVING, service
    # the images' health check (Docker HEALTHCHECK, compose healthcheck), run as a script the way they run it
    script = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "healthcheck.py"
    for service, code in (("readiness", 0), ("liveness", 0), ("no-such-service", 1)):
        probe = subprocess.run(
            [sys.executable, str(script), f"127.0.0.1:{picker_grpc_port(stack)}", service],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert probe.returncode == code, (service, probe.stderr)
    await document_questions_follow_the_cache(stack)
    log = stack.envoy.wait_for_access_log(2)
    assert all("," in e.dest for e in log), "the pick is an ordered fallback list"
    assert picker_metric(stack, "router_served_total", outcome="picked") == 2, "served endpoint reported back"

    only = stack.backends[1]
    hinted = stack.add_envoy(**ISTIO, subset_hint=(only,))
    async with aiohttp.ClientSession() as session:
        results = [
            await chat(
                session, hinted.url("/v1/chat/completions"), [{"role": "user", "content": f"Subset question {i}"}]
            )
            for i in range(4)
        ]
    assert [s for s, _ in results] == [200] * 4
    assert {e.upstream for e in hinted.wait_for_access_log(4)} == {only}
    assert {e.dest for e in hinted.wait_for_access_log(4)} == {only}, "only the hinted endpoint is offered"


async def test_istio_wiring_walks_the_fallback_list_past_a_dead_pick(gie_stack: GieStackFactory) -> None:
    stack = gie_stack(ISTIO, GIE_PICKER, dead=1)
    async with aiohttp.ClientSession() as session:
        results = [
            await chat(
                session, stack.envoy.url("/v1/chat/completions"), [{"role": "user", "content": f"Question {i} " * 50}]
            )
            for i in range(9)
        ]
    assert [s for s, _ in results] == [200] * 9
    log = stack.envoy.wait_for_access_log(9)
    retried = [e for e in log if e.dest.split(",")[0] in stack.dead]
    assert retried, "the picker should have picked the dead endpoint at least once"
    assert all(e.attempts == 2 and e.upstream in stack.backends for e in retried)
    assert picker_metric(stack, "router_served_total", outcome="fallback") == len(retried)
    assert picker_metric(stack, "router_served_total", outcome="picked") == 9 - len(retried)


async def test_ai_gateway_wiring_follows_the_cache_and_fails_over_when_a_backend_dies(
    gie_stack: GieStackFactory,
) -> None:
    stack = gie_stack(AI_GATEWAY, {**GIE_PICKER, "scheduling": {"fallbacks": 0}})
    served = await document_questions_follow_the_cache(stack)
    log = stack.envoy.wait_for_access_log(2)
    assert [e.dest for e in log] == [served, served], "ORIGINAL_DST gets exactly one ip:port"

    survivor = next(e for e in stack.backends if e != served)
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:  # a client-sent destination is stripped before ext_proc
        status, _ = await chat(
            session,
            url,
            golden_case("doc_conclusion")["messages"],
            headers={"x-gateway-destination-endpoint": survivor},
        )
    assert status == 200 and stack.envoy.wait_for_access_log(3)[2].upstream == served

    stack.backend_process(served).stop()
    deadline = time.monotonic() + 10
    while picker_metric(stack, "router_endpoint_healthy", endpoint=served) != 0:
        assert time.monotonic() < deadline, "the picker never noticed the dead backend"
        await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as session:
        results = [await chat(session, url, golden_case("doc_conclusion")["messages"]) for _ in range(3)]
    assert [s for s, _ in results] == [200] * 3
    assert {e.upstream for e in stack.envoy.wait_for_access_log(6)[3:]} == {survivor}
