"""``FleetStatus``: the status page, the fleet metrics and the ceiling loop, as the composition root holds them.

The composition root builds one (``App``), registers ``collector()`` on its Prometheus registry, serves
``page()`` at ``/status`` on the metrics port, and owns the ceiling loop through ``start`` / ``stop``.
``sections`` is the page's list of section renderers: append one to add a report.
"""

from __future__ import annotations

import asyncio
import logging

from extproc.status.collector import FleetCollector
from extproc.status.page import DEFAULT_SECTIONS, Section, render
from extproc.status.view import FleetView, Sources, gather
from extproc.tasks import stop_task

log = logging.getLogger(__name__)

CEILING_EVERY_S = 0.25  # how often queued decisions reach the ceiling estimate
CEILING_BLOCKS_PER_TICK = 10_000  # block look-ups per tick (~1.5 ms on the event loop); the rest wait a tick


class FleetStatus:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.sections: list[Section] = list(DEFAULT_SECTIONS)
        self._task: asyncio.Task[None] | None = None

    def view(self) -> FleetView:
        return gather(self.sources)

    def page(self) -> str:
        """The ``/status`` HTML, now."""
        return render(self.view(), self.sections)

    def collector(self) -> FleetCollector:
        return FleetCollector(self.view)

    def start(self) -> None:
        """Start the ceiling loop (one task, this object's)."""
        self._task = asyncio.create_task(self._ceiling_loop(), name="ceiling-estimate")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def _ceiling_loop(self) -> None:
        while True:
            await asyncio.sleep(CEILING_EVERY_S)
            try:
                self.sources.tap.drain_ceiling(CEILING_BLOCKS_PER_TICK)
            except Exception:  # a bad entry must not stop the estimate for good
                log.exception("ceiling estimate: tick failed")
