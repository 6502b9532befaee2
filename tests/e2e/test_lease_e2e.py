"""Event-stream leases through the whole stack: two picker processes sharing Redis behind one real Envoy, four
simulators publishing KV events. Picker 0 comes up first and holds every stream's lease; SIGKILL it under
load and picker 1 takes every lease within 3 s, resumes each stream from the stored position, and keeps
routing precisely: a document that reached a backend only after the kill (sent to it directly, so no picker
guessed where it went: only the KV events tell) draws its follow-ups there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.stack import UPSTREAM_HOST_HEADER, Stack, StackSpec
from bench.stack_config import MODEL
from tests.support import polling
from tests.support.stacks import shared_index

# Real time: two pickers hold 2-3 s leases renewed on the wall clock, and a renewal that a loaded 2-core CPU
# delays past its ttl moves a lease (its counts no longer match the script) or stretches a timed failover.
pytestmark = [
    pytest.mark.envoy,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.realtime(race="a lease renewal delayed past its ttl by a loaded CPU moves the lease or slows failover"),
]

BACKENDS = 4
DOC_WORDS = 350  # ~1K tokens: a prefix worth following


def metric(url: str, name: str) -> float:
    """One unlabelled sample from a picker's /metrics (0 when absent)."""
    with urllib.request.urlopen(url, timeout=2.0) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def until(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    """``tests.support.polling.until`` for conditions that scrape /metrics (blocking: run in a thread)."""
    return await polling.until(cond, timeout_s, what, poll_s=0.05, in_thread=True)


def document(name: str) -> str:
    return f"Document {name}. " + " ".join(f"{name}-fact-{i}" for i in range(DOC_WORDS))


async def post(session: aiohttp.ClientSession, base: str, doc: str, question: str) -> tuple[str, int]:
    """One chat request (the document, then a question); returns (backend, cached prompt tokens)."""
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"{doc}\n\nQ: {question}"}]}
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        data = await resp.json(content_type=None)
        assert resp.status == 200, data
        details = data["usage"].get("prompt_tokens_details") or {}
        return resp.headers.get(UPSTREAM_HOST_HEADER, ""), int(details.get("cached_tokens") or 0)


class Probes:
    """Each probe: a fresh document posted straight to a target backend (behind the pickers' backs: only its
    KV events, applied to Redis by the lease holder, say where it is), then one follow-up through Envoy."""

    def __init__(self, stack: Stack, session: aiohttp.ClientSession, redis_url: str, namespace: str) -> None:
        self.stack, self.session = stack, session
        self.redis_url, self.namespace = redis_url, namespace
        self.sent = 0  # requests through Envoy so far (its access-log lines)
        self.n = 0

    def applied_seq(self, target: str) -> int:
        """The last batch of ``target``'s KV events that a lease holder applied to Redis (its stream position)."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            seq = client.hget(f"{{{self.namespace}}}:stream:{target}", "seq")
        finally:
            client.close()
        return -1 if seq is None else int(seq)

    async def applied_since(self, target: str, before: int) -> None:
        """Wait (bounded) until a holder applied a newer batch of ``target``'s events and no more came for 0.5 s:
        the document's blocks are in Redis. Read from Redis, not a fixed sleep, so a slow box waits as needed."""
        await until(lambda: self.applied_seq(target) > before, 15.0, "the probe's KV events applied")
        last, start = self.applied_seq(target), time.monotonic()
        quiet_since = start
        while time.monotonic() - quiet_since < 0.5 and time.monotonic() - start < 5.0:
            await asyncio.sleep(0.05)
            now = await asyncio.to_thread(self.applied_seq, target)
            if now != last:
                last, quiet_since = now, time.monotonic()

    async def run(self, picked_wanted: int, attempts: int = 24) -> list[tuple[str, str, int]]:
        """Probes over the backends in turn until ``picked_wanted`` follow-ups were picked (a follow-up whose
        ext_proc stream met the dead picker is served by Envoy's fail-open round robin instead: not counted).
        Returns (target, host, cached) of each picked one."""
        picked: list[tuple[str, str, int]] = []
        for _ in range(attempts):
            target = self.stack.backends[self.n % BACKENDS]
            doc = document(f"probe{self.n}")
            self.n += 1
            before = await asyncio.to_thread(self.applied_seq, target)
            await post(self.session, f"http://{target}", doc, "summary?")
            await self.applied_since(target, before)  # its BlockStored: engine -> the holder's subscriber -> Redis
            host, cached = await post(self.session, self.stack.url, doc, "and the follow-up?")
            self.sent += 1
            if self.stack.envoys["picker"].wait_for_access_log(self.sent)[self.sent - 1].reason:
                picked.append((target, host, cached))
                if len(picked) == picked_wanted:
                    break
        return picked


