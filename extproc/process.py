"""What a picker process's main sets for the whole process: the GIL switch interval, and a frozen start-up heap.

Called by the process mains only (``extproc serve``, a front worker's ``main``), never by ``App`` or the tests'
in-process pickers: both settings belong to the process, not to one object in it.

Why freeze: loading ``transformers``, the tokenizers and the chat templates leaves ~180K long-lived objects
that Python's cyclic collector walks on every full (generation-2) collection: ~70-80 ms here, during which the
picker answers nobody (one such stall in the first 20 requests after start, then now and again). They are never
garbage, so after the warm-up they are collected once and moved to the permanent generation (``gc.freeze``):
later full collections walk only what the process made since (none in 2,000 requests measured, 1K tokens each;
the largest request took 1.8 ms, against 83 ms without).
"""

from __future__ import annotations

import gc
import logging
import sys
import time

from extproc.config import RouterConfig

log = logging.getLogger(__name__)


def configure(config: RouterConfig) -> None:
    """The process-wide interpreter settings ``config`` asks for (the GIL switch interval)."""
    sys.setswitchinterval(config.limits.gil_switch_interval_s)


def freeze_startup_heap() -> None:
    """Collect what the start-up left behind, then exempt every object still alive from later collections.
    When: once, after the warm-up (tokenizers, templates), before the process serves its first request."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("start-up heap frozen: %d objects, %.0f ms", gc.get_freeze_count(), (time.perf_counter() - started) * 1e3)
