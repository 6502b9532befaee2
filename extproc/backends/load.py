"""One endpoint's ``LoadSnapshot`` for a decision: what its last scrape showed, corrected by what we routed since.

Pure: the caller passes the time and the numbers it read. The formula in one place, table-tested in
``tests/unit/test_load.py``.
"""

from __future__ import annotations

from typing import Protocol

from extproc.backends.registry import EndpointRecord
from extproc.types import EndpointId, LoadSnapshot


class RoutedLoad(Protocol):
    """What this replica routed and no scrape shows yet (``backends.inflight.InflightLoad``)."""

    def queued_tokens(self, endpoint: EndpointId) -> float: ...

    def routed_since_scrape(self, endpoint: EndpointId) -> int: ...

    def queued_since_scrape(self, endpoint: EndpointId) -> int: ...

    def busy_s(self, endpoint: EndpointId) -> float: ...

    def waiting_left(self, endpoint: EndpointId, waiting: int, age_s: float) -> tuple[int, float]: ...


def snapshot(
    record: EndpointRecord,
    routed: RoutedLoad,
    shared_queued: float,
    now_s: float,
    stale_after_s: float,
    calls_due_s: tuple[float, ...] = (),
    shared_busy_s: float = 0.0,
) -> LoadSnapshot:
    """The load the profile sees for ``record``'s endpoint at ``now_s``.

    Scraped numbers count only while fresh (``stale_after_s``); unknown load reads as zeros with ``known``
    False (the estimator adds its own penalty for it). The prefill queued ahead is the largest of three views
    of the same queue: our own virtual queue, every replica's shared one (``shared_queued``, 0 when unshared),
    and the scraped waiting requests, sized as the last ones we routed there and aged by the page's age
    (``RoutedLoad.waiting_left``), which also says how many of them still wait (``LoadSnapshot.waiting``).
    ``calls_due_s``: the chains' calls due there (``scheduling.due_calls``), passed through. The busy floor is
    the later of our own requests' predicted first tokens there and every replica's (``shared_busy_s``, 0 when
    unshared).
    """
    eid = record.endpoint.id
    known = record.load_known(now_s, stale_after_s)
    m = record.metrics if known else None
    waiting, waiting_tokens = routed.waiting_left(eid, m.waiting, now_s - record.scraped_at_s) if m else (0, 0.0)
    queued = max(routed.queued_tokens(eid), shared_queued, waiting_tokens)
    return LoadSnapshot(
        running=m.running if m else 0,
        waiting=waiting,
        kv_usage=m.kv_usage if m else 0.0,
        known=known,
        scraped_at_s=record.scraped_at_s,
        inflight_requests=routed.routed_since_scrape(eid),
        queued_requests=routed.queued_since_scrape(eid),
        prefill_busy_s=max(routed.busy_s(eid), shared_busy_s),
        queued_prefill_tokens=queued,
        calls_due_s=calls_due_s,
    )
