"""The reservation step with replicas (``extproc.reservations``, ``docs/scheduling.md`` "Replicas as one"), on the
in-memory shared load: reserve when nobody got there first, decide again when someone did, never stall."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from extproc.decider import Ask, DeciderSettings, LocalDecider, _first_token_in_s, _uncached
from extproc.redis.shared_load import SharedQueues
from extproc.reservations import Decided, Reserver
from extproc.router import RouterSettings
from extproc.scheduling.pd import PdChoice, PdReason
from extproc.tasks import within_or_orphan
from extproc.types import BlockHash, Decision, EndpointId, HashScheme, Reason, Route, Tenant
from tests.support.clock import FakeClock
from tests.support.router_fakes import A, B, make_router
from tests.support.shared_load import MemorySharedLoad

IDS = [A, B]
TOKENS = 1000


def least_loaded(view: SharedQueues) -> Decided:
    """A stand-in for the profile: the endpoint with the least shared queue (A on a tie)."""
    pick = min(IDS, key=lambda e: (view.tokens.get(e, 0.0), e))
    return Decision((pick,), Reason.LOAD, cached_tokens=0), None


def uncached(decided: Decided) -> int:
    return TOKENS


def reserver(load: MemorySharedLoad, orphans: set[asyncio.Task[Any]], **kw: Any) -> Reserver:
    return Reserver(load, **{"deadline_s": 1.0, "redecisions": 3, "orphans": orphans, **kw})


class Beaten(MemorySharedLoad):
    """Another replica reserves on the pick just before each of ours arrives."""

    async def reserve(self, pick: EndpointId, tokens: int, version: int, endpoints: Any, busy_s: float = 0.0) -> Any:
        await MemorySharedLoad.add(self, pick, 1)
        return await super().reserve(pick, tokens, version, endpoints, busy_s)


@pytest.mark.parametrize(
    ("before", "redecisions", "outcome", "pick", "calls"),
    [
        (None, 3, "reserved", A, ["read", "reserve"]),
        (A, 3, "redecided", B, ["read", "add", "reserve", "reserve"]),  # A taken meanwhile: fresh view, B
        (A, 0, "reserved", A, ["read", "add", "reserve"]),  # no re-decision: the pick is reserved as decided
    ],
    ids=["nobody-first", "another-replica-first", "no-redecision"],
)
async def test_a_reservation_holds_only_on_the_view_it_was_decided_on(
    before: EndpointId | None, redecisions: int, outcome: str, pick: EndpointId, calls: list[str]
) -> None:
    load, orphans = MemorySharedLoad(1.0, FakeClock()), set[asyncio.Task[Any]]()
    view = await load.read(IDS)
    if before is not None:
        await load.add(before, 500)  # another replica, between our read and our reservation
    settled = await reserver(load, orphans, redecisions=redecisions).settle(
        view, least_loaded(view), least_loaded, uncached, IDS
    )
    assert (settled.outcome, settled.decided[0].endpoints[0], load.calls) == (outcome, pick, calls)
    assert (await load.read(IDS)).tokens[pick] >= TOKENS


async def test_always_beaten_the_last_reservation_is_taken_anyway() -> None:
    load, orphans = Beaten(1.0, FakeClock()), set[asyncio.Task[Any]]()
    view = await load.read(IDS)
    settled = await reserver(load, orphans, redecisions=2).settle(view, least_loaded(view), least_loaded, uncached, IDS)
    assert settled.outcome == "forced" and load.calls.count("reserve") == 3


async def test_nothing_to_reserve_costs_no_round_trip() -> None:
    load, orphans = MemorySharedLoad(1.0, FakeClock()), set[asyncio.Task[Any]]()
    view = await load.read(IDS)
    settled = await reserver(load, orphans).settle(view, least_loaded(view), least_loaded, lambda d: 0, IDS)
    assert settled.outcome == "none" and load.calls == ["read"]


async def test_a_slow_reservation_is_left_to_land_never_a_stall() -> None:
    load, orphans = MemorySharedLoad(1.0, FakeClock()), set[asyncio.Task[Any]]()
    view = await load.read(IDS)
    await load.add(A, 500)  # so our late reservation comes back stale: it must still count
    load.delay_s = 0.2
    settled = await reserver(load, orphans, deadline_s=0.01).settle(
        view, least_loaded(view), least_loaded, uncached, IDS
    )
    assert settled.outcome == "late" and settled.decided[0].endpoints[0] == A and orphans
    await asyncio.wait(set(orphans))
    assert (await load.read(IDS)).tokens[A] == 500 + TOKENS  # the route went to A: so did its prefill


async def test_redis_down_keeps_the_decision() -> None:
    load, orphans = MemorySharedLoad(1.0, FakeClock()), set[asyncio.Task[Any]]()
    view = await load.read(IDS)
    load.down = True
    settled = await reserver(load, orphans).settle(view, least_loaded(view), least_loaded, uncached, IDS)
    assert settled.outcome == "unavailable" and settled.decided[0].endpoints[0] == A


async def test_a_call_past_its_deadline_is_not_cancelled() -> None:
    orphans: set[asyncio.Task[Any]] = set()
    finished = asyncio.Event()

    async def slow() -> int:
        await asyncio.sleep(0.05)
        finished.set()
        return 1

    with pytest.raises(TimeoutError):
        await within_or_orphan(slow(), 0.001, orphans)
    assert len(orphans) == 1
    await asyncio.wait_for(finished.wait(), 1.0)
    await asyncio.sleep(0)
    assert not orphans  # forgotten once done
    assert await within_or_orphan(slow(), 1.0, orphans) == 1


def ask(i: int) -> Ask:
    """A 1,000-token prompt of its own (nothing shared with the others)."""
    hashes = [BlockHash(i * 100_000 + k) for k in range(62)]
    return Ask(f"r{i}", "m", "m", None, 1000, HashScheme(), hashes)


def replicas(load: MemorySharedLoad, redecisions: int = 3, n: int = 2, share_busy: bool = False) -> list[LocalDecider]:
    """``n`` pickers sharing ``load``, each with its own approximate index and in-flight view, and the same
    random tie-breaks (so, without the reservation step, simultaneous decisions would agree and pile up)."""
    out = []
    for _ in range(n):
        settings = RouterSettings(decider=DeciderSettings(reserve_redecisions=redecisions, share_busy=share_busy))
        router, _, _ = make_router(shared_load=load, settings=settings)
        decider = router.decider
        assert isinstance(decider, LocalDecider)
        decider._rng = random.Random(0)
        out.append(decider)
    return out


@pytest.mark.parametrize(
    ("burst", "redecisions", "spread"),
    [(2, 3, [1, 1]), (4, 3, [2, 2]), (8, 7, [4, 4]), (2, 0, [0, 2])],
    ids=["pair", "four", "eight-with-seven-redecisions", "pair-never-redeciding-piles-up"],
)
async def test_replicas_deciding_at_once_spread_a_burst_like_one(
    burst: int, redecisions: int, spread: list[int]
) -> None:
    """Every ask reads the shared load before any reserves (one turn of the loop per call): the version check
    makes the later ones decide again, so the burst spreads as one picker, deciding in turn, spreads it. The
    worst case, k asks that all read before any reserves, needs k-1 re-decisions (each round settles one);
    with none, each replica keeps its stale decision, as before the reservation step: they pile up. (Within
    one replica the decide-reserve-record step is serial, so its own asks never need a re-decision.)"""
    load = MemorySharedLoad(1.0, FakeClock())
    deciders = replicas(load, redecisions)
    routes = await asyncio.gather(*(deciders[i % 2].decide(ask(i)) for i in range(burst)))
    picks = [r.endpoints[0] for r in routes if isinstance(r, Route)]
    assert sorted(picks.count(e) for e in IDS) == spread, picks
    queued = (await load.read(IDS)).tokens
    assert queued[A] + queued[B] == pytest.approx(burst * 1000, abs=1)  # each reserved once, none lost


async def test_replicas_with_the_shared_load_down_still_decide_at_once() -> None:
    load = MemorySharedLoad(1.0, FakeClock())
    load.down = True
    deciders = replicas(load)
    routes = await asyncio.wait_for(asyncio.gather(*(d.decide(ask(i)) for i, d in enumerate(deciders))), 1.0)
    assert all(isinstance(r, Route) for r in routes)


def test_a_disaggregated_pick_reserves_nothing() -> None:
    routing = ask(0).routing(Tenant())
    decision = Decision((A,), Reason.LOAD, cached_tokens=320, estimates_s={A: 0.25, B: 0.3})
    assert _uncached(routing)((decision, None)) == 680 and _first_token_in_s((decision, None)) == 0.25
    split = PdChoice(prefill=B, reason=PdReason.DISAGG, uncached_tokens=680, local_s=1.0)
    assert _uncached(routing)((decision, split)) == 0 and _first_token_in_s((decision, split)) == 0.0


async def test_without_share_busy_a_reservation_keeps_nothing_busy() -> None:
    load = MemorySharedLoad(1.0, FakeClock())
    first, _ = replicas(load)
    route = await first.decide(ask(0))
    assert isinstance(route, Route) and set((await load.read(IDS)).busy_s.values()) == {0.0}


async def test_a_reservation_keeps_the_pick_busy_for_the_other_replica() -> None:
    """With ``share_busy`` the reservation carries the pick's predicted first token: the other replica's next
    decision sees the endpoint busy until then, as the replica that routed there does (its own ``InflightLoad``)."""
    load = MemorySharedLoad(1.0, FakeClock())
    first, second = replicas(load, share_busy=True)
    route = await first.decide(ask(0))
    assert isinstance(route, Route)
    pick = route.endpoints[0]
    ours_s = first._deps.inflight.busy_s(pick)
    assert ours_s > 0 and (await load.read(IDS)).busy_s == {
        pick: pytest.approx(ours_s, abs=0.01),  # the decider runs on the real clock, the fake load on its own
        **{e: 0.0 for e in IDS if e != pick},
    }
    theirs = second._candidate(second._deps.registry.snapshot()[pick], [], 0, shared_busy_s=ours_s)
    assert second._deps.inflight.busy_s(pick) == 0.0 and theirs.load.prefill_busy_s == ours_s


async def test_a_replicas_own_burst_is_decided_in_turn_with_its_record() -> None:
    """One replica, four asks at once: each decision sees the last one's record (load, hot blocks) before the
    next is made, so none needs a re-decision, as with one picker in memory."""
    load = MemorySharedLoad(1.0, FakeClock())
    (decider,) = replicas(load, redecisions=3, n=1)
    routes = await asyncio.gather(*(decider.decide(ask(i)) for i in range(4)))
    picks = [r.endpoints[0] for r in routes if isinstance(r, Route)]
    assert sorted(picks.count(e) for e in IDS) == [2, 2] and load.calls.count("reserve") == 4
    counted = decider._deps.metrics.reservations.labels("reserved")._value.get()
    assert counted == 4


async def test_a_step_held_up_past_the_deadline_decides_without_reserving() -> None:
    load = MemorySharedLoad(1.0, FakeClock())
    (decider,) = replicas(load, n=1)
    await decider._serial.acquire()  # another decision stuck on a slow Redis
    try:
        route = await asyncio.wait_for(decider.decide(ask(0)), 1.0)
    finally:
        decider._serial.release()
    assert isinstance(route, Route) and "reserve" not in load.calls
    assert decider._deps.metrics.reservations.labels("busy")._value.get() == 1
