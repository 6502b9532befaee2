"""``backends.load.snapshot``: the load a decision sees, from the last scrape and what we routed since."""

from dataclasses import dataclass

import pytest

from extproc.backends.load import snapshot
from extproc.backends.registry import EndpointRecord
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.types import Endpoint, EndpointId, LoadSnapshot

A = EndpointId("10.0.0.1:8000")
STALE_AFTER_S = 2.0


@dataclass
class Routed:
    """What we routed (``RoutedLoad``): fixed numbers instead of a draining queue."""

    queued: float = 0.0
    since_scrape: int = 0
    before_first_token: int = 0  # of those, still before their predicted first token
    waiting_size: float = 0.0  # tokens per waiting request
    busy: float = 0.0
    drained_per_s: int = 0  # waiting requests done per second of a page's age

    def queued_tokens(self, endpoint: EndpointId) -> float:
        return self.queued

    def routed_since_scrape(self, endpoint: EndpointId) -> int:
        return self.since_scrape

    def queued_since_scrape(self, endpoint: EndpointId) -> int:
        return self.before_first_token

    def busy_s(self, endpoint: EndpointId) -> float:
        return self.busy

    def waiting_left(self, endpoint: EndpointId, waiting: int, age_s: float) -> tuple[int, float]:
        left = max(waiting - int(self.drained_per_s * age_s), 0)
        return left, left * self.waiting_size


def scraped(running: int = 0, waiting: int = 0, kv: float = 0.0, at_s: float = 10.0) -> EndpointRecord:
    metrics = EngineMetrics(running=running, waiting=waiting, kv_usage=kv, models=frozenset())
    return EndpointRecord(Endpoint(A), metrics, scraped_at_s=at_s)


TABLE = [
    # id, record, routed, shared queued, now, expected snapshot
    ("never-scraped-is-unknown", EndpointRecord(Endpoint(A)), Routed(), 0.0, 10.0, LoadSnapshot()),
    (
        "fresh-scrape-counts",
        scraped(running=3, waiting=0, kv=0.5),
        Routed(since_scrape=2, before_first_token=1, busy=0.05),
        0.0,
        11.0,
        LoadSnapshot(
            running=3,
            kv_usage=0.5,
            known=True,
            scraped_at_s=10.0,
            inflight_requests=2,
            queued_requests=1,
            prefill_busy_s=0.05,
        ),
    ),
    (
        "stale-scrape-reads-as-unknown",
        scraped(running=3, waiting=4, kv=0.5),
        Routed(queued=100.0),
        0.0,
        10.0 + STALE_AFTER_S + 0.1,
        LoadSnapshot(scraped_at_s=10.0, queued_prefill_tokens=100.0),
    ),
    (
        "our-queue-wins",
        scraped(waiting=1),
        Routed(queued=5000.0, waiting_size=1000.0),
        2000.0,
        10.0,
        LoadSnapshot(waiting=1, known=True, scraped_at_s=10.0, queued_prefill_tokens=5000.0),
    ),
    (
        "other-replicas-queue-wins",
        scraped(),
        Routed(queued=100.0),
        2000.0,
        10.0,
        LoadSnapshot(known=True, scraped_at_s=10.0, queued_prefill_tokens=2000.0),
    ),
    (
        "waiting-requests-at-their-sizes",
        scraped(waiting=4),
        Routed(queued=100.0, waiting_size=500.0),
        0.0,
        10.0,
        LoadSnapshot(waiting=4, known=True, scraped_at_s=10.0, queued_prefill_tokens=2000.0),
    ),
    (
        "waiting-requests-aged-by-the-page",
        scraped(waiting=4),
        Routed(waiting_size=500.0, drained_per_s=10),
        0.0,
        10.3,  # the page is 0.3 s old: three of the four are done
        LoadSnapshot(waiting=1, known=True, scraped_at_s=10.0, queued_prefill_tokens=500.0),
    ),
]


@pytest.mark.parametrize(
    ("record", "routed", "shared", "now", "expected"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE]
)
def test_snapshot(record: EndpointRecord, routed: Routed, shared: float, now: float, expected: LoadSnapshot) -> None:
    assert snapshot(record, routed, shared, now, STALE_AFTER_S) == expected


@pytest.mark.parametrize(
    ("ours_s", "shared_s", "expected_s"),
    [(0.0, 0.0, 0.0), (0.05, 0.0, 0.05), (0.0, 0.08, 0.08), (0.05, 0.08, 0.08), (0.08, 0.05, 0.08)],
    ids=["none", "ours", "another-replicas", "theirs-later", "ours-later"],
)
def test_the_busy_floor_is_the_later_of_ours_and_every_replicas(
    ours_s: float, shared_s: float, expected_s: float
) -> None:
    """Another replica's request predicted to prefill there keeps the endpoint busy as one of ours would."""
    seen = snapshot(scraped(), Routed(busy=ours_s), 0.0, 10.0, STALE_AFTER_S, shared_busy_s=shared_s)
    assert seen.prefill_busy_s == expected_s
