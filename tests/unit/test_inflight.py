"""``InflightLoad``: the virtual prefill queue, and which routed requests a scrape already shows."""

from __future__ import annotations

from extproc.backends.inflight import InflightLoad
from extproc.types import EndpointId
from tests.support.clock import FakeClock

A = EndpointId("10.0.0.1:8000")


def test_the_queue_drains_at_the_prefill_rate() -> None:
    clock = FakeClock()
    load = InflightLoad(1000.0, clock=clock)
    load.add(A, 3000)
    clock.now += 1.0
    assert load.queued_tokens(A) == 2000.0
    clock.now += 5.0
    assert load.queued_tokens(A) == 0.0


def test_a_scrape_shows_what_was_routed_before_its_request_went_out_not_after() -> None:
    load = InflightLoad(1000.0)
    load.add(A, 10)
    load.add(A, 10)
    load.scrape_sent(A)
    load.add(A, 10)  # routed while the answer was on its way: the page cannot show it
    assert load.routed_since_scrape(A) == 3
    load.scraped(A)
    assert load.routed_since_scrape(A) == 1


def test_a_scrape_without_its_sending_noted_shows_everything_routed() -> None:
    load = InflightLoad(1000.0)
    for _ in range(3):
        load.add(A, 10)
    load.scraped(A)
    assert load.routed_since_scrape(A) == 0
    load.scrape_sent(A)
    load.scraped(A)  # an answer never shows less than an earlier one did
    assert load.routed_since_scrape(A) == 0


def test_a_failed_scrape_leaves_the_count_and_the_next_sending_replaces_its_mark() -> None:
    load = InflightLoad(1000.0)
    load.add(A, 10)
    load.scrape_sent(A)  # this one fails: no scraped()
    load.add(A, 10)
    load.scrape_sent(A)
    load.add(A, 10)
    load.scraped(A)
    assert load.routed_since_scrape(A) == 1
