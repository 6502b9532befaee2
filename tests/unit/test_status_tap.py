"""The decision tap, the ceiling estimate and the counter windows behind ``/status`` and the fleet metrics."""

from __future__ import annotations

import random

import pytest

from bench.suite.workloads import ceiling_share
from extproc.status.ceiling import MARK_STRIDE, CeilingEstimator, CeilingRequest
from extproc.status.service import CEILING_BLOCKS_PER_TICK, CEILING_EVERY_S, FleetStatus
from extproc.status.tap import DecisionTap, tenant_classes
from extproc.status.windows import Windows, ratio
from extproc.types import BlockHash, Reason
from tests.support.fleet import A, B, decide, make_fleet


def _chain(ids: list[int], block: int = 16) -> list[BlockHash]:
    """Block keys chained as the benchmark's ceiling chains them (each names its whole prefix)."""
    keys, parent = [], 0
    for b in range(len(ids) // block):
        parent = hash((parent, tuple(ids[b * block : (b + 1) * block])))
        keys.append(BlockHash(parent))
    return keys


def test_the_ceiling_is_the_benchmarks_ceiling() -> None:
    """Same requests in the same order: the live estimate and ``bench``'s ``ceiling_share`` agree."""
    rng = random.Random(7)
    docs = [[rng.randrange(1000) for _ in range(rng.randrange(40, 200))] for _ in range(5)]
    prompts = [docs[rng.randrange(5)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 40))] for _ in range(40)]
    est = CeilingEstimator()
    for ids in prompts:
        est.add(CeilingRequest("m", "default", len(ids), _chain(ids), 16))
    assert est.totals[("m", "default")].share == pytest.approx(ceiling_share(prompts))


def test_the_ceiling_forgets_the_least_recently_seen_blocks() -> None:
    est = CeilingEstimator(max_blocks=2)
    for hashes in ([1, 2], [3, 4], [1, 2]):  # 1 and 2 fell out when 3 and 4 came
        est.add(CeilingRequest("m", "c", 33, [BlockHash(h) for h in hashes], 16))
    assert est.totals[("m", "c")].hit_tokens == 0
    est.add(CeilingRequest("m", "c", 33, [BlockHash(1), BlockHash(2)], 16))
    assert est.totals[("m", "c")].hit_tokens == 32


def test_the_last_prompt_token_is_never_a_hit() -> None:
    est = CeilingEstimator()
    for _ in range(2):
        est.add(CeilingRequest("m", "c", 32, [BlockHash(1), BlockHash(2)], 16))  # 2 full blocks, no token after
    assert est.totals[("m", "c")].hit_tokens == 16


def test_the_tap_counts_per_endpoint_model_class_and_reason() -> None:
    tap = DecisionTap(tenant_classes(["gold"]), CeilingEstimator())
    decide(tap, A, 100, 32, tenant="gold")
    decide(tap, A, 50, 0, tenant="someone", reason=Reason.LOAD)
    decide(tap, B, 10, 0)
    assert (tap.by_endpoint[A].requests, tap.by_endpoint[A].prompt_tokens) == (2, 150)
    assert tap.by_endpoint[A].predicted_cached_tokens == 32
    assert set(tap.by_model) == {("m", "gold"), ("m", "default")}  # unknown tenant ids share one class
    assert tap.by_reason == {"cache": 2, "load": 1}


def test_recent_decisions_are_bounded_and_newest_first() -> None:
    tap = DecisionTap(tenant_classes([]), CeilingEstimator(), recent=3)
    for i in range(5):
        decide(tap, A, i, 0, request_id=f"r{i}")
    assert [d.request_id for d in tap.recent()] == ["r4", "r3", "r2"]


def test_the_ceiling_drain_has_a_budget() -> None:
    tap = DecisionTap(tenant_classes([]), CeilingEstimator())
    for _ in range(3):
        decide(tap, A, 100, 0, hashes=range(6))
    tap.drain_ceiling(max_blocks=7)  # the first request uses 6 of 7, the second takes the rest: two drained
    assert tap.queued() == 1
    tap.drain_ceiling(max_blocks=7)
    assert tap.queued() == 0 and tap.ceiling.totals[("m", "default")].requests == 3


