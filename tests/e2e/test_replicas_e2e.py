"""Two picker replicas sharing Redis (precise index + in-flight load) behind one real Envoy, four simulators
publishing KV events. What the clients see: precise routing, and a burst spread as evenly as one replica does."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.stack import UPSTREAM_HOST_HEADER, Stack, StackSpec
from bench.stack_config import MODEL
from tests.support.golden import golden_case
from tests.support.stacks import shared_index

pytestmark = [pytest.mark.envoy, pytest.mark.redis, pytest.mark.slow]


def spec(pickers: int, redis_url: str | None, namespace: str) -> StackSpec:
    return StackSpec(
        backends=4,
        pickers=pickers,
        kv_events=True,
        sim_profile="h100-llama3-8b",
        picker_overrides={"index": shared_index(redis_url, namespace)} if redis_url else {},
    )


async def post(session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> tuple[str, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        data = await resp.json(content_type=None)
        assert resp.status == 200, data
        details = data["usage"].get("prompt_tokens_details") or {}
        return resp.headers[UPSTREAM_HOST_HEADER], int(details.get("cached_tokens") or 0)


async def counters(metrics_url: str, prefix: str) -> dict[str, float]:
    """The ``prefix``-named counters a picker exports, by the rest of their name."""
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix) and "_created" not in line:
            name, value = line.split()[:2]
            out[name[len(prefix) :].removesuffix("_total")] = float(value)
    return out


async def touches_settled(metrics_urls: list[str]) -> list[dict[str, float]]:
    """Each replica's ``router_kv_touches_*`` once each has heard every touch, prediction and due call the other
    published (bounded: the last read is returned after ~10 s either way)."""
    for _ in range(200):
        x, y = [await counters(url, "router_kv_touches_") for url in metrics_urls]
        if all(
            a.get(f"{kind}heard") == b.get(f"{kind}published")
            for a, b in ((x, y), (y, x))
            for kind in ("", "predictions_", "due_calls_")
        ):
            break
        await asyncio.sleep(0.05)
    return [x, y]


async def burst(url: str, n: int = 64) -> collections.Counter[str]:
    """``n`` simultaneous requests, each with its own ~1K-token prompt (nothing shared)."""
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(
                post(session, url, [{"role": "user", "content": f"user {i}: " + f"topic {i} detail " * 250}])
                for i in range(n)
            )
        )
    return collections.Counter(host for host, _ in results)


async def test_two_replicas_route_precisely_and_spread_a_burst_like_one(tmp_path: Path, valkey_url: str) -> None:
    with Stack(spec(2, valkey_url, "two"), tmp_path / "two") as stack:
        summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
        async with aiohttp.ClientSession() as session:
            first, _ = await post(session, stack.url, summary["messages"])
            time.sleep(1.0)  # BlockStored reaches both replicas through Redis (slack for a busy CI box)
            hosts = [await post(session, stack.url, conclusion["messages"]) for _ in range(4)]
        # Envoy spreads these over both replicas: each must know where the document is.
        assert all(host == first and cached >= len(conclusion["token_ids"]) - 48 for host, cached in hosts), (
            first,
            hosts,
        )
        # The engines' events keep every endpoint clean, so the replicas' Redis lookups bisect, not walk.
        lookups = [await counters(url, "router_kv_redis_lookups_") for url in stack.picker_metrics_urls]
        assert sum(c.get("bisected", 0) for c in lookups) >= 4 and all(c.get("walked", 0) == 0 for c in lookups), (
            lookups
        )
        two = await burst(stack.url)
        # Every request of the burst went through the atomic pick-and-reserve, or failed open (its shared read
        # past the lookup deadline), counted either way.
        outcomes = [await counters(url, "router_shared_reservations_") for url in stack.picker_metrics_urls]
        failed = [await counters(url, "router_index_failures_") for url in stack.picker_metrics_urls]
        settled = sum(v for c in outcomes for v in c.values())
        settled += sum(v for c in failed for k, v in c.items() if "shared_load" in k)
        # Each replica's hot sets count the other's requests too (``redis.touches``): what one published, the
        # other heard (the stream is read in the background, so wait for the last ones)
        touches = await touches_settled(stack.picker_metrics_urls)
    with Stack(spec(1, None, "one"), tmp_path / "one") as stack:
        one = await burst(stack.url)
    assert sum(two.values()) == sum(one.values()) == 64
    assert settled >= 64, (outcomes, failed)
    x, y = touches
    assert (x["heard"], y["heard"]) == (y["published"], x["published"]) and min(x["published"], y["published"]), touches
    # ... and each one's calibration pairs the engines' first tokens with the other's predictions too
    assert (x["predictions_heard"], y["predictions_heard"]) == (y["predictions_published"], x["predictions_published"])
    assert min(x["predictions_published"], y["predictions_published"]) > 0, touches
    # ... and, once a replica measured a chain (the document's questions extend its summary's prompt), the calls it
    # routes: each one's due calls know where the other's requests went
    assert (x["due_calls_heard"], y["due_calls_heard"]) == (y["due_calls_published"], x["due_calls_published"])
    assert min(x["due_calls_published"], y["due_calls_published"]) > 0, touches
    assert len(two) == 4, f"two replicas left a backend idle: {two}"
    # Before the atomic reservation, replicas read each other's reservations late: a burst leaned 21/15/14/14.
    assert max(two.values()) <= max(one.values()) + 1, f"two replicas {two} vs one {one}, reservations {outcomes}"
