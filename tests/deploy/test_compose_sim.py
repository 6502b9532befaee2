"""docker-compose.yml's ``sim`` profile, run as the same processes on loopback (no Docker engine here):
Envoy, Redis, two picker replicas and two simulators, each with its compose command, environment and mounted
config. The golden document questions go through Envoy; the second must land where the first ran and find
the document cached, whichever picker replica answers it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from bench.stack_config import MODEL
from tests.deploy.compose_local import load_compose, profile_services, run_profile
from tests.support.golden import golden_case

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.redis]


def test_the_sim_profile_declares_the_whole_stack() -> None:
    services = profile_services(load_compose(), "sim")
    assert sorted(services) == ["envoy", "picker-a", "picker-b", "redis", "sim-0", "sim-1"]
    gpu = profile_services(load_compose(), "gpu")
    assert sorted(gpu) == ["envoy", "picker-a", "picker-b", "redis", "vllm-0", "vllm-1"]


async def test_document_questions_through_the_sim_profile(tmp_path: Path) -> None:
    summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
    with run_profile("sim", tmp_path) as stack:
        assert stack.envoy is not None
        url = stack.envoy.url("/v1/chat/completions")
        answers = []
        async with aiohttp.ClientSession() as session:
            for case in (summary, conclusion):
                body = {"model": MODEL, "messages": case["messages"], "max_tokens": 4}
                async with session.post(url, json=body) as resp:
                    answers.append((resp.status, await resp.json(content_type=None)))
        log = stack.envoy.wait_for_access_log(2)
        decided = {
            name: len(proc.log_matches(r'"reason": "(load|cache)"'))
            for name, proc in stack.procs.items()
            if name.startswith("picker-")
        }
    assert decided == {"picker-a": 1, "picker-b": 1}, f"Envoy spreads ext_proc streams over both replicas: {decided}"
    assert [s for s, _ in answers] == [200, 200], answers
    sims = {stack.local("172.28.0.11:8000"), stack.local("172.28.0.12:8000")}
    assert log[0].upstream in sims
    assert log[1].upstream == log[0].upstream, f"the second question must land on the first's backend: {log}"
    assert log[1].reason == "cache", "whichever replica answered knew the first's cache (shared index)"
    details = answers[1][1]["usage"].get("prompt_tokens_details") or {}
    assert int(details.get("cached_tokens") or 0) >= len(conclusion["token_ids"]) - 3 * 16