def test_the_status_feeds_the_ceiling_once_a_period_and_more_after_a_longer_one() -> None:
    fleet = make_fleet()
    status = FleetStatus(fleet.sources, clock=fleet.clock)
    per_request = CEILING_BLOCKS_PER_TICK // 4
    for _ in range(12):
        decide(fleet.tap, A, 100, 0, hashes=range(per_request))
    status.tick()  # the first round starts the clock: nothing fed yet
    assert fleet.tap.queued() == 12
    fleet.clock.now += CEILING_EVERY_S / 2
    status.tick()  # rounds come more often than the period: this one feeds nothing
    assert fleet.tap.queued() == 12
    fleet.clock.now += CEILING_EVERY_S / 2
    status.tick()  # a period: one budget, four requests
    assert fleet.tap.queued() == 8
    fleet.clock.now += 2 * CEILING_EVERY_S
    status.tick()  # rounds two periods apart (a slow scrape interval): two budgets at once
    assert fleet.tap.queued() == 0


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([(0.0, 10.0)], None),
        ([(0.0, 10.0), (5.0, 20.0)], (10.0, 5.0)),
        ([(0.0, 10.0), (5.0, 20.0), (70.0, 50.0)], (30.0, 65.0)),  # one sample at or before the window's start
        ([(0.0, 10.0), (5.0, 20.0), (70.0, 50.0), (80.0, 60.0)], (40.0, 75.0)),
        ([(0.0, 10.0), (5.0, 3.0)], None),  # went down: the counter restarted
        ([(0.0, 10.0), (5.0, 3.0), (6.0, 5.0)], (2.0, 1.0)),
    ],
    ids=["one-sample", "two", "kept-start", "slid", "restart", "after-restart"],
)
def test_windows(samples: list[tuple[float, float]], expected: tuple[float, float] | None) -> None:
    w = Windows(window_s=60.0)
    got = None
    for t, v in samples:
        got = w.delta("k", v, t)
    assert got == expected


def test_ratio_needs_both_deltas_and_a_moving_denominator() -> None:
    assert ratio((3.0, 1.0), (6.0, 1.0)) == 0.5
    assert ratio(None, (6.0, 1.0)) is None and ratio((3.0, 1.0), (0.0, 1.0)) is None


def test_the_ceiling_queue_holds_a_bounded_number_of_blocks() -> None:
    """Long prompts: the queue drops its oldest requests once it would reference too many block hashes."""
    tap = DecisionTap(tenant_classes([]), CeilingEstimator(), queue_blocks=10)
    for _ in range(3):
        decide(tap, A, 100, 0, hashes=range(4))
    assert (tap.queued(), tap.ceiling_dropped) == (2, 1)
    tap.drain_ceiling(max_blocks=100)
    decide(tap, A, 100, 0, hashes=range(10))  # fits once the queue drained
    assert (tap.queued(), tap.ceiling_dropped) == (1, 1)


def test_a_long_prompts_hit_run_is_counted_to_within_one_mark_stride() -> None:
    """Beyond the first EXACT_BLOCKS only every MARK_STRIDE-th block is remembered: a long shared prefix is
    under-counted by fewer than MARK_STRIDE blocks, never over-counted."""
    rng = random.Random(3)
    doc = [rng.randrange(1000) for _ in range(16 * 1000 + 5)]
    est = CeilingEstimator()
    est.add(CeilingRequest("m", "c", len(doc), _chain(doc), 16))
    for tail in range(1, 9):  # the same document, diverging at a different block each time
        ids = doc[: 16 * (900 + tail)] + [1000 + tail] * 64
        before = est.totals[("m", "c")].hit_tokens
        est.add(CeilingRequest("m", "c", len(ids), _chain(ids), 16))
        counted = (est.totals[("m", "c")].hit_tokens - before) // 16
        assert 900 + tail - MARK_STRIDE < counted <= 900 + tail
