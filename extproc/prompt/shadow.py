"""The sampled live check behind every fast path: a share of requests redone by the reference, off the hot path.

The fast encoder (``encoders.EncoderChoice``) and the fast chat-template renderer (``renderers.TemplateChoice``)
are both ``Verified``: each offers what it returned to one ``ShadowCheck``, which reruns the reference later
on its own thread, within a CPU budget, and on a difference makes that fast path fall back for good (counted
as ``router_tokenizer_checks{model,check,result}``, said in the log).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol, TypeVar

__all__ = ["ShadowCheck", "Verified"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Verified(Protocol):
    """A model's fast path as ``ShadowCheck`` sees it: whose it is, its kind, and how it gives up."""

    @property
    def model(self) -> str: ...

    @property
    def check(self) -> str: ...  # "encoder" | "template": the label of router_tokenizer_checks

    def fall_back(self, reason: str) -> None: ...


class ShadowCheck:
    """Redoes a sampled ``fraction`` of fast-path results with the reference on ``executor`` and compares.

    One instance serves every ``Verified`` fast path (encoders: ``EncoderChoice``; chat templates:
    ``templates.TemplateChoice``), so they share one thread, one queue bound and one CPU budget.
    ``offer`` is called on the hot path with what the fast path returned; it only samples and submits.
    ``on_result(model, check, matched)`` is called from the executor's thread (a metrics counter; ``check`` is
    the subject's kind, "encoder" or "template"). At most ``max_pending`` checks are queued: under load checks
    are skipped, never the requests.

    CPU budget: the checks together spend at most ``max_cpu_share`` of one core (a token bucket of CPU seconds,
    refilled at that rate, holding at most ``burst_s``; each check pays its own thread's CPU time after it ran).
    The reference costs ~1 µs per token here, so a 1% sample of 32K-token prompts would otherwise cost 1.2 ms
    per request; a sampled request that finds the bucket empty is skipped (``on_skip(model, check)``).
    """

    def __init__(
        self,
        fraction: float,
        executor: Executor,
        *,
        on_result: Callable[[str, str, bool], None] = lambda model, check, matched: None,
        on_skip: Callable[[str, str], None] = lambda model, check: None,
        rng: random.Random | None = None,
        max_pending: int = 4,
        max_cpu_share: float = 1.0,
        burst_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._fraction = fraction
        self._executor = executor
        self._on_result = on_result
        self._on_skip = on_skip
        self._rng = rng or random.Random()
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._share = max_cpu_share
        self._burst_s = burst_s
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._credit_s = burst_s
        self._refilled_at = clock()

    def offer(
        self, subject: Verified, what: str, got: T, reference: Callable[[], T], difference: Callable[[T, T], str | None]
    ) -> None:
        """Maybe (sampled, bounded, within the CPU budget) run ``reference()`` later and compare it with ``got``.

        ``what`` describes the input without quoting it ("1234 chars"); ``difference(got, ref)`` is None when
        they are equal, else a description (no text). Called on the hot path: it only samples and submits.
        """
        if self._fraction <= 0 or self._rng.random() >= self._fraction:
            return
        with self._lock:
            if self._pending >= self._max_pending:
                return
            if not self._has_credit():
                self._on_skip(subject.model, subject.check)
                return
            self._pending += 1
        try:
            self._executor.submit(self._check, subject, what, got, reference, difference)
        except RuntimeError:  # executor shut down
            self._release()

    def _has_credit(self) -> bool:
        """Refill the bucket for the time since the last look (under the lock); True if a check may run."""
        now = self._clock()
        self._credit_s = min(self._burst_s, self._credit_s + (now - self._refilled_at) * self._share)
        self._refilled_at = now
        return self._credit_s > 0

    def _check(
        self, subject: Verified, what: str, got: T, reference: Callable[[], T], difference: Callable[[T, T], str | None]
    ) -> None:
        started = self._cpu_clock()
        try:
            found = difference(got, reference())
            if found is not None:
                subject.fall_back(f"live request ({what}): {found}")
            self._on_result(subject.model, subject.check, found is None)
        except Exception as exc:  # the reference failing is not a verdict on the fast path
            log.debug("shadow %s check failed: %s", subject.check, exc)
        finally:
            self._release(spent_s=self._cpu_clock() - started)

    def _release(self, spent_s: float = 0.0) -> None:
        with self._lock:
            self._pending -= 1
            self._credit_s -= spent_s
