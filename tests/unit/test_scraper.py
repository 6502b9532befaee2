"""``Scraper`` against scripted servers on 127.0.0.1: a round reads every endpoint, a slow one holds up none."""

from __future__ import annotations

from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.types import Endpoint, EndpointId
from tests.support.polling import until
from tests.support.scripted_http import ScriptedServer, ok

PAGE = b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n'


def scraper_for(
    servers: list[ScriptedServer], events: list[str], interval_s: float
) -> tuple[Scraper, EndpointRegistry]:
    ids = [EndpointId(f"127.0.0.1:{s.port}") for s in servers]
    registry = EndpointRegistry([Endpoint(e) for e in ids])
    scraper = Scraper(
        registry, {e: f"http://{e}" for e in ids}, interval_s=interval_s, discover_interval_s=60.0, timeout_s=2.0,
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
    async with ScriptedServer(lambda n: ok(PAGE), delay_s=3.0) as slow, ScriptedServer(lambda n: ok(PAGE)) as fast:
        scraper, registry = scraper_for([slow, fast], [], interval_s=0.05)
        await scraper.start()
        try:
            await until(lambda: fast.requests >= 5, timeout_s=10.0, what="the fast endpoint read round after round")
            assert slow.requests <= 2  # /v1/models, then the /metrics still being answered: no pile of requests
        finally:
            await scraper.stop()