@contextlib.asynccontextmanager
async def load(url: str) -> Any:
    """Two workers sending small distinct requests until the block exits; yields the list of statuses."""
    statuses: list[int] = []
    stop = asyncio.Event()

    async def worker(w: int) -> None:
        async with aiohttp.ClientSession() as session:
            for i in range(10_000):
                if stop.is_set():
                    return
                body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": f"w{w} {i}"}]}
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    statuses.append(resp.status)

    tasks = [asyncio.create_task(worker(w)) for w in range(2)]
    try:
        yield statuses
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)


def two_pickers(valkey_url: str, namespace: str) -> StackSpec:
    index = shared_index(valkey_url, namespace)  # this test is about which replica writes what
    return StackSpec(
        backends=BACKENDS, pickers=2, kv_events=True, sim_profile="fast", picker_overrides={"index": index}
    )


async def picker0_holds_every_lease(m0: str, m1: str) -> None:
    """Picker 0 came up first: it holds every stream's lease; picker 1 follows every stream, holds none."""
    await until(lambda: metric(m0, "router_kv_lease_acquired_total") == BACKENDS
                and metric(m1, "router_precise_endpoints") == BACKENDS, 20.0, "picker 0 holds every lease")  # fmt: skip
    assert metric(m1, "router_kv_lease_acquired_total") == 0


async def test_killing_the_lease_holder_fails_over_and_routing_stays_precise(tmp_path: Path, valkey_url: str) -> None:
    with Stack(two_pickers(valkey_url, "lease-e2e-kill"), tmp_path) as stack:
        m0, m1 = stack.picker_metrics_urls
        await picker0_holds_every_lease(m0, m1)
        async with aiohttp.ClientSession() as session:
            probes = Probes(stack, session, valkey_url, "lease-e2e-kill")
            picks = await probes.run(BACKENDS)  # before: picker 0 writes every stream
            assert len(picks) == BACKENDS and all(t == h and c >= 512 for t, h, c in picks), picks

            async with load(stack.url) as statuses:
                await asyncio.sleep(1.0)
                picker0 = stack.pickers[0]
                assert picker0.pid is not None
                os.killpg(picker0.pid, signal.SIGKILL)  # our own child's process group
                killed = time.monotonic()
                await until(lambda: metric(m1, "router_kv_stream_takeovers_total") == BACKENDS, 10.0, "failover")
                took = time.monotonic() - killed
                await asyncio.sleep(0.5)
            probes.sent += len(statuses)
            assert statuses and all(s == 200 for s in statuses), statuses
            print(f"failover: picker 1 resumed all {BACKENDS} streams {took:.2f}s after picker 0 was killed")
            # The goal is 3 s (measured 1.7-2.1 s on an idle machine, printed above); a shared 2-core CI box under
            # this test's own load gets slack, so a slow scheduler does not fail a correct failover.
            assert took < 6.0
            assert metric(m1, "router_kv_lease_acquired_total") == BACKENDS
            assert metric(m1, "router_kv_stream_resumes_total") == BACKENDS  # each from picker 0's position
            assert metric(m1, "router_kv_stream_resume_failures_total") == 0
            assert metric(m1, "router_kv_lease_fenced_writes_total") == 0

            picks = await probes.run(BACKENDS)  # after: only picker 1's writes can say where each document is
            assert len(picks) == BACKENDS and all(t == h and c >= 512 for t, h, c in picks), picks
            assert metric(m1, "router_precise_endpoints") == BACKENDS


async def test_a_paused_lease_holder_is_deposed_and_stays_out(tmp_path: Path, valkey_url: str) -> None:
    """SIGSTOP past the lease ttl (a GC pause, a frozen VM): picker 1 takes over; once picker 0 runs again it
    finds its leases gone, writes nothing, and does not get them back."""
    with Stack(two_pickers(valkey_url, "lease-e2e-pause"), tmp_path) as stack:
        m0, m1 = stack.picker_metrics_urls
        await picker0_holds_every_lease(m0, m1)
        async with aiohttp.ClientSession() as session:
            probes = Probes(stack, session, valkey_url, "lease-e2e-pause")
            picks = await probes.run(BACKENDS)
            assert len(picks) == BACKENDS and all(t == h for t, h, _ in picks), picks
            picker0 = stack.pickers[0]
            assert picker0.pid is not None
            os.killpg(picker0.pid, signal.SIGSTOP)  # no requests meanwhile: a frozen picker holds them
            try:
                await until(lambda: metric(m1, "router_kv_stream_takeovers_total") == BACKENDS, 10.0, "takeover")
            finally:
                os.killpg(picker0.pid, signal.SIGCONT)
            await until(lambda: metric(m0, "router_kv_lease_lost_total") == BACKENDS, 10.0, "picker 0 notices")
            skipped = metric(m0, "router_kv_lease_skipped_writes_total")
            picks = await probes.run(BACKENDS)  # both pickers up again; only picker 1 writes
            assert len(picks) == BACKENDS and all(t == h and c >= 512 for t, h, c in picks), picks
            assert metric(m0, "router_kv_lease_skipped_writes_total") > skipped  # it saw the events, wrote none
            assert metric(m0, "router_kv_lease_acquired_total") == BACKENDS  # never got them back
            assert metric(m1, "router_kv_lease_lost_total") == 0
            assert metric(m1, "router_kv_stream_resumes_total") == BACKENDS


