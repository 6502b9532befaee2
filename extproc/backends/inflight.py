"""Load we caused but no scrape shows yet: a per-endpoint virtual prefill queue.

Each routed request adds its uncached prompt tokens to the endpoint's queue, which drains at the endpoint's
prefill rate. A burst therefore raises the chosen endpoint's estimate immediately, between scrapes, so the next
request of the burst does not land on the same "idle" backend. Requests routed since the last scrape are also
counted, so the scraped waiting count can be corrected until the next scrape sees them. A scrape shows at most
the requests routed before its request went out, never those routed while its answer was on the way; a request
routed just before may still be on its way through Envoy and the engine's front end (counted as shown: the
virtual queue still holds its tokens).

Each routed request also keeps the endpoint busy until its predicted first token (the estimate it was routed
on): ``busy_s`` is how long that still is for the last one, whatever the scrapes show. The engine runs one step
at a time, so a request that arrives while one we routed is prefilling starts its own prefill after it; the
token queue above, drained at the configured rate from the moment of routing, misses that wait (the
estimate's busy floor, ``scheduling/estimate.py``; ``docs/scheduling.md``, "Chains that start beside a
prefill").
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, islice

from extproc.types import EndpointId

_RECENT = 64  # the uncached tokens of this many requests last routed per endpoint: what a scrape shows waiting


@dataclass(slots=True)
class _Queue:
    tokens: float = 0.0
    updated_s: float = 0.0
    routed: int = 0  # requests routed here, ever
    shown: int = 0  # of those, how many the last scrape shows
    sent_mark: int | None = None  # ``routed`` when the scrape now on its way was sent
    busy_until_s: float = 0.0  # the latest predicted first token of a request we routed here (our clock)
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=_RECENT))  # uncached tokens, oldest first
    # the same requests' predicted first tokens (our clock; inf: not estimated), oldest first
    recent_due_s: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))


class InflightLoad:
    """Per-endpoint virtual queue of uncached prefill tokens, draining at ``prefill_tokens_per_s``."""

    def __init__(self, prefill_tokens_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = prefill_tokens_per_s
        self._clock = clock
        self._queues: dict[EndpointId, _Queue] = {}
        self._mean_uncached = 0.0

    def _drained(self, endpoint: EndpointId) -> _Queue:
        now = self._clock()
        q = self._queues.get(endpoint)
        if q is None:  # (not setdefault: that would build a queue, two deques with it, on every call)
            q = self._queues[endpoint] = _Queue(updated_s=now)
        q.tokens = max(0.0, q.tokens - self._rate * (now - q.updated_s))
        q.updated_s = now
        return q

    def add(self, endpoint: EndpointId, uncached_tokens: int, first_token_in_s: float | None = None) -> None:
        """Called once per routed request, right after the decision; ``first_token_in_s``: the TTFT it was
        routed on (None: not estimated, it keeps nothing busy)."""
        q = self._drained(endpoint)
        q.tokens += uncached_tokens
        q.routed += 1
        q.recent.append(uncached_tokens)
        self._mean_uncached += 0.05 * (uncached_tokens - self._mean_uncached)
        due_s = math.inf if first_token_in_s is None else q.updated_s + first_token_in_s
        q.recent_due_s.append(due_s)
        if first_token_in_s is not None:
            q.busy_until_s = max(q.busy_until_s, due_s)

    def busy_s(self, endpoint: EndpointId) -> float:
        """Seconds until the predicted first token of the last request we routed to ``endpoint`` (0: none ahead)."""
        q = self._queues.get(endpoint)
        return max(q.busy_until_s - self._clock(), 0.0) if q is not None else 0.0

    def scrape_sent(self, endpoint: EndpointId) -> None:
        """Called as a metrics request to ``endpoint`` goes out: its answer will show what we routed before."""
        q = self._drained(endpoint)
        q.sent_mark = q.routed

    def scraped(self, endpoint: EndpointId) -> None:
        """Called when that scrape's answer arrived (without ``scrape_sent``: it shows all we routed)."""
        q = self._drained(endpoint)
        q.shown = max(q.shown, q.routed if q.sent_mark is None else q.sent_mark)
        q.sent_mark = None

    def queued_tokens(self, endpoint: EndpointId) -> float:
        """Uncached prompt tokens we routed to ``endpoint`` and its prefill has not drained yet, by our clock."""
        return self._drained(endpoint).tokens

    def routed_since_scrape(self, endpoint: EndpointId) -> int:
        """Requests we routed to ``endpoint`` that no scrape's answer can show yet (module docstring)."""
        q = self._queues.get(endpoint)
        return q.routed - q.shown if q else 0

    def queued_since_scrape(self, endpoint: EndpointId) -> int:
        """Of the requests routed to ``endpoint`` since what the last scrape can show, those still before their
        predicted first token by our clock (one routed without an estimate counts until a scrape shows it).

        Each counts one queued turn in the estimate (``LoadSnapshot.queued_requests``). Counted until a page
        showed them, requests long past their first token still each cost the next estimates a turn: traced at
        0.3 s rounds (tenants at 24 req/s), 1.9 routed since pages 200 ms+ old, a queue term of 0.081 s against
        0.030 s on pages under 100 ms old, and estimates 0.020 s high where the fresher ones ran 0.028 s low
        (``bench/results/aged-pages/notes.md``)."""
        q = self._queues.get(endpoint)
        if q is None:
            return 0
        now = self._clock()
        return sum(1 for due_s in islice(reversed(q.recent_due_s), q.routed - q.shown) if due_s > now)

    def waiting_left(self, endpoint: EndpointId, waiting: int, age_s: float) -> tuple[int, float]:
        """Of the ``waiting`` requests a page of ``endpoint`` taken ``age_s`` ago showed waiting: how many still
        wait, and the uncached prompt tokens still ahead of them and in them.

        Their sizes: the engine admits in arrival order, so the requests still waiting are the latest arrivals:
        the last ones we routed there before that scrape went out, each at its own size. Any beyond those (another
        router's) count at our running mean of uncached tokens per routed request. At the mean alone, warm
        requests waiting for the next step were priced like the cold ones that lift the mean: in mooncake at 16
        req/s this term set the picked endpoint's queue in 18 of the 23 picks it showed waiting, at 1,295 tokens
        on average where the requests waiting there held 626 (``bench/results/waiting-sizes/notes.md``).

        Their age: since the page was taken the engine has worked through ours in arrival order at the prefill
        rate, so up to ``rate * age_s`` of their tokens are done, and one whose tokens are all done no longer
        counts. Read as if taken now, a page of a busy engine showed work long done: traced at 24 req/s (tenants),
        estimates made on pages 0.1-0.3 s old ran 17-35% high where fresher ones ran 2-4% low
        (``bench/results/aged-pages/notes.md``). Another router's are not aged: we know neither their size nor
        their place, so they stay as the page showed them (and a page of an engine we routed nothing to keeps
        all its queue)."""
        if waiting <= 0:
            return 0, 0.0
        q = self._queues.get(endpoint)
        sizes = list(q.recent) if q is not None else []
        shown = len(sizes) - self.routed_since_scrape(endpoint)  # those routed before the scrape's mark
        ours = sizes[max(shown - waiting, 0) : max(shown, 0)]  # oldest first
        others = waiting - len(ours)
        done = self._rate * max(age_s, 0.0)
        ends = list(accumulate(ours))  # where each of ours ends, in tokens from the oldest's start
        finished = bisect_right(ends, done) if done > 0 else 0  # one counts until its own tokens are done
        return others + len(ours) - finished, others * self._mean_uncached + max(sum(ours) - done, 0.0)

    def forget(self, endpoint: EndpointId) -> None:
        """Drop ``endpoint``'s queue and counts (it left the fleet); a scrape of it then in flight shows all."""
        self._queues.pop(endpoint, None)
