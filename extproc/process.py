"""What a picker process's main sets for the whole process: the GIL switch interval, the C heap's thresholds, and
a frozen start-up heap.

Called by the process mains only (``extproc serve``, a front worker's ``main``), never by ``App`` or the tests'
in-process pickers: both settings belong to the process, not to one object in it.

Why freeze: loading ``transformers``, the tokenizers and the chat templates leaves ~180K long-lived objects
that Python's cyclic collector walks on every full (generation-2) collection: ~70-80 ms here, during which the
picker answers nobody (one such stall in the first 20 requests after start, then now and again). They are never
garbage, so after the warm-up they are collected once and moved to the permanent generation (``gc.freeze``):
later full collections walk only what the process made since (none in 2,000 requests measured, 1K tokens each;
the largest request took 1.8 ms, against 83 ms without).

Why the heap thresholds: a request with a long body makes several buffers of its size (the socket reads, the gRPC
message, the body, the decoded JSON, the encoder's ids). glibc serves each from a fresh mapping once it passes the
mmap threshold, or returns the heap's top to the OS once more than the trim threshold is free; either way the
next request faults the same pages in again, at ~2.5 us a fault on this project's VMs. In a small process a 300 KB
body took ~200 faults and 0.8 ms to receive, parse and decode, against none and 0.31 ms with the memory kept; a
picker through an agent session to 100K tokens faulted 2,487 times while serving, against 22 with it
(``bench/results/hotpath-inline/malloc.md``). Memory then stays near its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import time

from extproc.config import RouterConfig

log = logging.getLogger(__name__)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses a larger one on 64-bit hosts


def configure(config: RouterConfig) -> None:
    """The process-wide settings ``config`` asks for: the GIL switch interval and the C heap's thresholds."""
    sys.setswitchinterval(config.limits.gil_switch_interval_s)
    keep_heap(config.limits.malloc_keep_mib << 20)


def keep_heap(keep_bytes: int) -> bool:
    """Keep up to ``keep_bytes`` of freed C heap for reuse, and serve allocations up to half of it (at most 32 MiB)
    from the heap (module docstring). 0 leaves glibc's defaults. Returns whether the C library took both
    settings (False where it is not glibc)."""
    if keep_bytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator, its defaults
        log.debug("no mallopt in this C library: heap thresholds left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    took = bool(mallopt(_M_MMAP_THRESHOLD, min(keep_bytes // 2, _MMAP_THRESHOLD_MAX)))
    return bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes)) and took


def freeze_startup_heap() -> None:
    """Collect what the start-up left behind, then exempt every object still alive from later collections.
    When: once, after the warm-up (tokenizers, templates), before the process serves its first request."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("start-up heap frozen: %d objects, %.0f ms", gc.get_freeze_count(), (time.perf_counter() - started) * 1e3)
