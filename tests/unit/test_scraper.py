"""``Scraper``: a round reads every endpoint and a slow one holds up none, pages are read narrowed where the
server honours it (scripted servers on 127.0.0.1); its loops per endpoint restart, discover by rounds and end
with their endpoint (scrapes recorded, no network)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

from extproc.backends import scraper as scraper_module
from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.backends.vllm_metrics import EngineMetrics, parse_metrics
from extproc.types import Endpoint, EndpointId
from tests.support.polling import until
from tests.support.scripted_http import ScriptedServer, ok

PAGE = b'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n'


def scraper_for(
    servers: list[ScriptedServer], events: list[str], interval_s: float, timeout_s: float = 2.0, *,
    narrow: bool = True, deferred: bool = True,
) -> tuple[Scraper, EndpointRegistry]:  # fmt: skip
    ids = [EndpointId(f"127.0.0.1:{s.port}") for s in servers]
    registry = EndpointRegistry([Endpoint(e) for e in ids])
    scraper = Scraper(
        registry, {e: f"http://{e}" for e in ids}, interval_s=interval_s, discover_interval_s=60.0,
        timeout_s=timeout_s, narrow_pages=narrow, deferred_reads=deferred,
        on_send=lambda e: events.append(f"sent {e}"), on_scrape=lambda e: events.append(f"scraped {e}"),
    )  # fmt: skip
    return scraper, registry


def scraped(registry: EndpointRegistry) -> int:
    return sum(r.metrics is not None for r in registry.snapshot().values())


@pytest.mark.parametrize("deferred", [True, False])
async def test_the_first_round_reads_every_endpoint_and_notes_each_sending_before_its_answer(deferred: bool) -> None:
    async with ScriptedServer(lambda n: ok(PAGE)) as a, ScriptedServer(lambda n: ok(PAGE)) as b:
        events: list[str] = []
        scraper, registry = scraper_for([a, b], events, interval_s=30.0, deferred=deferred)
        await scraper.start()
        try:
            if deferred:  # answers wait in their sockets until asked for (a decision asks): the next round is 30 s off
                await until(lambda: metrics_reads(a) and metrics_reads(b), timeout_s=10.0, what="both asked")
                await asyncio.sleep(0.2)
                asked_s = time.monotonic()
                assert scraped(registry) == 0
                await until(lambda: scraper.collect_answers() or scraped(registry) == 2, timeout_s=10.0,
                            what="both collected when asked")  # fmt: skip
            await until(lambda: scraped(registry) == 2, timeout_s=10.0, what="both read in the first round")
            record = registry.snapshot()[EndpointId(f"127.0.0.1:{a.port}")]
            assert record.metrics is not None and (record.metrics.running, record.metrics.waiting) == (1, 2)
            if deferred:  # the page is as old as its GET, not as its collection
                assert record.scraped_at_s <= asked_s - 0.2
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


NARROWED = "/metrics/?name%5B%5D="  # how a narrowed read's target begins (vllm_metrics.narrow_url)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
BROKEN = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"


def metrics_reads(server: ScriptedServer) -> list[str]:
    """``"narrow"`` or ``"whole"`` per metrics read, in order (discovery's reads left out)."""
    return [("narrow" if p.startswith(NARROWED) else "whole") for p in server.paths if p.startswith("/metrics")]


async def reads_of(
    reply: Callable[[str], bytes], *, narrow: bool = True, deferred: bool = True, reads: int = 4
) -> tuple[list[str], int]:
    """The first ``reads`` metrics reads of one endpoint whose server answers ``reply(target)``, and whether its
    load was read in the end."""
    async with ScriptedServer(lambda n: reply(server.paths[n])) as server:
        scraper, registry = scraper_for([server], [], interval_s=0.01, narrow=narrow, deferred=deferred)
        await scraper.start()
        try:
            await until(lambda: len(metrics_reads(server)) >= reads, timeout_s=10.0, what=f"{reads} metrics reads")
        finally:
            await scraper.stop()
        (record,) = registry.snapshot().values()
        return metrics_reads(server)[:reads], record.metrics is not None


@pytest.mark.parametrize(
    ("case", "narrowed_answer", "expected"),
    [
        ("honoured", ok(PAGE), ["narrow"] * 4),
        ("404: the path does not exist", NOT_FOUND, ["narrow", "whole", "whole", "whole"]),
        ("200 without the load gauges (multiprocess mode)", ok(b"# nothing\n"), ["narrow", "whole", "whole", "whole"]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("deferred", [True, False])
async def test_a_narrowed_page_is_read_while_the_server_honours_it_else_the_whole_one(
    case: str, narrowed_answer: bytes, expected: list[str], deferred: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="extproc.backends.scraper")

    def reply(target: str) -> bytes:
        return narrowed_answer if target.startswith(NARROWED) else ok(PAGE)

    reads, read_right = await reads_of(reply, deferred=deferred)
    assert reads == expected, case
    assert read_right
    widened = [r for r in caplog.records if "does not serve a narrowed metrics page" in r.message]
    assert len(widened) == (expected[1] == "whole")


@pytest.mark.parametrize("deferred", [True, False])
async def test_when_both_pages_fail_the_narrowed_one_is_tried_again_next_round(deferred: bool) -> None:
    reads, read_right = await reads_of(lambda target: BROKEN, deferred=deferred)
    assert reads == ["narrow", "whole", "narrow", "whole"]
    assert not read_right


async def test_narrow_pages_off_reads_the_whole_page_only() -> None:
    reads, _ = await reads_of(lambda target: ok(PAGE), narrow=False, reads=2)
    assert reads == ["whole", "whole"]


BUSY = b'vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 0\n'


@pytest.mark.parametrize("deferred", [True, False])
async def test_a_page_that_repeats_the_last_is_not_parsed_again_but_still_counts_as_fresh(
    deferred: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle engine writes the same page round after round: it is parsed once, and each repeat still records
    the load as read when its GET went out; a page that differs is parsed."""
    parsed: list[str] = []

    def counting(text: str) -> EngineMetrics:
        parsed.append(text)
        return parse_metrics(text)

    monkeypatch.setattr(scraper_module, "parse_metrics", counting)
    pages = [PAGE, PAGE, PAGE, BUSY, BUSY, PAGE]
    seen: list[tuple[int, float]] = []  # each applied page's (running, taken at)

    def applied(eid: EndpointId) -> None:
        record = registry.snapshot()[eid]
        assert record.metrics is not None
        seen.append((record.metrics.running, record.scraped_at_s))

    async with ScriptedServer(lambda n: ok(pages[min(len(metrics_reads(server)) - 1, len(pages) - 1)])) as server:
        eid = EndpointId(f"127.0.0.1:{server.port}")
        registry = EndpointRegistry([Endpoint(eid)])
        scraper = Scraper(registry, {eid: f"http://{eid}"}, interval_s=0.02, timeout_s=2.0, discover_interval_s=60.0,
                          deferred_reads=deferred, on_scrape=applied)  # fmt: skip
        await scraper.start()
        try:
            await until(lambda: len(seen) >= len(pages), timeout_s=20.0, what="six pages applied")
        finally:
            await scraper.stop()
    assert [running for running, _ in seen[: len(pages)]] == [1, 1, 1, 3, 3, 1]
    taken = [at_s for _, at_s in seen]
    assert taken == sorted(taken) and len(set(taken)) == len(taken)  # each repeat is a fresh reading
    assert [float(t.split("} ")[1].split()[0]) for t in parsed] == [1.0, 3.0, 1.0]  # each change, once


async def test_deferred_reads_are_sent_by_the_ticker_and_the_loop_runs_only_to_discover_or_connect() -> None:
    calls: list[bool] = []

    class Counting(Scraper):
        async def scrape_once(self, eid: EndpointId, *, discover: bool) -> None:
            calls.append(discover)
            await super().scrape_once(eid, discover=discover)

    async with ScriptedServer(lambda n: ok(PAGE)) as server:
        eid = EndpointId(f"127.0.0.1:{server.port}")
        registry = EndpointRegistry([Endpoint(eid)])
        scraper = Counting(registry, {eid: f"http://{eid}"}, interval_s=0.01, timeout_s=2.0, discover_interval_s=60.0)
        await scraper.start()
        try:
            await until(lambda: len(metrics_reads(server)) >= 20, timeout_s=20.0, what="20 metrics reads")
        finally:
            await scraper.stop()
        assert calls == [True]  # the first round: discovery, then the connection and the first GET
        assert scraped(registry) == 1 and server.connections == 1 + 1  # one for discovery, one polled


async def test_a_decision_looks_only_at_the_endpoints_with_an_answer_out() -> None:
    # collect_answers runs before every decision: once a round's answers are in, it must not walk the fleet
    looked: list[EndpointId] = []

    class Spying(Scraper):
        def _collect(self, eid: EndpointId) -> None:
            looked.append(eid)
            super()._collect(eid)

    async with ScriptedServer(lambda n: ok(PAGE)) as a, ScriptedServer(lambda n: ok(PAGE)) as b:
        ids = [EndpointId(f"127.0.0.1:{s.port}") for s in (a, b)]
        registry = EndpointRegistry([Endpoint(e) for e in ids])
        scraper = Spying(registry, {e: f"http://{e}" for e in ids}, interval_s=30.0, timeout_s=2.0,
                         discover_interval_s=60.0)  # fmt: skip
        await scraper.start()
        try:
            await until(lambda: metrics_reads(a) and metrics_reads(b), timeout_s=10.0, what="both asked")
            await until(lambda: scraper.collect_answers() or scraped(registry) == 2, timeout_s=10.0, what="both in")
            looked.clear()
            for _ in range(10):
                scraper.collect_answers()
            assert looked == []
        finally:
            await scraper.stop()


async def test_a_bug_while_applying_an_answer_stops_neither_the_rounds_nor_a_decision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def buggy(eid: EndpointId) -> None:
        raise RuntimeError("a bug in on_scrape")

    async with ScriptedServer(lambda n: ok(PAGE)) as server:
        eid = EndpointId(f"127.0.0.1:{server.port}")
        scraper = Scraper(EndpointRegistry([Endpoint(eid)]), {eid: f"http://{eid}"}, interval_s=0.01, timeout_s=2.0,
                          discover_interval_s=60.0, on_scrape=buggy)  # fmt: skip
        await scraper.start()
        try:
            await until(lambda: len(metrics_reads(server)) >= 2, timeout_s=10.0, what="the first answer applied")
            await until(lambda: scraper.collect_answers() or len(metrics_reads(server)) >= 6, timeout_s=10.0,
                        what="rounds going on, decisions collecting")  # fmt: skip
        finally:
            await scraper.stop()
    assert any("a bug in on_scrape" in (r.exc_text or "") for r in caplog.records)


async def test_each_round_calls_on_round_and_a_bug_there_stops_no_round(caplog: pytest.LogCaptureFixture) -> None:
    """``on_round`` (the KV-event subscriber's ``pace``) runs once per round, in the round's own wake-up."""
    rounds: list[int] = []

    def on_round() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("a bug in on_round")

    scraper = Scraper(
        EndpointRegistry([]), {}, interval_s=0.01, timeout_s=1.0, discover_interval_s=60.0, on_round=on_round
    )
    await scraper.start()
    try:
        await until(lambda: len(rounds) >= 5, timeout_s=10.0, what="rounds going on after the bug")
    finally:
        await scraper.stop()
    assert any("a bug in on_round" in (r.exc_text or "") for r in caplog.records)


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
