"""``Scraper`` against scripted servers on 127.0.0.1: a round's answers are read together, late ones still come in."""

from __future__ import annotations

import asyncio

from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.types import Endpoint, EndpointId
from tests.support.polling import until
from tests.support.scripted_http import ScriptedServer, ok

PAGE = b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n'


def scraper_for(servers: list[ScriptedServer], events: list[str], **timing: float) -> tuple[Scraper, EndpointRegistry]:
    ids = [EndpointId(f"127.0.0.1:{s.port}") for s in servers]
    registry = EndpointRegistry([Endpoint(e) for e in ids])
    scraper = Scraper(
        registry, {e: f"http://{e}" for e in ids}, discover_interval_s=60.0, timeout_s=2.0,
        on_send=lambda e: events.append(f"sent {e}"), on_scrape=lambda e: events.append(f"scraped {e}"), **timing,
    )  # fmt: skip
    return scraper, registry


def scraped(registry: EndpointRegistry) -> int:
    return sum(r.metrics is not None for r in registry.snapshot().values())


async def test_a_rounds_answers_wait_for_read_after_then_are_read_together() -> None:
    async with ScriptedServer(lambda n: ok(PAGE)) as a, ScriptedServer(lambda n: ok(PAGE)) as b:
        events: list[str] = []
        scraper, registry = scraper_for([a, b], events, interval_s=30.0, read_after_s=0.5)
        await scraper.start()
        try:
            # each got /v1/models (not JSON here: kept as it was) and then /metrics
            await until(lambda: a.requests == 2 and b.requests == 2, timeout_s=5.0, what="both asked")
            await asyncio.sleep(0.05)
            assert scraped(registry) == 0  # answered, but held in the sockets until the round's read time
            await until(lambda: scraped(registry) == 2, timeout_s=5.0, what="both read")
            assert registry.snapshot()[EndpointId(f"127.0.0.1:{a.port}")].metrics.waiting == 2  # type: ignore[union-attr]
            assert sorted(events) == sorted(
                f"{what} 127.0.0.1:{s.port}" for what in ("sent", "scraped") for s in (a, b)
            )
        finally:
            await scraper.stop()


async def test_an_answer_later_than_read_after_is_read_when_it_comes_not_a_round_later() -> None:
    async with ScriptedServer(lambda n: ok(PAGE), delay_s=0.3) as slow, ScriptedServer(lambda n: ok(PAGE)) as fast:
        scraper, registry = scraper_for([slow, fast], [], interval_s=30.0, read_after_s=0.01)
        await scraper.start()
        try:
            await until(lambda: scraped(registry) == 2, timeout_s=10.0, what="both read within the first round")
        finally:
            await scraper.stop()


async def test_read_after_zero_reads_each_answer_as_it_comes() -> None:
    async with ScriptedServer(lambda n: ok(PAGE)) as a:
        scraper, registry = scraper_for([a], [], interval_s=30.0, read_after_s=0.0)
        await scraper.start()
        try:
            await until(lambda: scraped(registry) == 1, timeout_s=10.0, what="read in the first round")
        finally:
            await scraper.stop()
