"""``Scraper``: a round reads every endpoint and a slow one holds up none (scripted servers on 127.0.0.1); its
loops per endpoint restart, discover by rounds and end with their endpoint (scrapes recorded, no network)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.types import Endpoint, EndpointId
from tests.support.polling import until
from tests.support.scripted_http import ScriptedServer, ok

PAGE = b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n'


def scraper_for(
    servers: list[ScriptedServer], events: list[str], interval_s: float, timeout_s: float = 2.0
) -> tuple[Scraper, EndpointRegistry]:
    ids = [EndpointId(f"127.0.0.1:{s.port}") for s in servers]
    registry = EndpointRegistry([Endpoint(e) for e in ids])
    scraper = Scraper(
        registry, {e: f"http://{e}" for e in ids}, interval_s=interval_s, discover_interval_s=60.0,
        timeout_s=timeout_s,
        on_send=lambda e: events.append(f"sent {e}"), on_scrape=lambda e: events.append(f"scraped {e}"),
    )  # fmt: skip
    return scraper, registry


def scraped(registry: EndpointRegistry) -> int:
    return sum(r.metrics is not None for r in registry.snapshot().values())


async def test_the_first_round_reads_every_endpoint_and_notes_each_sending_before_its_answer() -> None:
    async with ScriptedServer(lambda n: ok(PAGE)) as a, ScriptedServer(lambda n: ok(PAGE)) as b:
        events: list[str] = []
        scraper, registry = scraper_for([a, b], events, interval_s=30.0)
        await scraper.start()
        try:
            await until(lambda: scraped(registry) == 2, timeout_s=10.0, what="both read in the first round")
            record = registry.snapshot()[EndpointId(f"127.0.0.1:{a.port}")]
            assert record.metrics is not None and (record.metrics.running, record.metrics.waiting) == (1, 2)
            for server in (a, b):
                eid = f"127.0.0.1:{server.port}"
                assert events.index(f"sent {eid}") < events.index(f"scraped {eid}")
        finally:
            await scraper.stop()


async def test_a_slow_endpoint_sits_rounds_out_without_holding_up_the_others() -> None:
    # The slow server answers nothing within the test (its first request, /v1/models, waits 60 s for a 30 s
    # timeout): however slow the box, it has one request while the fast one is read round after round.
    async with ScriptedServer(lambda n: ok(PAGE), delay_s=60.0) as slow, ScriptedServer(lambda n: ok(PAGE)) as fast:
        scraper, _ = scraper_for([slow, fast], [], interval_s=0.05, timeout_s=30.0)
        await scraper.start()
        try:
            await until(lambda: fast.requests >= 5, timeout_s=20.0, what="the fast endpoint read round after round")
            assert slow.requests == 1
        finally:
            await scraper.stop()


class Recording(Scraper):
    """A scraper whose scrapes only record ``(endpoint, discover, round)``; ``script`` may make one slow or die."""

    def __init__(self, ids: list[EndpointId], script: Callable[[EndpointId, int], Awaitable[None]], **timing: float):
        super().__init__(EndpointRegistry([Endpoint(e) for e in ids]), {e: f"http://{e}" for e in ids},
                         timeout_s=1.0, **timing)  # fmt: skip
        self.calls: list[tuple[EndpointId, bool, int]] = []
        self._script = script

    async def scrape_once(self, eid: EndpointId, *, discover: bool) -> None:
        self.calls.append((eid, discover, self._rounds))
        await self._script(eid, len([c for c in self.calls if c[0] == eid]))

    def of(self, eid: EndpointId) -> list[tuple[EndpointId, bool, int]]:
        return [c for c in self.calls if c[0] == eid]


A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


async def test_a_loop_that_died_is_started_again_at_the_next_round() -> None:
    async def script(eid: EndpointId, n: int) -> None:
        if eid == A and n == 1:
            raise asyncio.CancelledError  # leaked from a library: ends the loop, not the scraper

    scraper = Recording([A, B], script, interval_s=0.01, discover_interval_s=60.0)
    await scraper.start()
    try:
        await until(lambda: len(scraper.of(A)) >= 3, timeout_s=10.0, what="A scraped again after its loop died")
    finally:
        await scraper.stop()


async def test_discovery_counts_rounds_so_a_slow_endpoint_is_discovered_as_often() -> None:
    async def script(eid: EndpointId, n: int) -> None:
        await asyncio.sleep(0.035)  # each scrape spans ~3-4 rounds of 10 ms

    scraper = Recording([A], script, interval_s=0.01, discover_interval_s=0.05)  # discovery every 5 rounds
    await scraper.start()
    try:
        await until(lambda: len(scraper.of(A)) >= 8, timeout_s=20.0, what="8 scrapes of the slow endpoint")
    finally:
        await scraper.stop()
    calls = scraper.of(A)[:8]
    last: int | None = None
    for _, discover, at in calls:
        assert discover == (last is None or at - last >= 5), calls
        last = at if discover else last
    assert sum(discover for _, discover, _ in calls) >= 3, calls  # counted in scrapes it would be 2 of 8


async def test_an_endpoint_removed_mid_scrape_ends_its_loop_and_stop_awaits_it() -> None:
    async def script(eid: EndpointId, n: int) -> None:
        if eid == B:
            await asyncio.sleep(30.0)

    scraper = Recording([A, B], script, interval_s=0.01, discover_interval_s=60.0)
    await scraper.start()
    try:
        await until(lambda: scraper.of(B), timeout_s=10.0, what="B's scrape started")
        loop_of_b = scraper._loops[B]
        scraper.set_targets({A: f"http://{A}"})
        await until(loop_of_b.done, timeout_s=10.0, what="B's loop ended")
        calls_of_a = len(scraper.of(A))
        await until(lambda: len(scraper.of(A)) > calls_of_a + 2, timeout_s=10.0, what="A still scraped")
        assert len(scraper.of(B)) == 1
    finally:
        await scraper.stop()
