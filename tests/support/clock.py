"""A fake monotonic clock for code that takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that only moves when told to (``clock.now += s``); left alone, it stands still."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
