"""``FleetStatus``: the status page, the fleet metrics and the ceiling's feed, as the composition root holds them.

The composition root builds one (``App``), registers ``collector()`` on its Prometheus registry, serves
``page()`` at ``/status`` on the metrics port, and calls ``tick`` in each scrape round's wake-up: the queued
decisions reach the ceiling estimate there, at most every ``CEILING_EVERY_S``. (A timer of its own woke an idle
picker 4 times a second for it; on this kind of VM a wake-up after a sleep costs ~0.2 ms of CPU.) ``sections`` is
the page's list of section renderers: append one to add a report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from extproc.status.collector import FleetCollector
from extproc.status.page import DEFAULT_SECTIONS, Section, render
from extproc.status.view import FleetView, Sources, gather

log = logging.getLogger(__name__)

CEILING_EVERY_S = 0.25  # how often queued decisions reach the ceiling estimate
CEILING_BLOCKS_PER_TICK = 10_000  # block look-ups per CEILING_EVERY_S (~1.5 ms on the event loop); the rest wait


class FleetStatus:
    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = sources
        self.sections: list[Section] = list(DEFAULT_SECTIONS)
        self._clock = clock
        self._fed_s: float | None = None  # when the ceiling was last fed

    def view(self) -> FleetView:
        return gather(self.sources)

    def page(self) -> str:
        """The ``/status`` HTML, now."""
        return render(self.view(), self.sections)

    def collector(self) -> FleetCollector:
        return FleetCollector(self.view)

    def tick(self) -> None:
        """Feed the decisions queued since the last feed to the ceiling estimate, once ``CEILING_EVERY_S`` has
        passed since then: ``CEILING_BLOCKS_PER_TICK`` block look-ups for each such period (scrape rounds further
        apart than it feed more at once). Never raises: a bad entry must not stop the estimate for good."""
        now = self._clock()
        if self._fed_s is None:
            self._fed_s = now
            return
        periods = (now - self._fed_s) / CEILING_EVERY_S
        if periods < 1.0:
            return
        self._fed_s = now
        try:
            self.sources.tap.drain_ceiling(int(CEILING_BLOCKS_PER_TICK * periods))
        except Exception:
            log.exception("ceiling estimate: feeding it failed")
