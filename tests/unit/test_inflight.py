"""``InflightLoad``: the virtual prefill queue, and which routed requests a scrape's answer can show."""

from __future__ import annotations

import pytest

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


# steps: "r" routes a request, "s" a scrape's request goes out, "a" its answer arrives, "f" forget()
@pytest.mark.parametrize(
    ("steps", "not_shown"),
    [
        ("rrsra", 1),  # routed while the answer was on its way: the page cannot show it
        ("rrr", 3),  # no scrape yet
        ("rrra", 0),  # an answer without its sending noted shows everything routed
        ("rrrasa", 0),  # an answer never shows less than an earlier one did
        ("rsrsra", 1),  # a failed scrape (no answer): the next sending replaces its mark
        ("rrsfra", 0),  # forgotten while a scrape was out: the answer shows all (the endpoint had left)
    ],
    ids=["routed-during-scrape", "no-scrape", "answer-without-send", "never-less", "failed-scrape", "forgotten"],
)
def test_what_a_scrape_can_show(steps: str, not_shown: int) -> None:
    load = InflightLoad(1000.0)
    act = {"r": lambda: load.add(A, 10), "s": lambda: load.scrape_sent(A), "a": lambda: load.scraped(A),
           "f": lambda: load.forget(A)}  # fmt: skip
    for step in steps:
        act[step]()
    assert load.routed_since_scrape(A) == not_shown


def test_an_endpoint_is_busy_until_the_last_predicted_first_token() -> None:
    clock = FakeClock()
    load = InflightLoad(1000.0, clock=clock)
    assert load.busy_s(A) == 0.0  # nothing routed
    load.add(A, 256, 0.10)
    clock.now += 0.04
    assert load.busy_s(A) == pytest.approx(0.06)
    load.add(A, 256, 0.02)  # predicted to finish before the first: the first still keeps it busy
    assert load.busy_s(A) == pytest.approx(0.06)
    load.add(A, 256, None)  # not estimated: keeps nothing busy
    clock.now += 0.10
    assert load.busy_s(A) == 0.0


# steps: "r<t>" routes a request predicted to reach its first token in t s ("r-": not estimated), "w<t>" waits t s,
# "s" a scrape's request goes out, "a" its answer arrives
@pytest.mark.parametrize(
    ("steps", "queued"),
    [
        ("r0.1 r0.2", 2),  # both before their first tokens
        ("r0.1 r0.2 w0.15", 1),  # the first is past its predicted first token: no longer a turn ahead
        ("r0.1 r0.2 w0.3", 0),  # both past it, though no page shows them yet
        ("r- w5", 1),  # not estimated: counts until a page shows it
        ("r0.1 s r0.2 a", 1),  # a page shows the first
        ("r0.1 s w0.15 r0.2 a", 1),  # the one a page cannot show yet, still before its first token
    ],
    ids=["both-ahead", "one-past", "both-past", "not-estimated", "one-shown", "past-and-shown"],
)
def test_routed_requests_queue_until_their_predicted_first_token(steps: str, queued: int) -> None:
    clock = FakeClock()
    load = InflightLoad(1000.0, clock=clock)
    for step in steps.split():
        if step[0] == "r":
            load.add(A, 100, None if step == "r-" else float(step[1:]))
        elif step[0] == "w":
            clock.now += float(step[1:])
        else:
            {"s": load.scrape_sent, "a": load.scraped}[step](A)
    assert load.queued_since_scrape(A) == queued
    assert load.queued_since_scrape(EndpointId("10.0.0.9:8000")) == 0  # nothing routed there


# steps: "r<n>" routes a request of n uncached tokens, "s" a scrape's request goes out, "a" its answer arrives
@pytest.mark.parametrize(
    ("steps", "waiting", "tokens"),
    [
        ("r40 r40 s a", 0, 0.0),  # nothing waiting
        ("r2600 r40 r40 s a", 2, 80.0),  # the latest arrivals wait: two warm requests, not a cold one's worth
        ("r2600 r40 s a", 2, 2640.0),
        ("r2600 r40 s r40 a", 1, 40.0),  # routed after the scrape went out: not on its page
        ("r2600 r40 s r40 a", 2, 2640.0),
        ("r40 s a", 3, 40.0 + 2 * 40.0 * 0.05),  # two more than we routed there: another router's, at our mean
        ("s a", 2, 0.0),  # nothing routed anywhere: a mean of 0
    ],
    ids=["none", "latest-wait", "cold-among-them", "routed-after-the-scrape", "before-the-mark", "others-at-mean",
         "no-mean-yet"],
)  # fmt: skip
def test_waiting_requests_are_sized_as_the_last_we_routed_there(steps: str, waiting: int, tokens: float) -> None:
    load = InflightLoad(1000.0)
    for step in steps.split():
        if step[0] == "r":
            load.add(A, int(step[1:]))
        else:
            (load.scrape_sent if step == "s" else load.scraped)(A)
    assert load.waiting_left(A, waiting, 0.0) == (waiting, pytest.approx(tokens))


# a page showed two waiting requests, a cold one (2600 tokens) then a warm one (40); the rate is 1000 tokens/s
@pytest.mark.parametrize(
    ("age_s", "left", "tokens"),
    [
        (0.0, 2, 2640.0),  # as taken
        (1.0, 2, 1640.0),  # the cold one is being prefilled: still ahead, less of it
        (2.6, 1, 40.0),  # the cold one is done
        (2.62, 1, 20.0),
        (2.64, 0, 0.0),
        (10.0, 0, 0.0),  # long done: nothing left, not less than nothing
    ],
)
def test_waiting_requests_age_with_the_page(age_s: float, left: int, tokens: float) -> None:
    load = InflightLoad(1000.0)
    load.add(A, 2600)
    load.add(A, 40)
    load.scrape_sent(A)
    load.scraped(A)
    assert load.waiting_left(A, 2, age_s) == (left, pytest.approx(tokens))


def test_other_routers_waiting_requests_are_not_aged() -> None:
    load = InflightLoad(1000.0)
    load.add(A, 100)  # the mean is now 5 tokens (0.05 of the first)
    load.scrape_sent(A)
    load.scraped(A)
    assert load.waiting_left(A, 2, 0.0) == (2, pytest.approx(105.0))
    assert load.waiting_left(A, 2, 0.05) == (2, pytest.approx(55.0))  # ours is half done
    assert load.waiting_left(A, 2, 1.0) == (1, pytest.approx(5.0))  # ours is done; the other's size is unknown


def test_a_page_of_an_engine_we_routed_nothing_to_keeps_its_queue() -> None:
    load = InflightLoad(1000.0)
    assert load.waiting_left(A, 3, 10.0) == (3, 0.0)  # no mean yet: three requests of unknown size