def _held(redis_url: str, namespace: str, endpoint: str) -> int:
    """How many blocks the shared precise index says ``endpoint`` holds."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.hlen(f"{{{namespace}}}:h:{endpoint}"))
    finally:
        client.close()


RESTART_TTL_S = 3.0  # the lease ttl here: the backend stays down longer, so its lease holder lets go


async def test_a_backend_down_longer_than_the_lease_ttl_comes_back_without_phantom_cache(
    tmp_path: Path, valkey_url: str
) -> None:
    """RELIABILITY F4 with replicas: a backend down past the lease ttl loses its lease holder (nobody hears it);
    when it comes back on its port, each replica reconnects and purges, but neither holds the lease yet, so
    neither purge reached the shared index. The requests sent at once (right after ``/health``, and again once
    both replicas have bootstrapped the new engine) must not be predicted on the old engine's blocks."""
    namespace = "lease-e2e-restart"
    index = shared_index(valkey_url, namespace, leases={"enabled": True, "ttl_s": RESTART_TTL_S})
    spec = StackSpec(
        backends=2, backends_per_sim=1, pickers=2, kv_events=True, sim_profile="fast", picker_overrides={"index": index}
    )
    with Stack(spec, tmp_path) as stack:
        m0, m1 = stack.picker_metrics_urls
        await until(lambda: all(metric(m, "router_precise_endpoints") == 2 for m in (m0, m1)), 30.0,
                    "both replicas precise on both backends")  # fmt: skip
        target = stack.backends[0]
        docs = [f"restart{i}: " + document(f"restart{i}") for i in range(8)]  # 4 per round below
        async with aiohttp.ClientSession() as session:
            probes = Probes(stack, session, valkey_url, namespace)
            for doc in docs:  # straight to the backend: only its KV events (applied by picker 0) say where
                before = await asyncio.to_thread(probes.applied_seq, target)
                await post(session, f"http://{target}", doc, "summary?")
                await probes.applied_since(target, before)
            assert _held(valkey_url, namespace, target) > 0

            bootstraps = [metric(m, "router_kv_stream_bootstraps_total") for m in (m0, m1)]

            def let_go() -> float:  # leases given up (deaf for a ttl) or lost (not renewed), both replicas
                names = ("router_kv_lease_released_total", "router_kv_lease_lost_total")
                return sum(metric(m, name) for m in (m0, m1) for name in names)

            before = let_go()
            stack.stop_backend(target)
            await until(lambda: let_go() > before, 20.0, "the deaf stream's holder lets its lease go")
            await asyncio.to_thread(stack.start_backend, target)  # same port and event endpoints

            # Each document goes through Envoy once: a second time, our record of the first would rightly
            # predict the cache that the first left where it was served.
            async def through_envoy(round_docs: list[str]) -> None:
                await asyncio.gather(*(post(session, stack.url, doc, "again?") for doc in round_docs))
                probes.sent += len(round_docs)

            await through_envoy(docs[:4])  # right after /health
            await until(lambda: all(metric(m, "router_kv_stream_bootstraps_total") > b
                                    for m, b in zip((m0, m1), bootstraps, strict=True)), 10.0,
                        "both replicas reconnected and bootstrapped the new engine")  # fmt: skip
            await through_envoy(docs[4:])  # and once both replicas hear the new engine
            entries = stack.envoys["picker"].wait_for_access_log(probes.sent)[-len(docs) :]
        predicted = [(e.reason, e.cached) for e in entries if e.reason]
        assert predicted, entries  # some were picked (not all met a dead picker: none is killed here)
        assert all(cached in ("", "0") for _, cached in predicted), f"phantom cache after the restart: {predicted}"
