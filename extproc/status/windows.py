"""``Windows``: deltas of cumulative counters over a trailing window, for rates and ratios between views.

Every scrape and every status page view samples the counters it shows; a rate is the change between the
oldest sample still inside the window and now. A counter that went down (an engine restarted) starts over.
The first view after start has no delta yet (shown as "—", and the ratio gauges are absent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

WINDOW_S = 60.0
_MAX_SAMPLES = 256  # per key, so a page reloaded in a tight loop cannot grow a deque without bound


class Windows:
    """``{key: recent (time, value) samples}``; owned by the fleet view's sources, one per app."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: dict[Hashable, deque[tuple[float, float]]] = {}

    def delta(self, key: Hashable, value: float, now_s: float) -> tuple[float, float] | None:
        """Record ``value`` for ``key`` at ``now_s``; return ``(change, seconds)`` since the oldest sample in
        the window, or None when there is no earlier sample (or no time passed)."""
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=_MAX_SAMPLES)
        if samples and value < samples[-1][1]:
            samples.clear()  # the counter restarted
        while len(samples) > 1 and samples[1][0] <= now_s - self._window_s:
            samples.popleft()  # keep one sample at or before the window's start
        if not samples or samples[-1][0] < now_s:
            samples.append((now_s, value))
        first_s, first = samples[0]
        return None if now_s <= first_s else (value - first, now_s - first_s)

    def rate(self, key: Hashable, value: float, now_s: float) -> float | None:
        """Per second over the window (see ``delta``)."""
        d = self.delta(key, value, now_s)
        return None if d is None else d[0] / d[1]

    def keep(self, wanted: Callable[[Hashable], bool]) -> None:
        """Forget the keys ``wanted`` rejects (endpoints that left the pool)."""
        for key in [k for k in self._samples if not wanted(k)]:
            del self._samples[key]


def ratio(num: tuple[float, float] | None, den: tuple[float, float] | None) -> float | None:
    """Δnum / Δden over the same window, or None when either is unknown or Δden is 0."""
    if num is None or den is None or den[0] <= 0:
        return None
    return num[0] / den[0]
