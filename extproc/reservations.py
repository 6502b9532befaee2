"""The decider's reservation step when replicas share the load: pick locally, reserve atomically, so N pickers
decide as one would (``docs/scheduling.md``, "Replicas as one").

The decision stays the profile's, pure and local. What the replicas share is the reservation: the decider read
every candidate's shared queue with its version (``SharedQueues``, in the lookups' round trip), decided, and now
asks Redis to reserve the pick's uncached prefill *if the pick's version is unchanged*. One round trip when no
other replica reserved there meanwhile; otherwise the script answers with every candidate's fresh queue and
the decision runs again on it (pure, no I/O), at most ``redecisions`` times, the last reservation taken
whatever the version. The whole step has one deadline; past it the route goes out with the decision in hand
and the call is left to land (an unconditional reservation if it comes back stale), never a stall.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extproc.redis.shared_load import ANY_VERSION, Reservation, SharedLoadUnavailable, SharedQueue, SharedQueues
from extproc.scheduling.pd import PdChoice
from extproc.tasks import within_or_orphan
from extproc.types import Decision, EndpointId

_log = logging.getLogger(__name__)

Decided = tuple[Decision, PdChoice | None]
Redecide = Callable[[SharedQueues], Decided]  # the profile's pure decision on a fresh shared view
Uncached = Callable[[Decided], int]  # the prefill a decision reserves on its pick (0: nothing to reserve)
FirstToken = Callable[[Decided], float]  # seconds to the decision's predicted first token on its pick (0: none)


@dataclass(frozen=True, slots=True)
class Settled:
    """The decision that holds and how its reservation went (``router_shared_reservations_total{outcome}``):
    ``reserved`` (first try), ``redecided`` (after another replica's reservation, on a fresh view), ``forced``
    (the last re-decision's, whatever the version), ``late`` (past the deadline: left to land), ``unavailable``
    (Redis failed), ``none`` (nothing to reserve); the decider adds ``busy`` (its step was held up past the
    deadline: no reservation)."""

    decided: Decided
    outcome: str
    queues: SharedQueues | None = None  # the candidates' queues right after the reservation, when it answered


class Reserver:
    """Implements the reservation step on a ``SharedQueue``. ``orphans`` holds calls left past the deadline
    (the decider's background set, drained at shutdown)."""

    def __init__(
        self, load: SharedQueue, *, deadline_s: float, redecisions: int, orphans: set[asyncio.Task[Any]]
    ) -> None:
        self._load = load
        self._deadline_s = deadline_s
        self._redecisions = redecisions
        self._orphans = orphans

    async def settle(
        self,
        view: SharedQueues,
        decided: Decided,
        redecide: Redecide,
        uncached: Uncached,
        endpoints: list[EndpointId],
        first_token: FirstToken | None = None,
    ) -> Settled:
        """Reserve ``decided``'s pick, deciding again while another replica got there first (see the module).
        ``first_token``: when the reserved request's first token is predicted, reserved with it (the pick then
        reads busy until then to every replica)."""
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + self._deadline_s
        for attempt in range(self._redecisions + 1):
            tokens = uncached(decided)
            if tokens <= 0:
                return Settled(decided, "none")
            pick = decided[0].endpoints[0]
            last = attempt == self._redecisions
            version = ANY_VERSION if last else view.versions.get(pick, 0)
            late = [False]  # set when the decider stops waiting: a stale answer then reserves anyway
            busy_s = first_token(decided) if first_token is not None else 0.0
            call = self._attempt(pick, tokens, version, endpoints, late, busy_s)
            try:
                done = await within_or_orphan(call, max(ends_at - loop.time(), 0.0), self._orphans)
            except TimeoutError:
                late[0] = True
                return Settled(decided, "late")
            except SharedLoadUnavailable as exc:
                _log.debug("shared load unavailable for a reservation: %s", exc)
                return Settled(decided, "unavailable")
            if done.reserved:
                outcome = "forced" if last and attempt else "redecided" if attempt else "reserved"
                return Settled(decided, outcome, done.queues)
            view = done.queues
            decided = redecide(view)
        raise AssertionError("the last attempt reserves whatever the version")  # pragma: no cover

    async def _attempt(
        self, pick: EndpointId, tokens: int, version: int, endpoints: list[EndpointId], late: list[bool], busy_s: float
    ) -> Reservation:
        """One reservation; if the decider stopped waiting (``late[0]``) and it came back stale, the route went
        out with this pick anyway, so its prefill is reserved whatever the version."""
        done = await self._load.reserve(pick, tokens, version, endpoints, busy_s)
        if late[0] and not done.reserved:
            await self._load.add(pick, tokens, busy_s)
        return done


def fresher(read: SharedQueues, known: SharedQueues) -> SharedQueues:
    """Per endpoint, the view with the higher version (``known``: what this replica's last reservation answered;
    on a tie the read, taken later, has drained more), so that this replica's own reservations made after its
    read are no conflict."""
    tokens, versions = dict(read.tokens), dict(read.versions)
    for e, v in known.versions.items():
        if e in versions and v > versions[e]:
            tokens[e], versions[e] = known.tokens[e], v
    # how long each endpoint is busy stays the read's: it is the later view, and what this replica reserved
    # after it is in its own InflightLoad's busy time
    return SharedQueues(tokens, versions, read.busy_s)
